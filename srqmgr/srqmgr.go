// Package srqmgr provisions a shared receive queue statistically. It measures, per
// connection, how many receive WQEs it consumes per second (sampled every interval), keeps
// an exponentially weighted mean and variance of that demand, and sizes the SRQ to the
// sum of the means plus a margin for the variance that makes running dry no likelier than
// a configured probability, times the time the SRQ must last until the next refill — the
// interval, or the gap between refills as measured when the machine is busy and they come
// late (its mean plus the same margin) — never below a floor. When the target needs more
// room than the SRQ has, it resizes the SRQ (ModifySRQ, within configured bounds), and
// shrinks it again when demand falls. It follows the target as connections come, go and
// change: it posts buffers from a pool of registered memory (registered in chunks, so the
// memory follows the target too) and retires buffers the consumer returns while the SRQ is
// above target; the SRQ's low-watermark event makes it refill early. Each connection's
// statistical share is given to its limit queue, which lets it borrow above that share up to
// its limits and paces or drops it beyond; an interval in which a connection was paced
// does not raise its measured demand, so flooding earns no larger share. Everything is
// decided locally.
//
// The common path is one call, Start, then Consume for each receive completion (which
// reads the message and hands the buffer back); Start runs the manager, which also
// refills the SRQ between its measurements when it runs low, so the SRQ limit event need
// not be passed on. The parts are there for other arrangements: New and Run, Buffer and
// Release, HandleEvent for the limit event.
//
// A Manager is safe for concurrent use: Buffer, Release, Attach, Detach, HandleEvent, Tick
// (and Run, which calls it), Stats and Close may be called from any goroutines, e.g. the
// consumers' completion handlers, the goroutine reading async events and Run's.
package srqmgr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// Config configures a Manager.
type Config struct {
	SRQ     *verbs.SRQ
	PD      *verbs.PD // the SRQ's protection domain, for the pool's registrations
	BufSize int       // bytes per receive buffer
	// Interval is the measurement interval (default 10 ms).
	Interval time.Duration
	// Alpha weighs the newest interval in the moving mean and variance (default 0.2).
	Alpha float64
	// Overflow is the probability per interval that demand exceeds the target (default
	// 0.001); the margin is z·σ for the normal quantile z of 1-Overflow.
	Overflow float64
	// Floor is the least the target ever is (default 16).
	Floor int
	// Chunk is how many buffers are registered together (default 64).
	Chunk int
	// Limits, if set, is installed on every connection attached.
	Limits *verbs.LimitConfig
	// MinDepth and MaxDepth bound the SRQ's size (max_wr): the manager resizes the SRQ
	// (ModifySRQ with SRQAttrMaxWR) up to MaxDepth when the target needs more room, and
	// back down, never below MinDepth, when a quarter of it would do. Defaults: the SRQ's
	// size when New is called, and the device's max_srq_wr.
	MinDepth, MaxDepth int
}

// Stats describe the SRQ's provisioning.
type Stats struct {
	Target          int   // WQEs the SRQ should hold
	Posted          int   // WQEs it holds
	InUse           int   // buffers taken by connections and not yet released
	Free            int   // registered buffers neither posted nor in use
	RegisteredBytes int64 // memory registered for receive buffers
	Refills         uint64
	LimitEvents     uint64
	Depth           int    // the SRQ's size (max_wr) now
	Resizes         uint64 // times the manager resized the SRQ
	Conns           []ConnStats
}

// ConnStats describe one connection's demand and share.
type ConnStats struct {
	QPNum  uint32
	Mean   float64 // WQEs per second
	StdDev float64
	Share  float64 // WQEs per second its statistical share allows (mean + z·σ)
	Limits verbs.LimitStats
}

type chunk struct {
	mr   *verbs.MR
	free int // its buffers in the free list
}

