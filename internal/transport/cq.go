package transport

import (
	"sync"
	"sync/atomic"
)

// Arm states of a CQ.
const (
	armNone uint8 = iota
	armSolicited
	armNext
)

// CQ is a completion queue: a ring of CQEs filled by the engine and drained by PollCQ.
// When armed (one shot), a matching CQE calls Notify.
type CQ struct {
	dev   *Device
	mu    sync.Mutex
	ring  []CQE
	head  uint64 // next slot to fill
	tail  uint64 // next slot to poll
	count atomic.Int64
	arm   uint8
	err   bool // overflowed: further completions are lost

	notify func(*CQ)
	// Owner is the verbs object wrapping this CQ.
	Owner any

	lost atomic.Uint64
}

// NewCQ creates a CQ with room for n entries.
func (d *Device) NewCQ(n int) *CQ {
	return &CQ{dev: d, ring: make([]CQE, n)}
}

// Cap returns the number of entries the CQ holds.
func (c *CQ) Cap() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ring)
}

// Len returns the number of completions waiting to be polled.
func (c *CQ) Len() int { return int(c.count.Load()) }

// Lost returns how many completions were lost to overflow.
func (c *CQ) Lost() uint64 { return c.lost.Load() }

// Resize changes the capacity; it fails if more completions are waiting than fit.
func (c *CQ) Resize(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	waiting := int(c.head - c.tail)
	if n < waiting {
		return false
	}
	r := make([]CQE, n)
	for i := 0; i < waiting; i++ {
		r[i] = c.ring[(c.tail+uint64(i))%uint64(len(c.ring))]
	}
	c.ring, c.tail, c.head = r, 0, uint64(waiting)
	return true
}

// push adds a completion. It returns false if the CQ overflowed (the completion is lost and
// a CQ error event is raised once).
func (c *CQ) push(e *CQE) bool {
	c.mu.Lock()
	if c.err {
		c.mu.Unlock()
		c.lost.Add(1)
		return false
	}
	if c.head-c.tail == uint64(len(c.ring)) {
		c.err = true
		c.mu.Unlock()
		c.lost.Add(1)
		c.dev.raise(Event{Type: EventCQErr, CQ: c, Detail: "completion queue overflow"})
		return false
	}
	c.ring[c.head%uint64(len(c.ring))] = *e
	c.head++
	c.count.Add(1)
	fire := c.arm == armNext || (c.arm == armSolicited && (e.solicited || e.Status != StatusSuccess))
	var fn func(*CQ)
	if fire {
		c.arm = armNone
		fn = c.notify
	}
	c.mu.Unlock()
	if fn != nil {
		fn(c)
	}
	return true
}

// SetNotify sets the function called when an armed CQ receives a matching completion. It
// runs with the QP's lock held (not the CQ's) and must only queue the event.
func (c *CQ) SetNotify(fn func(*CQ)) {
	c.mu.Lock()
	c.notify = fn
	c.mu.Unlock()
}

// Poll moves up to len(dst) completions into dst, oldest first.
func (c *CQ) Poll(dst []CQE) int {
	if c.count.Load() == 0 || len(dst) == 0 {
		return 0
	}
	c.mu.Lock()
	n := int(c.head - c.tail)
	if n > len(dst) {
		n = len(dst)
	}
	size := uint64(len(c.ring))
	srq := false
	for i := 0; i < n; i++ {
		dst[i] = c.ring[c.tail%size]
		srq = srq || dst[i].srq
		c.tail++
	}
	c.count.Add(int64(-n))
	c.mu.Unlock()
	if srq {
		// The connection's SRQ WQEs count as held until the consumer polls them.
		for i := 0; i < n; i++ {
			if dst[i].srq {
				if q := c.dev.lookupQP(dst[i].QPN); q != nil {
					q.srqPolled.Add(1)
				}
			}
		}
	}
	return n
}

// Arm requests one notification for the next completion (or, with solicitedOnly, the next
// solicited or error completion). Completions already in the queue do not notify.
func (c *CQ) Arm(solicitedOnly bool) {
	c.mu.Lock()
	if solicitedOnly {
		if c.arm == armNone {
			c.arm = armSolicited
		}
	} else {
		c.arm = armNext
	}
	c.mu.Unlock()
}

// Progress gives the device's receive path a chance to run in the caller's goroutine; a
// busy-polling consumer calls it when the CQ is empty.
func (c *CQ) Progress() { c.dev.Progress() }
