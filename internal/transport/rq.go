package transport

import (
	"errors"
	"fmt"

	"github.com/softrnic/softrnic/internal/lockrank"
	"github.com/softrnic/softrnic/internal/tpt"
)

// recvWQE is a posted receive: where an incoming SEND (or the immediate of a WRITE) goes.
type recvWQE struct {
	wrID   uint64
	segs   [][]byte
	regs   []*tpt.Region // the regions segs lie in, checked for revocation before each use
	length uint64
	verr   uint32 // non-zero: an lkey failed its check at post time (reported on use)
}

// revoked reports whether a region of the WQE's scatter list was deregistered since it
// was posted.
func (w *recvWQE) revoked() bool {
	for _, r := range w.regs {
		if r.Revoked() {
			return true
		}
	}
	return false
}

// RecvQueue is a receive queue: a QP's own, or a shared receive queue (SRQ) used by many.
type RecvQueue struct {
	dev *Device
	// mu guards the ring, its indices and the limit; the rest is set at creation.
	mu     mutex
	ring   []recvWQE
	head   uint64 // next slot to post
	tail   uint64 // next slot to consume
	maxSGE int
	pd     uint32
	shared bool
	limit  int // SRQ: armed low watermark (0: disarmed); crossing it raises EventSRQLimit once
	// destroyed: the SRQ was destroyed; posts are refused.
	destroyed bool

	// Owner is the verbs object wrapping this queue (for SRQs).
	Owner any
}

// NewRecvQueue creates a receive queue with room for n WQEs of up to maxSGE elements.
func (d *Device) NewRecvQueue(pd uint32, n, maxSGE int, shared bool) *RecvQueue {
	q := &RecvQueue{dev: d, ring: make([]recvWQE, n), maxSGE: maxSGE, pd: pd, shared: shared, mu: mutex{Rank: lockrank.RecvQ}}
	for i := range q.ring {
		q.ring[i].segs = make([][]byte, 0, maxSGE)
		q.ring[i].regs = make([]*tpt.Region, 0, maxSGE)
	}
	return q
}

// Posted returns the number of WQEs waiting.
func (q *RecvQueue) Posted() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return int(q.head - q.tail)
}

// Cap returns the queue's capacity.
func (q *RecvQueue) Cap() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ring)
}

// ErrQueueFull is returned when a post finds no free slot.
var ErrQueueFull = errors.New("receive queue full")

// post adds one WQE, resolving its scatter list. Unknown or unsuitable lkeys do not fail
// the post (hardware finds them when it uses the WQE); they complete with LOC_PROT_ERR.
// An element outside the region its key names does (ErrSGEBounds).
func (q *RecvQueue) post(wr *RecvWR) error {
	if len(wr.SG) > q.maxSGE {
		return fmt.Errorf("%d scatter elements, queue allows %d", len(wr.SG), q.maxSGE)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return fmt.Errorf("SRQ was %w", ErrDestroyed)
	}
	if q.head-q.tail == uint64(len(q.ring)) {
		return ErrQueueFull
	}
	w := &q.ring[q.head%uint64(len(q.ring))]
	w.wrID = wr.WRID
	w.segs = w.segs[:0]
	w.regs = w.regs[:0]
	w.length = 0
	w.verr = 0
	for i, s := range wr.SG {
		r := q.dev.mrs.Lookup(s.LKey)
		b, st := r.Check(q.pd, s.Addr, uint64(s.Length), tpt.LocalWrite)
		if st == tpt.OutOfBounds {
			clear(w.segs)
			clear(w.regs)
			return sgeBoundsError(i, s, r)
		}
		if st != tpt.OK {
			w.verr = localVendorErr(st)
			continue
		}
		if len(b) > 0 {
			w.segs = append(w.segs, b)
			w.regs = append(w.regs, r)
			w.length += uint64(len(b))
		}
	}
	q.head++
	return nil
}

// pop takes the oldest WQE into dst (which keeps its own copy of the scatter list).
func (q *RecvQueue) pop(dst *recvWQE) bool {
	q.mu.Lock()
	if q.head == q.tail {
		q.mu.Unlock()
		return false
	}
	w := &q.ring[q.tail%uint64(len(q.ring))]
	dst.wrID, dst.length, dst.verr = w.wrID, w.length, w.verr
	dst.segs = append(dst.segs[:0], w.segs...)
	dst.regs = append(dst.regs[:0], w.regs...)
	clear(w.segs)
	clear(w.regs)
	q.tail++
	fire := q.limit > 0 && int(q.head-q.tail) < q.limit
	if fire {
		q.limit = 0 // one shot: QuerySRQ reports 0 until it is armed again
	}
	q.mu.Unlock()
	if fire {
		q.dev.raise(Event{Type: EventSRQLimit, SRQ: q, Detail: "shared receive queue below its limit"})
	}
	return true
}