type conn struct {
	qp        *verbs.QP
	lastTaken uint64
	lastPaced uint64  // pace and hard-RNR decisions of its limit queue so far
	mean, vr  float64 // WQEs per second: EWMA of the rate and of its variance
	seen      bool
	// demand reads the QP's WQEs taken and its limit queue's refusals so far
	// (QP.SRQDemand; tests replace it).
	demand func() (taken, refused uint64)
}

// Manager provisions one SRQ.
type Manager struct {
	cfg Config
	z   float64

	tickMu sync.Mutex // one Tick at a time; guards the conns' demand fields and the gap
	sample []*conn
	// The time between refills (Ticks): EWMA of the gap and of its variance, in seconds.
	// The SRQ must last from one refill to the next; on a busy machine the gaps grow and
	// vary, and the target grows with them.
	lastTick   time.Time
	gap, gapVr float64
	gapPeak    float64          // the longest recent gap, halving every second
	now        func() time.Time // time.Now; tests replace it

	mu      sync.Mutex
	chunks  []*chunk     // by buffer id / Chunk; nil once deregistered
	free    []int        // buffer ids neither posted nor in use
	lent    map[int]bool // buffers given to the SRQ: posted, or taken by a connection and not released
	nlent   int
	target  int
	conns   map[*verbs.QP]*conn
	refills uint64
	events  uint64
	resizes uint64
	closed  bool
	done    chan struct{} // closed by Close: stops Run
}

