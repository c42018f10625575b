package transport

import "testing"

// A closed device leaves its ACK group: no member left, and none counted as holding ACKs
// back even if its queues held some when it closed.
func TestCloseLeavesAckGroup(t *testing.T) {
	g := NewAckGroup()
	a := openSide(t, "127.0.0.1", Config{Queues: 2, AckGroup: g})
	b := openSide(t, "127.0.0.2", Config{AckGroup: g})
	if m := g.members.Load(); m == nil || len(*m) != 3 {
		t.Fatalf("members %v, want the 3 queues", m)
	}
	for _, u := range a.d.queues {
		g.hold(u, true)
	}
	a.d.Close()
	if m := *g.members.Load(); len(m) != 1 || m[0] != b.d.queues[0] {
		t.Errorf("members after a closed: %v, want b's queue", m)
	}
	for _, u := range a.d.queues {
		if u.holdingAcks.Load() {
			t.Errorf("queue %d of the closed device still counted as holding ACKs back", u.idx)
		}
	}
}
