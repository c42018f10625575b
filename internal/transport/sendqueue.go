package transport

import "github.com/softrnic/softrnic/internal/wire"

// sendWQE is a posted send work request plus the transport's bookkeeping for it.
type sendWQE struct {
	wrID       uint64
	raddr      uint64
	compareAdd uint64
	swap       uint64
	segs       [][]byte // resolved local memory (or the inline copy)
	inline     []byte
	length     uint32
	rkey       uint32
	imm        uint32
	verr       uint32 // local error found at post time, reported when the WQE is reached
	firstPSN   wire.PSN
	ah         *AH    // UD: destination
	remoteQPN  uint32 // UD
	qkey       uint32 // UD: the Q_Key the datagram carries
	npkts      uint32
	doneCnt    uint32   // weak mode: PSNs acknowledged or answered
	rsn        wire.PSN // weak mode: receive sequence number (SEND, WRITE with immediate)
	readSN     wire.PSN // weak mode: read sequence number of the first READ request or the atomic
	op         uint8
	flags      uint8
	signaled   bool
}

func (w *sendWQE) isReadOrAtomic() bool {
	return w.op == WRRead || w.op == WRAtomicCmpSwap || w.op == WRAtomicFetch
}

func (w *sendWQE) lastPSN() wire.PSN { return w.firstPSN.Add(w.npkts - 1) }

// sendQueue is a QP's send queue: a ring of WQEs and four cursors into it, each moved by
// one party (as Linux rxe's send queue with its producer and consumer indices). Posting
// adds at head; the requester gives WQEs their PSNs (started) and sends them (cur), going
// back when it must send again; the completer retires them at tail. In ring order:
//
//	tail <= cur <= started <= head
//
// WQEs in [tail, started) have PSNs and await completion, those in [cur, head) have
// packets still to send, those in [started, head) have no PSNs yet. The cursors count
// WQEs ever posted (they never wrap); a WQE's slot is its index modulo the ring's size.
// Everything is guarded by the QP's mu.
type sendQueue struct {
	ring    []sendWQE
	head    uint64 // next slot to post
	cur     uint64 // WQE being (re)sent
	started uint64 // WQEs before this one have PSNs assigned
	tail    uint64 // oldest WQE not yet completed
}

// init makes room for n WQEs of up to maxSGE scatter/gather elements and maxInline bytes of
// inline data, allocated now so that posting allocates nothing.
func (s *sendQueue) init(n, maxSGE, maxInline int) {
	s.ring = make([]sendWQE, n)
	for i := range s.ring {
		s.ring[i].segs = make([][]byte, 0, max(maxSGE, 1))
		if maxInline > 0 {
			s.ring[i].inline = make([]byte, 0, maxInline)
		}
	}
}

func (s *sendQueue) at(i uint64) *sendWQE { return &s.ring[i%uint64(len(s.ring))] }

// reset empties the queue without completions (the QP is entering RESET).
func (s *sendQueue) reset() {
	for i := s.tail; i != s.head; i++ {
		clear(s.at(i).segs)
	}
	s.head, s.cur, s.started, s.tail = 0, 0, 0, 0
}

// Posting.

// full reports whether every slot holds a WQE not yet completed.
func (s *sendQueue) full() bool { return s.head-s.tail == uint64(len(s.ring)) }

// slot returns the slot the next post fills; post makes it part of the queue.
func (s *sendQueue) slot() *sendWQE { return s.at(s.head) }
func (s *sendQueue) post()          { s.head++ }

// The requester.

// unsent reports whether WQEs have packets still to send.
func (s *sendQueue) unsent() bool { return s.cur != s.head }

// current returns the WQE the requester sends next.
func (s *sendQueue) current() *sendWQE { return s.at(s.cur) }

// fresh reports whether the current WQE has no PSNs yet; start gives it its PSNs.
func (s *sendQueue) fresh() bool { return s.cur == s.started }
func (s *sendQueue) start()      { s.started++ }

// atOldest reports whether every WQE before the current one has completed.
func (s *sendQueue) atOldest() bool { return s.cur == s.tail }

// next moves past the current WQE, all of whose packets were sent, and returns the next
// one if it already has PSNs (it was sent before and is being sent again), else nil.
func (s *sendQueue) next() *sendWQE {
	s.cur++
	if s.fresh() {
		return nil
	}
	return s.current()
}

// rewind makes the first WQE not completed whose PSNs reach psn the current one and
// returns it; nil (the requester goes on with new WQEs) if no WQE with PSNs reaches psn.
func (s *sendQueue) rewind(psn wire.PSN) *sendWQE {
	for i := s.tail; i != s.started; i++ {
		if w := s.at(i); !w.lastPSN().Before(psn) {
			s.cur = i
			return w
		}
	}
	s.cur = s.started
	return nil
}

// byIndex returns the WQE with PSNs whose index has low bits idx (weak mode records the
// WQE of each PSN in flight that way).
func (s *sendQueue) byIndex(idx uint32) *sendWQE {
	return s.at(s.tail + uint64(idx-uint32(s.tail)))
}

// The completer.

// inFlight reports whether WQEs with PSNs await completion; oldest returns the first.
func (s *sendQueue) inFlight() bool   { return s.tail != s.started }
func (s *sendQueue) oldest() *sendWQE { return s.at(s.tail) }
func (s *sendQueue) isOldest(idx uint32) bool {
	return s.inFlight() && uint32(s.tail) == idx
}

// sentUncompleted reports whether WQEs all of whose packets were sent await completion
// (UD completes them once they were handed to the socket).
func (s *sendQueue) sentUncompleted() bool { return s.tail != s.cur }

// empty reports whether no WQE awaits completion.
func (s *sendQueue) empty() bool { return s.tail == s.head }

// retire removes the oldest WQE, completed (or flushed).
func (s *sendQueue) retire() {
	s.tail++
	s.cur = max(s.cur, s.tail)
	s.started = max(s.started, s.tail)
}
