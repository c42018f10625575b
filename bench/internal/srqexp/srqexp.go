// Package srqexp is the shared-receive-queue experiment: many RC connections into one
// device under a skewed load (a few hot connections sending at a steady rate, the rest
// idle and sending now and then), received either through one SRQ provisioned
// statistically (package srqmgr) or through a receive queue per QP sized for the peak any
// connection may need. It reports the registered receive memory each needs, the share of
// messages refused with RNR NAKs, and, with a hostile connection that floods past its
// limits, how fast it is stopped and what throughput the others keep.
package srqexp

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/srqmgr"
	"github.com/softrnic/softrnic/verbs"
)

// Mode is how the server receives.
type Mode int

// Modes.
const (
	SharedSRQ Mode = iota // one SRQ, provisioned by srqmgr, with per-QP limit queues
	PerQPRQ               // a receive queue per QP, PeakDepth deep
)

func (m Mode) String() string {
	if m == PerQPRQ {
		return "per-QP RQs"
	}
	return "statistical SRQ"
}

// Config describes one run.
type Config struct {
	Conns     int           // connections
	Hot       int           // hot connections (default max(2, Conns/100))
	HotLoad   float64       // messages per second the hot connections send together (default 10,000)
	Mode      Mode          //
	MsgSize   int           // bytes per message (default 256)
	BufSize   int           // receive buffer size (default 1024)
	PeakDepth int           // receive WQEs a connection may need at its peak: the per-QP queue depth (default 32)
	IdleRate  float64       // messages per second per idle connection (default 0.5)
	Duration  time.Duration // measured time (default 2 s; with Hostile, per phase)
	Warmup    time.Duration // load run before the measured time, not counted (default 500 ms)
	Work      time.Duration // the server's processing time per message (default 10 µs)
	Hostile   bool          // add a connection that floods, in a second phase
	NoLimits  bool          // run the hostile phase without limit queues (to compare)
}

// Result is what a run measured.
type Result struct {
	Config          Config
	Messages        uint64  // messages delivered in the measured phase (the baseline)
	RNRNAKs         uint64  // RNR NAKs the server sent (excluding the hostile's)
	RNRRate         float64 // RNR NAKs per message
	WarmupRNRNAKs   uint64  // RNR NAKs while the load stepped up from idle (Warmup)
	RegisteredBytes int64   // peak receive memory registered (baseline phase)
	Target, Posted  int     // SRQ provisioning at the end (shared mode)
	HotOffered      float64 // messages per second the hot connections offered, together
	HotDelivered    float64 // delivered (baseline phase)
	// With Hostile: the others' delivered rate while the hostile floods, the time from its
	// first message to the limit queue's response (drop, or the first RNR), and what it
	// got through.
	HotDeliveredHostile float64
	HostileStopped      time.Duration
	HostileDelivered    uint64
	HostileDecision     string
	RegisteredHostile   int64 // peak receive memory registered while the hostile floods
	// The most SRQ entries the hostile held at once (sampled every few milliseconds), and
	// how many of its packets its limit queue refused.
	HostilePeakHeld uint64
	HostileRefused  uint64
	// CQOverflow: the server's shared CQ overflowed (completions were lost; the CQ error
	// event was raised), which a flood without limit queues can cause.
	CQOverflow bool
}

func (c *Config) defaults() {
	if c.Hot <= 0 {
		c.Hot = max(2, c.Conns/100)
	}
	if c.MsgSize <= 0 {
		c.MsgSize = 256
	}
	if c.BufSize <= 0 {
		c.BufSize = 1024
	}
	if c.PeakDepth <= 0 {
		c.PeakDepth = 32
	}
	if c.HotLoad <= 0 {
		c.HotLoad = 10000
	}
	if c.IdleRate <= 0 {
		c.IdleRate = 0.5
	}
	if c.Duration <= 0 {
		c.Duration = 2 * time.Second
	}
	if c.Warmup <= 0 {
		c.Warmup = 500 * time.Millisecond
	}
	if c.Work <= 0 {
		c.Work = 10 * time.Microsecond
	}
}

type exp struct {
	cfg            Config
	cli, srv       *verbs.Device
	cpd, spd       *verbs.PD
	ccq, scq       *verbs.CQ
	srq            *verbs.SRQ
	mgr            *srqmgr.Manager
	cqps, sqps     []*verbs.QP    // client, server (index = connection)
	qpIndex        map[uint32]int // server QPN → connection
	cidx           map[uint32]int // client QPN → connection
	src            *verbs.MR
	rqMRs          []*verbs.MR // per-QP mode: each QP's buffers
	delivered      []atomic.Uint64
	outstanding    []int // client: sends posted, not completed
	regPeak        atomic.Int64
	hostile        int // connection index of the hostile, or -1
	hostileFirstAt atomic.Int64
	stopped        atomic.Int64 // ns after the hostile's first message when it was stopped
	hostilePeak    atomic.Uint64
	cqOverflow     atomic.Bool
	decision       atomic.Value
}

