package transport

import (
	"sync/atomic"
	"time"
)

// AckGroup is a set of devices that flush each other's held-back ACKs. While a consumer
// polls a device, the receive path holds ACKs back for up to ackDelay so that they ride
// along with the consumer's next send; a goroutine that polls one device of a group also
// sends the ACKs another device of the group has held back for a while, so that a program
// driving several devices from one goroutine does not leave their peers waiting. Whoever
// opens devices that share consumers gives them one group (package verbs: one per
// process).
type AckGroup struct {
	holding atomic.Int32 // len(set), read without mu on every poll
	mu      mutex
	set     map[*Device]struct{} // devices with an ACK held back
}

// NewAckGroup returns an empty group.
func NewAckGroup() *AckGroup {
	return &AckGroup{set: map[*Device]struct{}{}, mu: mutex{rank: rankAckGroup}}
}

// hold adds d to the set of devices holding ACKs back (or removes it).
func (g *AckGroup) hold(d *Device, held bool) {
	g.mu.Lock()
	if held {
		g.set[d] = struct{}{}
	} else {
		delete(g.set, d)
	}
	g.holding.Store(int32(len(g.set)))
	g.mu.Unlock()
}

// crossFlushAge is how long another device's ACK must have been held back before a
// goroutine polling this device sends it (younger ones likely still ride along with their
// own consumer's next send).
const crossFlushAge = int64(5 * time.Microsecond)

// flushOthers sends the ACKs held back for at least crossFlushAge by devices of the group
// other than d, whose receive path is free (d's rxMu held).
func (g *AckGroup) flushOthers(d *Device) {
	if g.holding.Load() == 0 {
		return
	}
	g.mu.Lock()
	var others [8]*Device
	n := 0
	for o := range g.set {
		if o != d && n < len(others) {
			others[n] = o
			n++
		}
	}
	g.mu.Unlock()
	for _, o := range others[:n] {
		if o.rxMu.TryLock() {
			o.flushDeferredOlder(crossFlushAge)
			o.rxMu.Unlock()
		}
	}
}
