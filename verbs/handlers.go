package verbs

import (
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/internal/osthread"
)

// Completion handlers are libibverbs' completion vectors made concrete. A device has a
// fixed set of them (DeviceConfig.CompletionHandlers; QueryDevice reports how many as
// NumCompVectors). Each CQ is bound to one (CreateCQ's compVector; ModifyCQ re-binds it or
// removes the binding). When an armed CQ raises its event (ReqNotifyCQ: the next
// completion, or the next solicited or error one; one shot), the event goes to the CQ's
// handler if a function is registered on it (SetCompletionHandler), and otherwise to the
// CQ's completion channel.
//
// A handler is a goroutine locked to its own OS thread, started when its first function is
// registered. Like an interrupt thread it is scheduled by the kernel, not by the Go
// runtime's processors: each running handler adds one to GOMAXPROCS (and gives it back
// when the device closes), so a handler function that works for a long time never keeps
// the device's receive goroutine, or the program's goroutines, from running. With a CPU
// set its thread is pinned to those CPUs (sched_setaffinity). Its priority decides
// dispatch order: before it calls its function for an event, a handler lets every
// higher-priority handler with events waiting (and not already running its function) go
// first, waiting a millisecond at most for one whose thread gets no CPU. Lower priorities
// also run at higher nice values — the highest priority level at nice 0, the lowest at 5,
// the levels between spread evenly — so that when handlers share a CPU, the kernel favours
// a higher-priority handler when it wakes. The spread stops at 5 on purpose: a handler
// function takes the engine's locks briefly (PollCQ, PostRecv), and a thread at nice 19
// preempted while holding one, on a machine whose CPUs are saturated, can stall the
// device's receive path long enough for peers to time out (priority inversion). Measured
// with bench/cmd/cqbench, latency isolation is as good at 5 as at 19. RealTime puts a
// handler under SCHED_FIFO instead (where the process is allowed to), ahead of every
// ordinary thread.

// lowestNice is the nice value of the lowest priority level when handlers' priorities differ.
const lowestNice = 5

// NoHandler in CreateCQ or CQAttr.Handler leaves a CQ without a completion handler: its
// events go to its completion channel.
const NoHandler = -1

// HandlerConfig configures one completion handler.
type HandlerConfig struct {
	// CPUs are the CPUs the handler's thread may run on (nil: wherever the process may).
	CPUs []int
	// Priority orders dispatch between handlers: higher first.
	Priority int
	// RealTime runs the handler's thread under the SCHED_FIFO real-time policy (priority
	// 1 + its priority level among the device's real-time handlers), so that it preempts
	// every ordinary thread on its CPUs. It needs CAP_SYS_NICE or an RLIMIT_RTPRIO
	// allowance: SetCompletionHandler fails otherwise.
	RealTime bool
}

// CompletionHandlerFunc handles a completion event: the CQ bound to handler was armed and
// received a completion that matched. It runs on the handler's goroutine (its own OS
// thread); the usual body is the arm-then-drain loop (see CQ.ReqNotifyCQ).
type CompletionHandlerFunc func(handler int, cq *CQ)

// HandlerStats describe a completion handler.
type HandlerStats struct {
	Handler  int
	CPUs     []int // its CPU set (nil: not pinned)
	Priority int
	Nice     int    // the nice value of its thread
	RealTime bool   // SCHED_FIFO
	ThreadID int    // its OS thread (0 until started)
	Running  bool   // a function is registered and its goroutine runs
	Events   uint64 // events queued to it
	Calls    uint64 // calls of its function
	Pending  int    // events queued and not yet dispatched
	Rerouted uint64 // events it passed on: its function was removed, or the CQ was re-bound
	Dropped  uint64 // events for CQs destroyed before their turn
	// Notification latency, from the completion that raised the event to the call of the
	// handler's function (log-linear histogram: within 12.5%).
	Latency LatencySummary
}

// LatencySummary summarises a latency histogram.
type LatencySummary struct {
	Count               uint64
	P50, P99, P999, Max time.Duration
	Mean                time.Duration
}