// Run runs the experiment.
func Run(cfg Config) (Result, error) {
	cfg.defaults()
	if cfg.Conns < cfg.Hot || cfg.Conns < 1 {
		return Result{}, errors.New("srqexp: need at least as many connections as hot ones")
	}
	e := &exp{cfg: cfg, hostile: -1, qpIndex: map[uint32]int{}}
	defer e.close()
	if err := e.setup(); err != nil {
		return Result{}, err
	}
	res := Result{Config: cfg}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); e.serve(ctx) }()
	if e.mgr != nil {
		wg.Add(2)
		go func() { defer wg.Done(); e.mgr.Run(ctx) }()
		go func() { defer wg.Done(); e.events(ctx) }()
	}
	// Warm up: the connections were idle while they were set up, and the load steps from
	// nothing to HotLoad at once. How many RNR NAKs that step costs is reported apart
	// from the measured phase (the provisioner's step response, not its steady state).
	rnrW := e.srv.Counters().RNRNAKsSent
	if _, err := e.drive(cfg.Warmup, false); err != nil {
		cancel()
		wg.Wait()
		return Result{}, err
	}
	rnr0, m0 := e.srv.Counters().RNRNAKsSent, e.total()
	res.WarmupRNRNAKs = rnr0 - rnrW
	base, err := e.drive(cfg.Duration, false)
	if err != nil {
		cancel()
		wg.Wait()
		return Result{}, err
	}
	res.HotOffered, res.HotDelivered = base.offered, base.delivered
	res.RNRNAKs = e.srv.Counters().RNRNAKsSent - rnr0
	res.Messages = e.total() - m0
	res.RegisteredBytes = e.regPeak.Swap(0)
	if cfg.Hostile {
		e.hostile = cfg.Conns // the extra connection
		hphase, err := e.drive(cfg.Duration, true)
		if err != nil {
			cancel()
			wg.Wait()
			return Result{}, err
		}
		res.HotDeliveredHostile = hphase.delivered
		res.HostileDelivered = e.delivered[e.hostile].Load()
		if s := e.stopped.Load(); s > 0 {
			res.HostileStopped = time.Duration(s)
		}
		if d, ok := e.decision.Load().(string); ok {
			res.HostileDecision = d
		}
		res.RegisteredHostile = e.regPeak.Load()
		res.HostilePeakHeld = e.hostilePeak.Load()
		_, res.HostileRefused = e.sqps[e.hostile].SRQDemand()
	}
	cancel()
	wg.Wait()
	res.CQOverflow = e.cqOverflow.Load()
	if res.Messages > 0 {
		res.RNRRate = float64(res.RNRNAKs) / float64(res.Messages)
	}
	if e.mgr != nil {
		s := e.mgr.Summary()
		res.Target, res.Posted = s.Target, s.Posted
	}
	return res, nil
}

func (e *exp) setup() error {
	c := &e.cfg
	var err error
	open := func(ip string) (*verbs.Device, *verbs.PD, *verbs.CQ, error) {
		ctx, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr(ip), Port: verbs.AnyPort, Faults: &verbs.Faults{}})
		if err != nil {
			return nil, nil, nil, err
		}
		pd, _ := ctx.AllocPD()
		cq, err := ctx.CreateCQ(min(1<<20, 64*(c.Conns+1)+4096), nil, 0)
		return ctx, pd, cq, err
	}
	if e.cli, e.cpd, e.ccq, err = open("127.0.0.1"); err != nil {
		return err
	}
	if e.srv, e.spd, e.scq, err = open("127.0.0.2"); err != nil {
		return err
	}
	if e.src, err = e.cpd.RegMR(make([]byte, c.MsgSize), verbs.AccessLocalWrite); err != nil {
		return err
	}
	n := c.Conns
	if c.Hostile {
		n++
	}
	e.delivered = make([]atomic.Uint64, n)
	e.outstanding = make([]int, n)
	if c.Mode == SharedSRQ {
		if e.srq, err = e.spd.CreateSRQ(&verbs.SRQInitAttr{MaxWR: 16384, MaxSGE: 1}); err != nil {
			return err
		}
		mc := srqmgr.Config{SRQ: e.srq, PD: e.spd, BufSize: c.BufSize, Floor: 64, Chunk: 64}
		if !c.NoLimits {
			// Far above what a normal connection holds; a flood reaches them.
			l := &verbs.LimitConfig{OnHard: verbs.HardDrop}
			l.Limits[verbs.LimitSRQHeld] = verbs.Limit{Soft: 32, Hard: 256}
			mc.Limits = l
		}
		if e.mgr, err = srqmgr.New(mc); err != nil {
			return err
		}
	}
	for i := 0; i < n; i++ {
		if err := e.connect(i); err != nil {
			return fmt.Errorf("srqexp: connection %d: %w", i, err)
		}
	}
	e.notePeak()
	return nil
}

