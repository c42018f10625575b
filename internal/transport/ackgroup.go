package transport

import (
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/internal/lockrank"
)

// AckGroup is a set of devices (their receive queues) that flush each other's held-back
// ACKs. While a consumer polls a device, the receive path holds ACKs back for up to
// ackDelay so that they ride along with the consumer's next send; a goroutine that polls
// one device of a group also sends the ACKs another device of the group has held back for
// a while, so that a program driving several devices from one goroutine does not leave
// their peers waiting. Whoever opens devices that share consumers gives them one group
// (package verbs: one per process).
type AckGroup struct {
	mu mutex // serialises joins and leaves
	// members is the group, replaced (never modified) when a device joins or leaves, so
	// that pollers read it without a lock: a lock taken on every poll by every polling
	// goroutine made them queue on it and sleep (milliseconds of latency tail).
	members atomic.Pointer[[]*queue]
}

// NewAckGroup returns an empty group.
func NewAckGroup() *AckGroup {
	return &AckGroup{mu: mutex{Rank: lockrank.AckGroup}}
}

// join adds a device's queue d to the group (Open).
func (g *AckGroup) join(d *queue) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var m []*queue
	if old := g.members.Load(); old != nil {
		m = append(m, *old...)
	}
	m = append(m, d)
	g.members.Store(&m)
}

// leave removes a device's queue d from the group (Close).
func (g *AckGroup) leave(d *queue) {
	g.hold(d, false)
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.members.Load()
	if old == nil {
		return
	}
	m := make([]*queue, 0, len(*old))
	for _, o := range *old {
		if o != d {
			m = append(m, o)
		}
	}
	g.members.Store(&m)
}

// hold records whether queue d holds ACKs back (d's rxMu held, or its device closing).
// It writes only d's own flag: a counter shared by the group, written by every member's
// receive path on every batch, moved its cache line between the processors of two
// devices polled side by side at each packet.
func (g *AckGroup) hold(d *queue, held bool) {
	if d.holdingAcks.Load() != held {
		d.holdingAcks.Store(held)
	}
}

// crossFlushAge is how long another device's ACK must have been held back before a
// goroutine polling this device sends it (younger ones likely still ride along with their
// own consumer's next send).
const crossFlushAge = int64(5 * time.Microsecond)

// flushOthers sends the ACKs held back for at least crossFlushAge by the queues of the
// group other than d, whose receive path is free (a poller of d, no lock held). It takes
// no lock but theirs, and only if free. It looks at the others at most once per
// crossFlushAge (an ACK held for less is not sent anyway): a poller reading the other
// members' state on every poll took their cache lines from the processors serving them
// (in a process with two devices bouncing messages, about 0.3 us of each one-way latency).
func (g *AckGroup) flushOthers(d *queue) {
	m := g.members.Load()
	if m == nil || len(*m) < 2 {
		return // d is alone (one device of one queue, as in a process per rank): not even the clock
	}
	now := d.d.now()
	if now < d.crossAt.Load() {
		return
	}
	d.crossAt.Store(now + crossFlushAge)
	for _, o := range *m {
		if o != d && o.holdingAcks.Load() && o.rxMu.TryLock() {
			// The ACKs are built under o's receive path and sent after it is released: a
			// thread the system stops in the send holds nothing o's device needs.
			b := o.d.getBatch()
			o.takeDeferred(crossFlushAge, true, b)
			o.rxMu.Unlock()
			if b.Len() > 0 {
				o.d.send(b)
			}
			o.d.putBatch(b)
		}
	}
}
