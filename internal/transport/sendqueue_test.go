package transport

import (
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
)

// checkCursors fails the test unless the send queue's cursors are in ring order
// (tail <= cur <= started <= head) and hold at most a ring of WQEs.
func checkCursors(t *testing.T, s *sendQueue) {
	t.Helper()
	if !(s.tail <= s.cur && s.cur <= s.started && s.started <= s.head) || s.head-s.tail > uint64(len(s.ring)) {
		t.Fatalf("cursors tail %d cur %d started %d head %d (ring of %d)", s.tail, s.cur, s.started, s.head, len(s.ring))
	}
}

// postN posts n WQEs whose WRIDs count on from the head's index.
func postN(t *testing.T, s *sendQueue, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if s.full() {
			t.Fatalf("full after %d of %d posts", i, n)
		}
		w := s.slot()
		w.wrID = s.head
		s.post()
	}
	checkCursors(t, s)
}

// startAt gives the current WQE its PSNs (npkts from psn), as the requester does, and
// moves past it.
func startAt(s *sendQueue, psn wire.PSN, npkts uint32) *sendWQE {
	w := s.current()
	w.firstPSN, w.npkts = psn, npkts
	s.start()
	s.next()
	return w
}

// The cursors as posting, the requester and the completer move them: posted WQEs are
// unsent and fresh; started ones have PSNs and are in flight; the requester goes back to
// the first WQE whose PSNs reach a PSN (rewind), and forward again over WQEs that already
// have PSNs (next); the completer retires at the tail, carrying the other cursors along.
func TestSendQueueCursors(t *testing.T) {
	var s sendQueue
	s.init(4, 2, 16)
	if len(s.ring) != 4 || cap(s.ring[0].segs) != 2 || cap(s.ring[3].inline) != 16 {
		t.Fatalf("ring of %d, segs room %d, inline room %d", len(s.ring), cap(s.ring[0].segs), cap(s.ring[3].inline))
	}
	if !s.empty() || s.unsent() || s.inFlight() || s.full() {
		t.Fatal("a new send queue is not empty")
	}
	postN(t, &s, 3)
	if !s.unsent() || !s.fresh() || !s.atOldest() || s.inFlight() || s.current().wrID != 0 {
		t.Fatal("three posted WQEs: not unsent and fresh at the tail")
	}
	// The requester starts WQE 0 (PSNs 10, 11) and WQE 1 (PSN 12).
	w0 := startAt(&s, 10, 2)
	if !s.fresh() || s.atOldest() || !s.inFlight() || s.oldest() != w0 || !s.isOldest(0) || s.isOldest(1) {
		t.Fatal("after starting WQE 0")
	}
	w1 := startAt(&s, 12, 1)
	checkCursors(t, &s)
	if s.cur != 2 || s.started != 2 || !s.sentUncompleted() {
		t.Fatalf("cur %d started %d", s.cur, s.started)
	}
	// A loss at PSN 11 sends the requester back to WQE 0, which reaches it; forward again,
	// WQE 1 already has its PSNs, WQE 2 has none.
	if w := s.rewind(11); w != w0 || s.cur != 0 || s.fresh() {
		t.Fatalf("rewind(11) = WQE %v, cur %d", w, s.cur)
	}
	if w := s.next(); w != w1 {
		t.Fatal("next after WQE 0 is not the started WQE 1")
	}
	if w := s.next(); w != nil || !s.fresh() || s.current().wrID != 2 {
		t.Fatal("next after WQE 1 is not the fresh WQE 2")
	}
	// A PSN no started WQE reaches: the requester goes on with new WQEs.
	if w := s.rewind(13); w != nil || s.cur != s.started {
		t.Fatalf("rewind(13) = %v, cur %d", w, s.cur)
	}
	// A PSN before every WQE: the oldest.
	if w := s.rewind(5); w != w0 {
		t.Fatal("rewind(5) is not WQE 0")
	}
	// The completer retires WQE 0 while the requester is on it: the requester's cursor moves
	// along to WQE 1.
	s.retire()
	checkCursors(t, &s)
	if s.cur != 1 || s.oldest() != w1 || !s.atOldest() {
		t.Fatalf("after retiring WQE 0: cur %d", s.cur)
	}
	// Fill the ring: one slot was freed.
	postN(t, &s, 2)
	if !s.full() {
		t.Fatal("4 WQEs in a ring of 4 and not full")
	}
	// Retiring past started (a flush retires WQEs that never got PSNs) carries started
	// along too.
	s.retire()
	s.retire()
	checkCursors(t, &s)
	if s.tail != 3 || s.cur != 3 || s.started != 3 || s.inFlight() || s.sentUncompleted() || s.empty() {
		t.Fatalf("after retiring past started: tail %d cur %d started %d", s.tail, s.cur, s.started)
	}
	// Reset drops everything without completions, and the references to memory.
	s.current().segs = append(s.current().segs, []byte("x"))
	s.reset()
	if !s.empty() || s.head != 0 || s.ring[3].segs[:1][0] != nil {
		t.Fatal("reset left WQEs or their memory")
	}
}

// byIndex finds a WQE by the low 32 bits of its index, which weak mode records for each
// PSN in flight, also when the cursors cross a multiple of 2^32.
func TestSendQueueByIndexWraps(t *testing.T) {
	var s sendQueue
	s.init(8, 1, 0)
	base := uint64(1)<<32 - 2
	s.head, s.cur, s.started, s.tail = base, base, base, base
	postN(t, &s, 5)
	for i := 0; i < 4; i++ {
		startAt(&s, wire.PSN(i), 1)
	}
	for i := uint64(0); i < 5; i++ {
		if w := s.byIndex(uint32(base + i)); w != s.at(base+i) || w.wrID != base+i {
			t.Fatalf("byIndex(%#x) is WQE %#x, want %#x", uint32(base+i), w.wrID, base+i)
		}
	}
	s.retire()
	s.retire()
	if w := s.byIndex(0); w.wrID != 1<<32 {
		t.Fatalf("byIndex(0) after the tail crossed 2^32: WQE %#x", w.wrID)
	}
	if !s.isOldest(0) || s.isOldest(uint32(base)) {
		t.Fatal("isOldest by low bits")
	}
}
