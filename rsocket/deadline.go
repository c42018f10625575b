package rsocket

import (
	"sync"
	"time"
)

// deadline is one direction's deadline: a channel closed when it passes, which a
// blocked call selects on. Moving the deadline keeps the channel while it has not
// passed (a waiter keeps waiting, now until the new time) and makes a new one after it
// has; a deadline in the past closes it at once. Only setting it allocates.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	ch    chan struct{} // closed when the deadline passes
}

func newDeadline() deadline { return deadline{ch: make(chan struct{})} }

// set moves the deadline to t (zero: none).
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.ch // the timer fired, or is about to close ch: wait for it
	}
	d.timer = nil
	passed := isClosed(d.ch)
	if t.IsZero() {
		if passed {
			d.ch = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if passed {
			d.ch = make(chan struct{})
		}
		ch := d.ch
		d.timer = time.AfterFunc(dur, func() { close(ch) })
		return
	}
	if !passed {
		close(d.ch)
	}
}

// wait returns the channel closed when the deadline passes.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