// Post adds receive WQEs (for an SRQ); it stops at the first it refuses and returns how
// many it posted.
func (q *RecvQueue) Post(wrs []RecvWR) (int, error) {
	if q.dev.closed.Load() {
		return 0, ErrDeviceClosed
	}
	for i := range wrs {
		if err := q.post(&wrs[i]); err != nil {
			return i, err
		}
	}
	return len(wrs), nil
}

// Destroy makes every later post fail with ErrDestroyed (the SRQ was destroyed).
func (q *RecvQueue) Destroy() {
	q.mu.Lock()
	q.destroyed = true
	q.mu.Unlock()
}

// Limit returns the armed low watermark (0 when disarmed).
func (q *RecvQueue) Limit() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.limit
}

// SetLimit arms the low watermark: when fewer WQEs than limit are posted after one is
// taken, EventSRQLimit is raised once. 0 disarms. It fails if limit exceeds the capacity.
func (q *RecvQueue) SetLimit(limit int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if limit < 0 || limit > len(q.ring) {
		return fmt.Errorf("srq_limit %d exceeds the queue's %d entries", limit, len(q.ring))
	}
	q.limit = limit
	return nil
}

// Resize changes the capacity; it fails if more WQEs are posted than would fit.
func (q *RecvQueue) Resize(n int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	posted := int(q.head - q.tail)
	if n < posted || n < 1 {
		return fmt.Errorf("cannot resize to %d entries: %d are posted", n, posted)
	}
	if n < q.limit {
		return fmt.Errorf("cannot resize to %d entries below the armed srq_limit %d", n, q.limit)
	}
	r := make([]recvWQE, n)
	for i := 0; i < posted; i++ {
		r[i] = q.ring[(q.tail+uint64(i))%uint64(len(q.ring))]
	}
	for i := posted; i < n; i++ {
		r[i].segs = make([][]byte, 0, q.maxSGE)
	}
	q.ring, q.tail, q.head = r, 0, uint64(posted)
	return nil
}

// MaxSGE returns the most scatter elements a WQE may have.
func (q *RecvQueue) MaxSGE() int { return q.maxSGE }

// peek copies the WQE i places after the oldest into dst (which keeps its own copy of the
// scatter list) without taking it; false if fewer are posted. The WQE stays in its slot
// until pop takes it, so its memory may be written meanwhile.
func (q *RecvQueue) peek(i int, dst *recvWQE) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if i < 0 || uint64(i) >= q.head-q.tail {
		return false
	}
	w := &q.ring[(q.tail+uint64(i))%uint64(len(q.ring))]
	dst.wrID, dst.length, dst.verr = w.wrID, w.length, w.verr
	dst.segs = append(dst.segs[:0], w.segs...)
	dst.regs = append(dst.regs[:0], w.regs...)
	return true
}

// flush completes every waiting WQE with WR_FLUSH_ERR on cq.
func (q *RecvQueue) flush(cq *CQ, qpn uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for ; q.tail != q.head; q.tail++ {
		w := &q.ring[q.tail%uint64(len(q.ring))]
		cq.push(&CQE{WRID: w.wrID, QPN: qpn, Status: StatusWRFlushErr, Opcode: WCRecv})
		clear(w.segs)
	}
}

// reset drops every waiting WQE without completions (QP to RESET).
func (q *RecvQueue) reset() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for ; q.tail != q.head; q.tail++ {
		clear(q.ring[q.tail%uint64(len(q.ring))].segs)
	}
}

func localVendorErr(st tpt.Status) uint32 {
	switch st {
	case tpt.BadPD:
		return VendorBadPD
	case tpt.NoRights:
		return VendorNoRights
	case tpt.OutOfBounds:
		return VendorBounds
	}
	return VendorBadLKey
}

// scatter copies data into segs starting at byte offset off. It returns false if the
// data does not fit.
func scatter(segs [][]byte, off uint64, data []byte) bool {
	for _, s := range segs {
		if len(data) == 0 {
			return true
		}
		n := uint64(len(s))
		if off >= n {
			off -= n
			continue
		}
		c := copy(s[off:], data)
		data = data[c:]
		off = 0
	}
	return len(data) == 0
}
