package transport

import (
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/internal/lockrank"
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
	dev *Device
	// mu guards the ring, its indices, the arm state, the overflow flag, the notify
	// function and the moderation fields; count and lost are atomic (read without it).
	mu    mutex
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

	queues atomic.Uint64 // bit i: a QP of the device's queue i completes here (see Progress)

	// Moderation: an armed CQ's event waits until modCount matching completions arrived
	// or modPeriod passed since the first of them (0, 0: at once).
	modCount  int
	modPeriod time.Duration
	modSeen   int   // matching completions since the CQ was armed
	modFirst  int64 // device time of the first of them
	modTimer  *time.Timer
}

// NewCQ creates a CQ with room for n entries.
func (d *Device) NewCQ(n int) *CQ {
	return &CQ{dev: d, ring: newCQRing(n), mu: mutex{Rank: lockrank.CQ}}
}

// newCQRing allocates a ring of n CQEs with its pages faulted in: a large ring comes from
// fresh memory, whose pages the kernel maps on first write, and each of those faults
// (10-11 µs in this project's virtual machines: BenchmarkFirstTouch in verbs) would otherwise land on a completion, one every
// 4 KiB of entries, until the ring has gone round once.
func newCQRing(n int) []CQE {
	r := make([]CQE, n)
	per := max(1, 4096/int(unsafe.Sizeof(CQE{})))
	for i := 0; i < n; i += per {
		r[i] = CQE{}
	}
	return r
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
	r := newCQRing(n)
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
	if fire && (c.modCount > 1 || c.modPeriod > 0) {
		fire = c.moderate()
	}
	var fn func(*CQ)
	if fire {
		c.arm = armNone
		c.modSeen = 0
		fn = c.notify
	}
	c.mu.Unlock()
	if fn != nil {
		fn(c)
	}
	return true
}

// moderate counts a completion that would raise the armed CQ's event and says whether the
// event is due: after modCount of them, or (from the timer) modPeriod after the first
// (c.mu held).
func (c *CQ) moderate() bool {
	c.modSeen++
	if c.modCount > 0 && c.modSeen >= c.modCount || c.modPeriod <= 0 {
		if c.modTimer != nil {
			c.modTimer.Stop()
		}
		return true
	}
	if c.modSeen == 1 && c.modPeriod > 0 {
		c.modFirst = c.dev.now()
		if c.modTimer == nil {
			c.modTimer = time.AfterFunc(c.modPeriod, c.modExpired)
		} else {
			c.modTimer.Reset(c.modPeriod)
		}
	}
	return false
}

// modExpired raises the event of an armed CQ whose moderation period ran out.
func (c *CQ) modExpired() {
	c.mu.Lock()
	if c.arm == armNone || c.modSeen == 0 {
		c.mu.Unlock()
		return
	}
	if left := c.modPeriod - time.Duration(c.dev.now()-c.modFirst); left > 0 {
		c.modTimer.Reset(left) // a stale expiry of an earlier round
		c.mu.Unlock()
		return
	}
	c.arm, c.modSeen = armNone, 0
	fn := c.notify
	c.mu.Unlock()
	if fn != nil {
		fn(c)
	}
}

// SetModeration sets event moderation: an armed CQ raises its event once count matching
// completions arrived, or period after the first of them, whichever comes first (count
// 0 or 1 and period 0: at the first one).
func (c *CQ) SetModeration(count int, period time.Duration) {
	c.mu.Lock()
	c.modCount, c.modPeriod = count, period
	if c.modTimer != nil && period <= 0 {
		c.modTimer.Stop()
	}
	c.mu.Unlock()
}

// Moderation returns the CQ's event moderation.
func (c *CQ) Moderation() (count int, period time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.modCount, c.modPeriod
}

// Stop stops the CQ's moderation timer (the CQ is being destroyed).
func (c *CQ) Stop() {
	c.mu.Lock()
	if c.modTimer != nil {
		c.modTimer.Stop()
	}
	c.notify = nil
	c.mu.Unlock()
}

// Device returns the device the CQ belongs to.
func (c *CQ) Device() *Device { return c.dev }

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

// Fire raises the CQ's event now, whatever its arming (which it clears), and reports
// whether it did (a CQ without a notify function does nothing).
func (c *CQ) Fire() bool {
	c.mu.Lock()
	c.arm, c.modSeen = armNone, 0
	fn := c.notify
	c.mu.Unlock()
	if fn == nil {
		return false
	}
	fn(c)
	return true
}

// Armed reports whether the CQ is armed.
func (c *CQ) Armed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.arm != armNone
}

// Progress gives the receive paths of the queues whose QPs complete on this CQ a chance
// to run in the caller's goroutine; a busy-polling consumer calls it when the CQ is empty.
// A CQ whose QPs all live on one queue costs one receive system call a poll, however many
// queues the device has.
func (c *CQ) Progress() {
	m := c.queues.Load()
	for i, u := range c.dev.queues {
		if m&(1<<(i%64)) != 0 {
			u.progress()
		}
	}
}

// addQueue records that a QP of queue u completes on c (see Progress). A destroyed QP's
// queue stays recorded: polling it costs a system call, and forgetting it could leave a
// QP created later without progress.
func (c *CQ) addQueue(u *queue) {
	bit := uint64(1) << (u.idx % 64)
	for {
		m := c.queues.Load()
		if m&bit != 0 || c.queues.CompareAndSwap(m, m|bit) {
			return
		}
	}
}