// handler is one completion handler.
type handler struct {
	ctx    *Device
	id     int
	cpus   []int
	prio   int
	nice   int
	rt     bool
	rtPrio int

	fn atomic.Pointer[CompletionHandlerFunc]

	mu      sync.Mutex
	queue   []handlerEvent
	started bool
	done    chan struct{}

	// wake is how the handler's thread sleeps: in the kernel, not in the Go scheduler, so
	// that waking it is one system call and it runs as soon as the kernel schedules it, as
	// an interrupt thread would.
	wake osthread.Parker

	pending atomic.Int32       // queued, not yet dispatched
	inCall  atomic.Pointer[CQ] // the CQ whose event the function handles now
	tid     atomic.Int32
	stopped atomic.Bool

	events, calls, rerouted, dropped atomic.Uint64
	lat                              latencyHist
}

type handlerEvent struct {
	cq *CQ
	at int64 // when the event was raised (monotonic ns)
}

// epoch is the reference of nanotime.
var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// handlerSet is a device's completion handlers: by id (nil where one was removed) and,
// live ones only, highest priority first. It is replaced, never changed, when handlers are
// added or removed (under Context.mu), so handler threads read it without a lock.
type handlerSet struct {
	byID, byPrio []*handler
	live         int
}

// handlerSet returns the device's current handlers.
func (c *Device) handlerSet() *handlerSet { return c.hs.Load() }

// checkHandlerCPUs checks that every CPU of hc is one this process may run on.
func checkHandlerCPUs(id int, hc HandlerConfig) error {
	allowed, err := osthread.AllowedCPUs()
	if err != nil {
		return fmt.Errorf("verbs: %w", err)
	}
	for _, cpu := range hc.CPUs {
		if !slices.Contains(allowed, cpu) {
			return fmt.Errorf("verbs: completion handler %d: %w: CPU %d is not one this process may run on (%v)", id, ErrInvalid, cpu, allowed)
		}
	}
	return nil
}

// newHandler makes handler id from hc; prios are the distinct priority levels of the
// device's handlers (hc's included), which set its nice value and real-time priority. The
// goroutine starts with the first function (SetCompletionHandler).
func (c *Device) newHandler(id int, hc HandlerConfig, prios []int) *handler {
	level := slices.Index(prios, hc.Priority) // 0 for the lowest
	nice := 0
	if len(prios) > 1 {
		nice = (lowestNice*(len(prios)-1-level) + (len(prios)-1)/2) / (len(prios) - 1)
	}
	h := &handler{ctx: c, id: id, cpus: slices.Clone(hc.CPUs), prio: hc.Priority, nice: nice,
		rt: hc.RealTime, rtPrio: 1 + level, done: make(chan struct{})}
	if h.rt {
		h.nice = 0
	}
	return h
}

// levels returns the distinct priorities of hs's live handlers and of extra.
func (hs *handlerSet) levels(extra ...int) []int {
	prios := slices.Clone(extra)
	for _, h := range hs.byPrio {
		prios = append(prios, h.prio)
	}
	slices.Sort(prios)
	return slices.Compact(prios)
}

// newHandlerSet returns the set of the handlers byID (nil entries: removed ones).
func newHandlerSet(byID []*handler) *handlerSet {
	hs := &handlerSet{byID: byID}
	for _, h := range byID {
		if h != nil {
			hs.byPrio = append(hs.byPrio, h)
		}
	}
	hs.live = len(hs.byPrio)
	slices.SortStableFunc(hs.byPrio, func(a, b *handler) int { return b.prio - a.prio })
	return hs
}

// setupHandlers validates the handler configuration and creates the handlers (not their
// goroutines).
func (c *Device) setupHandlers(cfgs []HandlerConfig) error {
	prios := make([]int, 0, len(cfgs))
	for i, hc := range cfgs {
		if err := checkHandlerCPUs(i, hc); err != nil {
			return err
		}
		prios = append(prios, hc.Priority)
	}
	slices.Sort(prios)
	prios = slices.Compact(prios)
	byID := make([]*handler, 0, len(cfgs))
	for i, hc := range cfgs {
		byID = append(byID, c.newHandler(i, hc, prios))
	}
	c.hs.Store(newHandlerSet(byID))
	return nil
}