// New creates a manager and posts the floor.
func New(cfg Config) (*Manager, error) {
	if cfg.SRQ == nil || cfg.PD == nil || cfg.BufSize <= 0 {
		return nil, errors.New("srqmgr: SRQ, PD and BufSize are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Millisecond
	}
	if cfg.Alpha <= 0 || cfg.Alpha > 1 {
		cfg.Alpha = 0.2
	}
	if cfg.Overflow <= 0 || cfg.Overflow >= 0.5 {
		cfg.Overflow = 0.001
	}
	if cfg.Floor <= 0 {
		cfg.Floor = 16
	}
	if cfg.Chunk <= 0 {
		cfg.Chunk = 64
	}
	if cfg.MinDepth <= 0 {
		cfg.MinDepth = cfg.SRQ.QuerySRQ().MaxWR
	}
	if cfg.MaxDepth <= 0 {
		cfg.MaxDepth = cfg.PD.Device().QueryDevice().MaxSRQWR
	}
	if cfg.MaxDepth < cfg.MinDepth {
		return nil, fmt.Errorf("srqmgr: MaxDepth %d below MinDepth %d", cfg.MaxDepth, cfg.MinDepth)
	}
	m := &Manager{cfg: cfg, z: normalQuantile(1 - cfg.Overflow), lent: map[int]bool{}, conns: map[*verbs.QP]*conn{}, done: make(chan struct{}), now: time.Now}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.target = cfg.Floor
	if err := m.fill(); err != nil {
		return nil, err
	}
	m.arm()
	return m, nil
}

// ewma folds sample x into an exponentially weighted mean and variance with weight a (the
// first sample sets the mean).
func ewma(mean, vr *float64, x, a float64, first bool) {
	if first {
		*mean, *vr = x, 0
		return
	}
	diff := x - *mean
	*mean += a * diff
	*vr = (1 - a) * (*vr + a*diff*diff)
}

// normalQuantile returns z with P(N(0,1) <= z) = p, for p in (0.5, 1) (Abramowitz and
// Stegun 26.2.23; error below 4.5e-4).
func normalQuantile(p float64) float64 {
	q := 1 - p
	t := math.Sqrt(-2 * math.Log(q))
	return t - (2.515517+0.802853*t+0.010328*t*t)/(1+1.432788*t+0.189269*t*t+0.001308*t*t*t)
}

// Attach starts tracking a connection (a QP on the SRQ) and installs the configured limits.
func (m *Manager) Attach(qp *verbs.QP) {
	if m.cfg.Limits != nil {
		qp.SetLimits(m.cfg.Limits)
	}
	m.mu.Lock()
	taken, refused := qp.SRQDemand()
	m.conns[qp] = &conn{qp: qp, lastTaken: taken, lastPaced: refused, demand: qp.SRQDemand}
	m.mu.Unlock()
}

// Detach stops tracking a connection; its demand leaves the target at the next Tick.
func (m *Manager) Detach(qp *verbs.QP) {
	m.mu.Lock()
	delete(m.conns, qp)
	m.mu.Unlock()
}

// Buffer returns the receive buffer a completion's WRID names, and false if the WRID is
// not one of the manager's buffers given to the SRQ and not yet released (another
// consumer's WRID, a released one, or any after Close).
func (m *Manager) Buffer(wrid uint64) ([]byte, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if wrid > math.MaxInt32 || !m.lent[int(wrid)] || m.closed {
		return nil, false
	}
	id := int(wrid)
	c := m.chunks[id/m.cfg.Chunk]
	i := id % m.cfg.Chunk
	return c.mr.Buf()[i*m.cfg.BufSize : (i+1)*m.cfg.BufSize], true
}

// Release gives a buffer back after its completion was handled: it is posted again while
// the SRQ is below target, and retired otherwise.
func (m *Manager) Release(wrid uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if wrid > math.MaxInt32 || !m.lent[int(wrid)] {
		return // not ours, or released twice
	}
	id := int(wrid)
	delete(m.lent, id)
	m.nlent--
	if m.cfg.SRQ.Posted() < m.target && !m.closed {
		if m.post(id) == nil {
			return
		}
	}
	m.free = append(m.free, id)
	m.chunks[id/m.cfg.Chunk].free++
}

// post posts buffer id to the SRQ (m.mu held); it stays lent until Release.
func (m *Manager) post(id int) error {
	c := m.chunks[id/m.cfg.Chunk]
	i := id % m.cfg.Chunk
	err := m.cfg.SRQ.PostSRQRecv([]verbs.RecvWR{{WRID: uint64(id), SGList: []verbs.SGE{c.mr.SGE(i*m.cfg.BufSize, m.cfg.BufSize)}}})
	if err != nil {
		return err
	}
	m.lent[id] = true
	m.nlent++
	return nil
}

// fill posts buffers until the SRQ holds the target, registering chunks as needed (m.mu
// held).
func (m *Manager) fill() error {
	need := m.target - m.cfg.SRQ.Posted()
	for need > 0 {
		if len(m.free) == 0 {
			if err := m.grow(); err != nil {
				return err
			}
		}
		id := m.free[len(m.free)-1]
		m.free = m.free[:len(m.free)-1]
		m.chunks[id/m.cfg.Chunk].free--
		if err := m.post(id); err != nil {
			m.free = append(m.free, id)
			m.chunks[id/m.cfg.Chunk].free++
			return err
		}
		need--
	}
	return nil
}

// grow registers one more chunk of buffers (m.mu held).
func (m *Manager) grow() error {
	ci := -1
	for i, c := range m.chunks {
		if c == nil {
			ci = i
			break
		}
	}
	if ci < 0 {
		ci = len(m.chunks)
		m.chunks = append(m.chunks, nil)
	}
	mr, err := m.cfg.PD.RegMR(make([]byte, m.cfg.Chunk*m.cfg.BufSize), verbs.AccessLocalWrite)
	if err != nil {
		return fmt.Errorf("srqmgr: register buffers: %w", err)
	}
	m.chunks[ci] = &chunk{mr: mr, free: m.cfg.Chunk}
	for i := m.cfg.Chunk - 1; i >= 0; i-- {
		m.free = append(m.free, ci*m.cfg.Chunk+i)
	}
	return nil
}

// shrink deregisters chunks whose buffers are all free while more than a chunk's worth
// of free buffers is idle (m.mu held).
func (m *Manager) shrink() {
	for i, c := range m.chunks {
		if len(m.free) <= 2*m.cfg.Chunk {
			return
		}
		if c == nil || c.free != m.cfg.Chunk {
			continue
		}
		if c.mr.DeregMR() != nil {
			continue
		}
		m.chunks[i] = nil
		kept := m.free[:0]
		for _, id := range m.free {
			if id/m.cfg.Chunk != i {
				kept = append(kept, id)
			}
		}
		m.free = kept
	}
}

// resize grows the SRQ when target does not fit (to twice its size or the target, within
// MaxDepth) and shrinks it when a quarter of it would do (to twice the target, within
// MinDepth, never below what is posted); it returns the size (m.mu held).
func (m *Manager) resize(target int) int {
	depth := m.cfg.SRQ.QuerySRQ().MaxWR
	want := depth
	switch {
	case target > depth && depth < m.cfg.MaxDepth:
		want = min(max(2*depth, target), m.cfg.MaxDepth)
	case 4*target < depth && depth > m.cfg.MinDepth:
		want = min(depth, max(2*target, m.cfg.MinDepth, m.cfg.SRQ.Posted()))
	}
	if want != depth && m.cfg.SRQ.ModifySRQ(&verbs.SRQAttr{MaxWR: want}, verbs.SRQAttrMaxWR) == nil {
		m.resizes++
		return want
	}
	return depth
}

// arm sets the SRQ's low watermark to a quarter of the target (m.mu held).
func (m *Manager) arm() {
	_ = m.cfg.SRQ.ModifySRQ(&verbs.SRQAttr{SRQLimit: max(1, m.target/4)}, verbs.SRQAttrLimit)
}

// Tick measures every connection's demand over the last interval, updates the target and
// the shares, and posts or retires buffers to follow it. The consumer's Release calls are
// not held up while the connections are sampled.
func (m *Manager) Tick() {
	m.tickMu.Lock()
	defer m.tickMu.Unlock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.sample = m.sample[:0]
	for _, c := range m.conns {
		m.sample = append(m.sample, c)
	}
	m.mu.Unlock()

	a := m.cfg.Alpha
	now := m.now()
	dt := m.cfg.Interval.Seconds()
	if !m.lastTick.IsZero() {
		dt = max(now.Sub(m.lastTick).Seconds(), 1e-6)
	}
	m.lastTick = now
	ewma(&m.gap, &m.gapVr, dt, a, m.gap == 0)
	m.gapPeak = max(dt, m.gapPeak*math.Exp2(-dt))
	var sumMean, sumVar float64
	for _, c := range m.sample {
		taken, refused := c.demand()
		r := float64(taken-c.lastTaken) / dt // WQEs per second since the last Tick
		c.lastTaken = taken
		// A connection its limit queue refused in this interval was taking more than the
		// consumer gave it: that is not demand it earns a larger share with.
		if refused != c.lastPaced && c.seen {
			r = min(r, c.mean)
		}
		c.lastPaced = refused
		ewma(&c.mean, &c.vr, r, a, !c.seen)
		c.seen = true
		sumMean += c.mean
		sumVar += c.vr
		c.qp.SetShare(c.mean + m.z*math.Sqrt(c.vr))
	}
	clear(m.sample) // drop references to detached QPs
	// The SRQ must last until the next refill: cover the gap between Ticks as measured
	// (mean plus z deviations, and the longest recent one: on a busy machine stalls are
	// rare and long), never less than the interval.
	cover := max(m.gap+m.z*math.Sqrt(m.gapVr), m.gapPeak, m.cfg.Interval.Seconds())

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	t := max(int(math.Ceil((sumMean+m.z*math.Sqrt(sumVar))*cover)), m.cfg.Floor)
	m.target = min(t, m.resize(t))
	if m.cfg.SRQ.Posted() < m.target {
		m.refills++
	}
	_ = m.fill()
	m.shrink()
	m.arm()
}

// Run calls Tick every interval until ctx is done or the manager is closed. Between Ticks
// it looks at the SRQ ten times an interval and refills it at once when it fell below a
// quarter of the target, so that the SRQ limit event need not be passed to HandleEvent.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	check := time.NewTicker(max(m.cfg.Interval/10, 100*time.Microsecond))
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.done:
			return
		case <-t.C:
			m.Tick()
		case <-check.C:
			m.refillLow()
		}
	}
}