func (e *exp) connect(i int) error {
	c := &e.cfg
	sendWR := 16
	if i == c.Conns { // the hostile keeps many in flight
		sendWR = 256
	}
	cq, err := e.cpd.CreateQP(&verbs.QPInitAttr{SendCQ: e.ccq, RecvCQ: e.ccq, Cap: verbs.QPCap{MaxSendWR: sendWR, MaxRecvWR: 1, MaxSendSGE: 1}})
	if err != nil {
		return err
	}
	ia := &verbs.QPInitAttr{SendCQ: e.scq, RecvCQ: e.scq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: c.PeakDepth, MaxRecvSGE: 1}}
	if e.srq != nil {
		ia.SRQ = e.srq
	}
	sq, err := e.spd.CreateQP(ia)
	if err != nil {
		return err
	}
	o := verbs.ConnectOptions{Timeout: 14, RNRRetry: 7, MinRNRTimer: 1}
	epC, epS := cq.Endpoint(verbs.RandomPSN()), sq.Endpoint(verbs.RandomPSN())
	if err := cq.Connect(epC.PSN, epS, o); err != nil {
		return err
	}
	if err := sq.Connect(epS.PSN, epC, o); err != nil {
		return err
	}
	e.cqps, e.sqps = append(e.cqps, cq), append(e.sqps, sq)
	e.qpIndex[sq.QPNum()] = i
	if e.mgr != nil {
		e.mgr.Attach(sq)
		return nil
	}
	// A receive queue of its own, full, with registered buffers.
	mr, err := e.spd.RegMR(make([]byte, c.PeakDepth*c.BufSize), verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	e.rqMRs = append(e.rqMRs, mr)
	for k := 0; k < c.PeakDepth; k++ {
		if err := sq.PostRecv([]verbs.RecvWR{{WRID: uint64(k), SGList: []verbs.SGE{mr.SGE(k*c.BufSize, c.BufSize)}}}); err != nil {
			return err
		}
	}
	return nil
}

// notePeak records the receive memory registered now.
func (e *exp) notePeak() {
	var b int64
	if e.mgr != nil {
		b = e.mgr.Summary().RegisteredBytes
	} else {
		for _, mr := range e.rqMRs {
			b += int64(mr.Len())
		}
	}
	for {
		old := e.regPeak.Load()
		if b <= old || e.regPeak.CompareAndSwap(old, b) {
			return
		}
	}
}

// serve is the server's consumer: it polls the CQ, spends Work on each message, and gives
// the buffer back.
func (e *exp) serve(ctx context.Context) {
	wc := make([]verbs.WorkCompletion, 64)
	sink := byte(0)
	lastPeak := time.Now()
	for ctx.Err() == nil {
		n := e.scq.PollCQ(wc)
		if n == 0 {
			runtime.Gosched()
		}
		for _, w := range wc[:n] {
			i, ok := e.qpIndex[w.QPNum]
			if !ok || w.Status != verbs.WCSuccess {
				if ok && i == e.hostile {
					e.markStopped("dropped")
				}
				if w.Status != verbs.WCWRFlushErr && w.Status != verbs.WCSuccess {
					continue
				}
				if !ok || w.Opcode != verbs.WCRecv {
					continue
				}
			}
			var buf []byte
			if e.mgr != nil {
				var ok bool
				if buf, ok = e.mgr.Buffer(w.WRID); !ok {
					continue // not a buffer of the manager's: nothing to read or release
				}
			} else {
				buf = e.rqMRs[i].Buf()[int(w.WRID)*e.cfg.BufSize:]
			}
			if w.Status == verbs.WCSuccess {
				e.delivered[i].Add(1)
				for t0 := time.Now(); time.Since(t0) < e.cfg.Work; {
					sink += buf[0]
				}
			}
			if e.mgr != nil {
				e.mgr.Release(w.WRID)
			} else if w.Status == verbs.WCSuccess {
				_ = e.sqps[i].PostRecv([]verbs.RecvWR{{WRID: w.WRID, SGList: []verbs.SGE{e.rqMRs[i].SGE(int(w.WRID)*e.cfg.BufSize, e.cfg.BufSize)}}})
			}
		}
		if time.Since(lastPeak) > 5*time.Millisecond {
			e.notePeak()
			lastPeak = time.Now()
			if h := e.hostile; h >= 0 && e.mgr != nil {
				ls := e.sqps[h].LimitStats()
				if ls.Decisions[verbs.DecideHardRNR]+ls.Decisions[verbs.DecidePace] > 0 {
					e.markStopped("throttled")
				}
				if held := ls.Taken - ls.Polled; held > e.hostilePeak.Load() {
					e.hostilePeak.Store(held)
				}
			}
		}
	}
	_ = sink
}