// AddCompletionHandler adds a completion handler to the running device and returns its
// id (the next one; ids are never reused): handlers can be registered as consumers
// arrive. Its nice value and real-time priority follow its priority's rank among the
// device's handlers then (the others keep theirs). Bind CQs to it with CreateCQ or
// ModifyCQ, and give it a function with SetCompletionHandler.
func (c *Device) AddCompletionHandler(hc HandlerConfig) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.check(); err != nil {
		return 0, fmt.Errorf("verbs: AddCompletionHandler: %w", err)
	}
	hs := c.handlerSet()
	id := len(hs.byID)
	if err := checkHandlerCPUs(id, hc); err != nil {
		return 0, err
	}
	h := c.newHandler(id, hc, hs.levels(hc.Priority))
	c.hs.Store(newHandlerSet(append(slices.Clone(hs.byID), h)))
	return id, nil
}

// RemoveCompletionHandler removes handler id from the running device: the CQs bound to it
// lose their binding (their events go to their completion channels, as with NoHandler),
// events already queued to it are passed on the same way, and its thread ends. Its id is
// not given to another handler.
func (c *Device) RemoveCompletionHandler(id int) error {
	h, err := c.handlerAt("RemoveCompletionHandler", id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	hs := c.handlerSet()
	if hs.byID[id] != h {
		c.mu.Unlock()
		return fmt.Errorf("verbs: RemoveCompletionHandler: %w: completion handler %d was removed", ErrInvalid, id)
	}
	byID := slices.Clone(hs.byID)
	byID[id] = nil
	c.hs.Store(newHandlerSet(byID))
	for cq := range c.cqSet {
		cq.handler.CompareAndSwap(h, nil)
	}
	started := h.started
	c.mu.Unlock()
	// Queued events find no function and are passed on to the CQs' channels; then the
	// thread ends.
	h.fn.Store(nil)
	if started && !h.stopped.Swap(true) {
		h.wake.Unpark()
		if h.tid.Load() != int32(osthread.ID()) {
			<-h.done
		}
	}
	return nil
}

func (c *Device) handlerAt(op string, id int) (*handler, error) {
	hs := c.handlerSet()
	if id < 0 || id >= len(hs.byID) {
		return nil, fmt.Errorf("verbs: %s: %w: completion handler %d not in 0..%d", op, ErrInvalid, id, len(hs.byID)-1)
	}
	if hs.byID[id] == nil {
		return nil, fmt.Errorf("verbs: %s: %w: completion handler %d was removed", op, ErrInvalid, id)
	}
	return hs.byID[id], nil
}

// SetCompletionHandler registers fn as completion handler id's function (nil removes it:
// the events of CQs bound to the handler go to their completion channels again). The
// handler's goroutine starts with its first function, locked to its own OS thread and
// pinned to its CPU set. Events already queued when the function changes are handled by
// the new one.
func (c *Device) SetCompletionHandler(id int, fn CompletionHandlerFunc) error {
	h, err := c.handlerAt("SetCompletionHandler", id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if err := c.check(); err != nil {
		c.mu.Unlock()
		return fmt.Errorf("verbs: SetCompletionHandler: %w", err)
	}
	if fn == nil {
		h.fn.Store(nil)
		c.mu.Unlock()
		h.wake.Unpark()
		return nil
	}
	h.fn.Store(&fn)
	if h.started {
		c.mu.Unlock()
		return nil
	}
	h.started = true
	c.mu.Unlock()
	ready := make(chan error, 1)
	go h.run(ready)
	return <-ready
}

// HandlerStats returns handler id's configuration, counters and notification latency.
func (c *Device) HandlerStats(id int) (HandlerStats, error) {
	h, err := c.handlerAt("HandlerStats", id)
	if err != nil {
		return HandlerStats{}, err
	}
	return HandlerStats{
		Handler: id, CPUs: slices.Clone(h.cpus), Priority: h.prio, Nice: h.nice, RealTime: h.rt, ThreadID: int(h.tid.Load()),
		Running: h.fn.Load() != nil && !h.stopped.Load() && h.tid.Load() != 0,
		Events:  h.events.Load(), Calls: h.calls.Load(), Pending: int(h.pending.Load()),
		Rerouted: h.rerouted.Load(), Dropped: h.dropped.Load(), Latency: h.lat.summary(),
	}, nil
}

// ResetHandlerStats clears handler id's counters and latency histogram.
func (c *Device) ResetHandlerStats(id int) error {
	h, err := c.handlerAt("ResetHandlerStats", id)
	if err != nil {
		return err
	}
	h.events.Store(0)
	h.calls.Store(0)
	h.rerouted.Store(0)
	h.dropped.Store(0)
	h.lat.reset()
	return nil
}

// post queues an event raised at time at for cq.
func (h *handler) post(cq *CQ, at int64) {
	h.mu.Lock()
	// Counted before the event is queued, under the queue's lock: the handler's thread
	// may take and dispatch it as soon as the lock is released, and pending must never
	// fall behind the queue (a lower-priority handler would see no event waiting).
	h.pending.Add(1)
	h.queue = append(h.queue, handlerEvent{cq: cq, at: at})
	h.mu.Unlock()
	h.events.Add(1)
	h.wake.Unpark()
	cq.ctx.dev.RequestYield()
}

// accepting reports whether events may be queued to h.
func (h *handler) accepting() bool {
	return h.fn.Load() != nil && !h.stopped.Load()
}

// run is the handler's goroutine.
func (h *handler) run(ready chan<- error) {
	// The goroutine keeps its own OS thread, pinned to the handler's CPUs, at its nice
	// value or SCHED_FIFO priority, until it returns.
	defer close(h.done)
	tid, err := osthread.Lock(osthread.Config{CPUs: h.cpus, RealTime: h.rt, RTPriority: h.rtPrio, Nice: h.nice})
	h.tid.Store(int32(tid))
	if err != nil {
		h.stopped.Store(true)
		ready <- fmt.Errorf("verbs: completion handler %d: %w", h.id, err)
		return
	}
	osthread.AddProcs(1)
	defer osthread.AddProcs(-1)
	ready <- nil
	var batch []handlerEvent
	for {
		h.mu.Lock()
		for len(h.queue) == 0 {
			h.mu.Unlock()
			if h.stopped.Load() {
				return
			}
			h.wake.Park()
			h.mu.Lock()
		}
		batch, h.queue = h.queue, batch[:0]
		h.mu.Unlock()
		// pending counts the batch's events until each is dispatched, so that a
		// lower-priority handler never sees this one idle between taking its events and
		// running its function (yieldToHigher).
		for i := range batch {
			h.ctx.yieldToHigher(h)
			h.dispatch(&batch[i])
		}
		clear(batch)
	}
}

// dispatch calls the function for one event, or passes the event on.
func (h *handler) dispatch(ev *handlerEvent) {
	cq := ev.cq
	if cq.destroyed.Load() {
		h.pending.Add(-1)
		h.dropped.Add(1)
		return
	}
	fn := h.fn.Load()
	if fn == nil {
		// The function was removed after the event was queued: the CQ's channel, or its
		// new handler, takes it.
		h.pending.Add(-1)
		h.rerouted.Add(1)
		cq.route(ev.at, h)
		return
	}
	h.lat.add(uint64(max(nanotime()-ev.at, 0)))
	h.calls.Add(1)
	h.inCall.Store(cq) // before pending drops: never idle-looking in between
	h.pending.Add(-1)
	(*fn)(h.id, cq)
	h.inCall.Store(nil)
}

// maxPriorityWait is how long a handler waits, at most, for higher-priority handlers to
// take their events before it dispatches one of its own: a higher-priority handler whose
// thread does not get a CPU (pinned to a busy one, say) must not hold the others up.
const maxPriorityWait = time.Millisecond

// yieldToHigher lets every higher-priority handler that has events waiting, and is not
// running its function already, take them before h dispatches its next event (waiting
// maxPriorityWait at most).
func (c *Device) yieldToHigher(h *handler) {
	var deadline int64
	for _, o := range c.handlerSet().byPrio {
		if o.prio <= h.prio {
			return
		}
		for n := 0; o.pending.Load() > 0 && o.inCall.Load() == nil && o.accepting(); n++ {
			if n%64 == 63 {
				// Never wait long for a handler that cannot run.
				limit := c.priorityWait.Load()
				if limit == 0 {
					limit = int64(maxPriorityWait)
				}
				now := nanotime()
				if deadline == 0 {
					deadline = now + limit
				} else if limit > 0 && now > deadline {
					return
				}
			}
			runtime.Gosched()
		}
	}
}

// forget drops queued events for cq and waits until no handler is running its function
// for it (except the calling thread's own handler: DestroyCQ from inside the function).
func (c *Device) forgetCQ(cq *CQ) {
	self := int32(osthread.ID())
	for _, h := range c.handlerSet().byPrio {
		h.mu.Lock()
		kept := h.queue[:0]
		for _, ev := range h.queue {
			if ev.cq != cq {
				kept = append(kept, ev)
			} else {
				h.pending.Add(-1)
				h.dropped.Add(1)
			}
		}
		clear(h.queue[len(kept):])
		h.queue = kept
		h.mu.Unlock()
		if h.tid.Load() == self {
			continue
		}
		for h.inCall.Load() == cq {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// stopHandlers ends the handlers' goroutines (Close); a handler closing its own device
// from its function is not waited for.
func (c *Device) stopHandlers() {
	self := int32(osthread.ID())
	for _, h := range c.handlerSet().byPrio {
		c.mu.Lock()
		started := h.started
		c.mu.Unlock()
		if !started || h.stopped.Swap(true) {
			continue
		}
		h.wake.Unpark()
		if h.tid.Load() != self {
			<-h.done
		}
	}
}

// latencyHist is a log-linear histogram of nanoseconds: 8 sub-buckets per power of two.
type latencyHist struct {
	b   [65 * 8]atomic.Uint64
	sum atomic.Uint64
	max atomic.Uint64
}

func latBucket(v uint64) int {
	n := bits.Len64(v)
	if n <= 3 {
		return int(v)
	}
	return n*8 + int(v>>(n-4))&7
}

// latValue is the middle of bucket i.
func latValue(i int) uint64 {
	if i < 8 {
		return uint64(i)
	}
	n, sub := i/8, uint64(i%8)
	lo := (8 + sub) << (n - 4)
	return lo + (uint64(1)<<(n-4))/2
}

func (l *latencyHist) add(v uint64) {
	l.b[latBucket(v)].Add(1)
	l.sum.Add(v)
	for {
		m := l.max.Load()
		if v <= m || l.max.CompareAndSwap(m, v) {
			return
		}
	}
}

func (l *latencyHist) reset() {
	for i := range l.b {
		l.b[i].Store(0)
	}
	l.sum.Store(0)
	l.max.Store(0)
}

func (l *latencyHist) summary() LatencySummary {
	var counts [len(latencyHist{}.b)]uint64
	var total uint64
	for i := range l.b {
		counts[i] = l.b[i].Load()
		total += counts[i]
	}
	s := LatencySummary{Count: total, Max: time.Duration(l.max.Load())}
	if total == 0 {
		return s
	}
	s.Mean = time.Duration(l.sum.Load() / total)
	q := func(p float64) time.Duration {
		want := uint64(p*float64(total-1)) + 1
		var acc uint64
		for i, c := range counts {
			if acc += c; acc >= want {
				return min(time.Duration(latValue(i)), s.Max)
			}
		}
		return s.Max
	}
	s.P50, s.P99, s.P999 = q(0.50), q(0.99), q(0.999)
	return s
}