// refillLow refills the SRQ to the target if it fell below a quarter of it.
func (m *Manager) refillLow() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed && m.cfg.SRQ.Posted() < max(1, m.target/4) {
		m.refills++
		_ = m.fill()
	}
}

// Start creates a manager for cfg and runs it (Run) until ctx is done or Close: the
// common path in one call. The consumer then hands each receive completion of the SRQ's
// QPs to Consume.
func Start(ctx context.Context, cfg Config) (*Manager, error) {
	m, err := New(cfg)
	if err != nil {
		return nil, err
	}
	go m.Run(ctx)
	return m, nil
}

// Consume handles a receive completion of one of the manager's buffers: for a successful
// one it calls fn with the message (the buffer's first wc.ByteLen bytes; fn must not keep
// it), then releases the buffer. It reports false if wc's WRID is not one of the
// manager's buffers given to the SRQ.
func (m *Manager) Consume(wc *verbs.WorkCompletion, fn func(msg []byte)) bool {
	buf, ok := m.Buffer(wc.WRID)
	if !ok {
		return false
	}
	if wc.Status == verbs.WCSuccess && fn != nil {
		fn(buf[:min(int(wc.ByteLen), len(buf))])
	}
	m.Release(wc.WRID)
	return true
}

// HandleEvent handles an asynchronous event if it is this SRQ's limit event (the SRQ fell
// below its low watermark): the SRQ is refilled to the target at once. It reports whether
// the event was this SRQ's.
func (m *Manager) HandleEvent(ev *verbs.AsyncEvent) bool {
	if ev == nil || ev.Type != verbs.EventSRQLimitReached || ev.SRQ != m.cfg.SRQ {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events++
	if !m.closed {
		m.refills++
		_ = m.fill()
		m.arm()
	}
	return true
}

// Summary returns the current provisioning without the per-connection figures: cheap
// enough to call often with thousands of connections.
func (m *Manager) Summary() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.summary()
}