// events handles the server's asynchronous events as they come, as a verbs program's
// event thread does: the SRQ's limit event refills it at once.
func (e *exp) events(ctx context.Context) {
	for {
		ev, err := e.srv.GetAsyncEvent(ctx)
		if err != nil {
			return
		}
		e.mgr.HandleEvent(ev)
		switch {
		case ev.Type == verbs.EventCQErr:
			e.cqOverflow.Store(true)
		case ev.Type == verbs.EventQPFatal && ev.QP != nil:
			if i, ok := e.qpIndex[ev.QP.QPNum()]; ok && i == e.hostile {
				e.markStopped("dropped")
			}
		}
		e.srv.AckAsyncEvent(ev)
	}
}

// total is the number of messages delivered so far.
func (e *exp) total() uint64 {
	var n uint64
	for i := range e.delivered {
		n += e.delivered[i].Load()
	}
	return n
}

func (e *exp) markStopped(how string) {
	first := e.hostileFirstAt.Load()
	if first == 0 || e.stopped.Load() != 0 {
		return
	}
	e.stopped.Store(max(time.Now().UnixNano()-first, 1))
	e.decision.Store(how)
}

type phase struct{ offered, delivered float64 }

// drive runs the client for d: hot connections at HotRate, idle ones at IdleRate (at
// random), and, with hostile, the hostile connection as fast as it can. It returns the hot
// connections' offered and delivered rates.
func (e *exp) drive(d time.Duration, hostile bool) (phase, error) {
	c := &e.cfg
	rng := rand.New(rand.NewPCG(uint64(d), 7))
	sge := []verbs.SGE{e.src.SGE(0, c.MsgSize)}
	wr := []verbs.SendWR{{Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge}}
	var d0 uint64
	for i := 0; i < c.Hot; i++ {
		d0 += e.delivered[i].Load()
	}
	next := make([]time.Time, c.Conns) // next send time per connection
	start := time.Now()
	for i := range next {
		rate := c.IdleRate
		if i < c.Hot {
			rate = c.HotLoad / float64(c.Hot)
		}
		next[i] = start.Add(time.Duration(rng.ExpFloat64() / rate * 1e9))
	}
	offered := 0
	wc := make([]verbs.WorkCompletion, 256)
	hostileUp := true
	if hostile {
		e.hostileFirstAt.Store(time.Now().UnixNano())
	}
	for now := time.Now(); now.Sub(start) < d; now = time.Now() {
		for i := range next {
			for !next[i].After(now) {
				rate := c.IdleRate
				if i < c.Hot {
					rate = c.HotLoad / float64(c.Hot)
					offered++
				}
				if e.outstanding[i] < 16 {
					if err := e.cqps[i].PostSend(wr); err == nil {
						e.outstanding[i]++
					}
				}
				next[i] = next[i].Add(time.Duration(rng.ExpFloat64() / rate * 1e9))
			}
		}
		if hostile && hostileUp {
			h := e.hostile
			for e.outstanding[h] < 256 {
				if err := e.cqps[h].PostSend(wr); err != nil {
					hostileUp = false // its QP errored: dropped
					break
				}
				e.outstanding[h]++
			}
		}
		e.pollClient(wc)
		runtime.Gosched()
	}
	el := time.Since(start).Seconds()
	// Let what is in flight land before counting.
	settle := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(settle) {
		e.pollClient(wc)
		runtime.Gosched()
	}
	var d1 uint64
	for i := 0; i < c.Hot; i++ {
		d1 += e.delivered[i].Load()
	}
	return phase{offered: float64(offered) / el, delivered: float64(d1-d0) / el}, nil
}

// pollClient reaps the client's send completions.
func (e *exp) pollClient(wc []verbs.WorkCompletion) {
	for {
		n := e.ccq.PollCQ(wc)
		for _, w := range wc[:n] {
			if i, ok := e.clientIndex(w.QPNum); ok {
				e.outstanding[i]--
			}
		}
		if n < len(wc) {
			return
		}
	}
}

func (e *exp) clientIndex(qpn uint32) (int, bool) {
	if e.cidx == nil {
		e.cidx = map[uint32]int{}
		for i, q := range e.cqps {
			e.cidx[q.QPNum()] = i
		}
	}
	i, ok := e.cidx[qpn]
	return i, ok
}

func (e *exp) close() {
	if e.mgr != nil {
		e.mgr.Close()
	}
	if e.cli != nil {
		e.cli.Close()
	}
	if e.srv != nil {
		e.srv.Close()
	}
}
