package msg

import (
	"testing"
	"time"
)

// TestReserve checks the rank's reserve: a buffer taken from it is replaced only after
// the round (settle), never in the middle of the enlargement that took it; a buffer given
// back is cleared and kept if the reserve lacks one of its length, left to the garbage
// collector otherwise; and a refill, once started, fills the reserve up again.
func TestReserve(t *testing.T) {
	c := &Comm{cfg: Config{Phases: []int{1 << 10, 16 << 10}, Slots: 8, SendSlots: 4, Reserve: 1}, wake: make(chan struct{}, 1)}
	bp := &c.pool
	bp.init(c)
	ring := 8 * 16 << 10
	if len(bp.free[ring]) != 1 || len(bp.free[4*16<<10]) != 1 {
		t.Fatalf("reserve after init: %d rings, %d staging buffers; want 1 and 1", len(bp.free[ring]), len(bp.free[4*16<<10]))
	}

	// Taken and given back in one round: the buffer given back takes the place of the
	// one taken, cleared, and no refill starts.
	b := bp.get(ring)
	if len(b) != ring || bp.filling[ring] {
		t.Fatalf("get: %d bytes, refill started %v; want %d bytes and no refill before settle", len(b), bp.filling[ring], ring)
	}
	old := make([]byte, ring)
	old[0], old[ring-1] = 1, 2
	bp.put(old)
	bp.put(make([]byte, 100)) // a length the reserve does not keep
	if len(bp.free[ring]) != 0 {
		t.Fatal("put filed a buffer before settle")
	}
	bp.settle()
	if len(bp.free[ring]) != 1 || &bp.free[ring][0][0] != &old[0] {
		t.Fatal("settle did not keep the buffer given back")
	}
	if old[0] != 0 || old[ring-1] != 0 {
		t.Fatal("a buffer given back was kept without being cleared")
	}
	if len(bp.free[100]) != 0 || bp.filling[ring] || len(bp.back) != 0 || len(bp.due) != 0 {
		t.Fatalf("after settle: kept %d unwanted buffers, refill started %v, %d back and %d due left",
			len(bp.free[100]), bp.filling[ring], len(bp.back), len(bp.due))
	}

	// Taken and not given back: settle starts a refill, which hands its buffers to the
	// progress engine (submit) after refillDelay.
	bp.get(ring)
	bp.settle()
	if !bp.filling[ring] {
		t.Fatal("settle did not start a refill for a buffer taken")
	}
	select {
	case <-c.wake:
	case <-time.After(time.Minute):
		t.Fatal("the refill did not hand its buffers over")
	}
	c.runOps()
	if len(bp.free[ring]) != 1 || bp.filling[ring] {
		t.Fatalf("after the refill: %d rings in the reserve, refill still marked %v; want 1 and false", len(bp.free[ring]), bp.filling[ring])
	}
}