func (m *Manager) summary() Stats {
	posted := m.cfg.SRQ.Posted()
	s := Stats{Target: m.target, Posted: posted, InUse: m.nlent - posted, Free: len(m.free), Refills: m.refills, LimitEvents: m.events,
		Depth: m.cfg.SRQ.QuerySRQ().MaxWR, Resizes: m.resizes}
	for _, c := range m.chunks {
		if c != nil {
			s.RegisteredBytes += int64(c.mr.Len())
		}
	}
	return s
}

// Stats returns the current provisioning and every connection's demand, share and limit
// queue usage.
func (m *Manager) Stats() Stats {
	m.tickMu.Lock()
	defer m.tickMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.summary()
	for _, c := range m.conns {
		sd := math.Sqrt(c.vr)
		s.Conns = append(s.Conns, ConnStats{QPNum: c.qp.QPNum(), Mean: c.mean, StdDev: sd, Share: c.mean + m.z*sd, Limits: c.qp.LimitStats()})
	}
	sort.Slice(s.Conns, func(i, j int) bool { return s.Conns[i].QPNum < s.Conns[j].QPNum })
	return s
}

// Close stops Run and deregisters the pool. The SRQ and its QPs must not be used to
// receive afterwards. Closing twice does nothing.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	close(m.done)
	var errs []error
	for i, c := range m.chunks {
		if c != nil {
			errs = append(errs, c.mr.DeregMR())
			m.chunks[i] = nil
		}
	}
	return errors.Join(errs...)
}
