package verbs

import (
	"context"
	"sync"
)

// maxQueuedEvents bounds the queue of asynchronous events nobody has read yet; beyond
// it the oldest are dropped (and counted).
const maxQueuedEvents = 4096

// eventQueue holds asynchronous events until GetAsyncEvent takes them, and counts per
// object how many were taken but not yet acknowledged.
type eventQueue struct {
	mu      sync.Mutex
	cond    *sync.Cond
	q       []*AsyncEvent
	ready   chan struct{} // has a token while q is non-empty
	unacked map[any]int
	dropped uint64
	closed  bool
}

func (e *eventQueue) init() {
	e.cond = sync.NewCond(&e.mu)
	e.ready = make(chan struct{}, 1)
	e.unacked = make(map[any]int)
}

func (e *eventQueue) push(ev *AsyncEvent) {
	e.mu.Lock()
	if len(e.q) >= maxQueuedEvents {
		e.q = e.q[1:]
		e.dropped++
	}
	e.q = append(e.q, ev)
	e.mu.Unlock()
	select {
	case e.ready <- struct{}{}:
	default:
	}
}

func (e *eventQueue) tryGet() (*AsyncEvent, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.q) == 0 {
		return nil, false
	}
	ev := e.q[0]
	e.q[0] = nil
	e.q = e.q[1:]
	if len(e.q) > 0 {
		select {
		case e.ready <- struct{}{}:
		default:
		}
	}
	if o := ev.object(); o != nil {
		e.unacked[o]++
	}
	return ev, true
}

func (e *eventQueue) get(ctx context.Context) (*AsyncEvent, error) {
	for {
		if ev, ok := e.tryGet(); ok {
			return ev, nil
		}
		e.mu.Lock()
		closed := e.closed
		e.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		select {
		case <-e.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (e *eventQueue) ack(ev *AsyncEvent) {
	if ev == nil {
		return
	}
	e.mu.Lock()
	if o := ev.object(); o != nil && e.unacked[o] > 0 {
		if e.unacked[o]--; e.unacked[o] == 0 {
			delete(e.unacked, o)
		}
		e.cond.Broadcast()
	}
	e.mu.Unlock()
}

// forget drops queued events for obj and waits until the ones already taken are
// acknowledged (what destroying an object does in libibverbs).
func (e *eventQueue) forget(obj any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	kept := e.q[:0]
	for _, ev := range e.q {
		if ev.object() != obj {
			kept = append(kept, ev)
		}
	}
	clear(e.q[len(kept):])
	e.q = kept
	for e.unacked[obj] > 0 && !e.closed {
		e.cond.Wait()
	}
}

func (e *eventQueue) close() {
	e.mu.Lock()
	e.closed = true
	e.cond.Broadcast()
	e.mu.Unlock()
	select {
	case e.ready <- struct{}{}:
	default:
	}
}

func (ev *AsyncEvent) object() any {
	switch {
	case ev.QP != nil:
		return ev.QP
	case ev.CQ != nil:
		return ev.CQ
	case ev.SRQ != nil:
		return ev.SRQ
	}
	return nil
}
