package msg

import (
	"context"
	"runtime"
	"time"
)

// The progress engine. Nothing moves a connection but a call under the progress lock:
// whoever holds it polls the rank's completion queue, runs the work other goroutines
// handed over (submit), and lets every connection with something to do move (pump). A
// Wait polls in the caller's goroutine while its request is pending, as MPI libraries
// progress in the caller's thread, until a while has passed without progress; then it
// sleeps, and the progress goroutine (run), woken by completion events, keeps the
// connections moving.

// submit hands f to whoever progresses next (the progress goroutine is woken). It is for
// goroutines that must not wait for the progress lock.
func (c *Comm) submit(f func()) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.ops = append(c.ops, f)
	c.mu.Unlock()
	c.kick()
	return true
}

// kick wakes the progress goroutine.
func (c *Comm) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// call runs f under the progress lock, after the work handed over before it (f sees
// what the call's caller could have seen happen).
func (c *Comm) call(f func()) error {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.down {
		return ErrClosed
	}
	c.runOps()
	f()
	c.pool.settle()
	return nil
}

// events forwards the CQ's completion events to the progress goroutine.
func (c *Comm) events() {
	for {
		cq, err := c.ch.GetCQEvent(context.Background())
		if err != nil {
			return
		}
		cq.AckCQEvents(1)
		select {
		case c.cqEv <- struct{}{}:
		default:
		}
	}
}

// accept hands connection requests to the progress engine.
func (c *Comm) accept() {
	for {
		req, err := c.lis.Accept(context.Background())
		if err != nil {
			return
		}
		if !c.submit(func() { c.onRequest(req) }) {
			req.Reject(nil)
			return
		}
	}
}

// run is the progress goroutine. It progresses whenever there is work and no caller polls
// (callers in Wait do while they poll), then sleeps until a completion event, a
// submission, or an acknowledgement's timeout.
func (c *Comm) run() {
	defer close(c.done)
	var timer *time.Timer
	for {
		c.pmu.Lock()
		if c.down {
			c.pmu.Unlock()
			return
		}
		worked, waiting := c.round()
		c.pmu.Unlock()
		if worked {
			runtime.Gosched()
			continue
		}
		var timeout <-chan time.Time
		if waiting {
			if timer == nil {
				timer = time.NewTimer(time.Millisecond)
			} else {
				timer.Reset(time.Millisecond)
			}
			timeout = timer.C
		}
		if c.spinners.Load() > 0 {
			// Callers poll and progress. One that gives up kicks; one whose request
			// completed does not (it is usually back within microseconds), so look
			// again after a while.
			if timeout == nil {
				if timer == nil {
					timer = time.NewTimer(spinnerCheck)
				} else {
					timer.Reset(spinnerCheck)
				}
				timeout = timer.C
			}
			select {
			case <-c.wake:
			case <-timeout:
			}
			continue
		}
		c.cq.ReqNotifyCQ(false)
		c.pmu.Lock()
		worked = !c.down && c.pollCQ()
		c.pmu.Unlock()
		if worked {
			continue
		}
		select {
		case <-c.cqEv:
		case <-c.wake:
		case <-timeout:
		}
	}
}

// round is one turn of the progress engine (progress lock held): the CQ's completions, the
// work handed over, then every connection with something to send. It reports whether
// anything happened, and whether some connection still has work (it waits for an
// acknowledgement, a timeout or room).
func (c *Comm) round() (worked, waiting bool) {
	worked = c.pollCQ()
	if c.runOps() {
		worked = true
	}
	if c.pump() {
		worked = true
	}
	c.pool.settle()
	return worked, len(c.active) > 0
}

// runOps runs the work handed over with submit (progress lock held).
func (c *Comm) runOps() bool {
	c.mu.Lock()
	ops := c.ops
	c.ops = nil
	c.mu.Unlock()
	for _, f := range ops {
		f()
	}
	return len(ops) > 0
}

// pollCQ handles the completions in the CQ (progress lock held) and puts back the SRQ
// receives they took.
func (c *Comm) pollCQ() bool {
	worked := false
	for {
		n := c.cq.PollCQ(c.wcs)
		for i := range c.wcs[:n] {
			c.completion(&c.wcs[i])
		}
		worked = worked || n > 0
		if n < len(c.wcs) {
			break
		}
	}
	if c.srqOwed > 0 && !c.stopping {
		if err := c.srq.PostSRQRecv(c.recvWRs[:c.srqOwed]); err == nil {
			c.srqOwed = 0
		}
	}
	return worked
}

// pump lets every connection with work move (progress lock held).
func (c *Comm) pump() bool {
	worked := false
	active := c.active
	c.active, c.spare = c.spare[:0], nil // activate appends to the other list
	for _, p := range active {
		p.queued = false
		if p.progress() {
			worked = true
		}
		if p.needsProgress() {
			c.activate(p)
		}
	}
	clear(active)
	c.spare = active[:0]
	return worked
}

// waitable is what await waits for: a request or a probe.
type waitable interface {
	// finished reports whether it is done (any goroutine).
	finished() bool
	// signal returns a channel that is signalled (or closed) when it is done (progress
	// lock held).
	signal() <-chan struct{}
}

// await waits until w is done or ctx ends, and reports which. While the rank is not
// oversubscribed it polls first, progressing in the caller's goroutine, until spin has
// passed since anyone last made progress; then it sleeps and the progress goroutine takes
// over.
func (c *Comm) await(ctx context.Context, w waitable) bool {
	if w.finished() {
		return true
	}
	c.spinners.Add(1)
	idle := time.Now()
	for {
		if c.pmu.TryLock() {
			worked := false
			if !c.down {
				worked, _ = c.round()
				worked = worked || c.transfers > 0
			}
			c.pmu.Unlock()
			if worked {
				idle = time.Now()
			}
		}
		if w.finished() {
			// The progress goroutine finds no spinner at its next timeout: waking it
			// now would cost the next operation its processor.
			c.spinners.Add(-1)
			return true
		}
		if ctx.Err() != nil || time.Since(idle) >= c.spin {
			break
		}
		runtime.Gosched()
	}
	if c.spinners.Add(-1) == 0 {
		c.kick()
	}
	c.pmu.Lock()
	if w.finished() {
		c.pmu.Unlock()
		return true
	}
	sig := w.signal()
	c.pmu.Unlock()
	select {
	case <-sig:
		return true
	case <-ctx.Done():
		return false
	}
}

// activate puts p on the list of peers with work (progress lock held).
func (c *Comm) activate(p *peer) {
	if !p.queued {
		p.queued = true
		c.active = append(c.active, p)
	}
}

// spinnerCheck is how often the progress goroutine looks whether callers still poll.
const spinnerCheck = time.Millisecond

// spinFor is how long a Wait polls, after the last progress, before it sleeps.
const spinFor = 200 * time.Microsecond
