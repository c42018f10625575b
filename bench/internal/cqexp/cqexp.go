// Package cqexp measures completion handlers: how completion-event throughput scales with
// the number of handlers when the consumers' work per completion is what limits it, and how
// well a high-priority handler's notification latency is isolated from another handler's
// flood. A client device sends requests to a server device (both in this process, on
// 127.0.0.1 and 127.0.0.2); the server's CQs are bound to its handlers, whose functions
// run the arm-then-drain loop, spend Work on each request and reply; the client's
// handler answers each reply with the next request, so every connection keeps
// Outstanding requests in flight.
package cqexp

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// Config describes a throughput run.
type Config struct {
	Handlers    int           // server completion handlers (default 1)
	Pin         bool          // pin server handler i to CPU i (mod the CPUs this process may use)
	QPs         int           // connections (default 32)
	CQs         int           // server CQs, spread over the handlers (default 8)
	Outstanding int           // requests in flight per connection (default 8)
	Work        time.Duration // server work per request (default 50 µs)
	MsgSize     int           // request and reply size (default 64)
	Duration    time.Duration // measured time (default 2 s)
}

func (c *Config) defaults() {
	if c.Handlers <= 0 {
		c.Handlers = 1
	}
	if c.QPs <= 0 {
		c.QPs = 32
	}
	if c.CQs <= 0 {
		c.CQs = 8
	}
	if c.Outstanding <= 0 {
		c.Outstanding = 8
	}
	if c.Work < 0 {
		c.Work = 0
	} else if c.Work == 0 {
		c.Work = 50 * time.Microsecond
	}
	if c.MsgSize <= 0 {
		c.MsgSize = 64
	}
	if c.Duration <= 0 {
		c.Duration = 2 * time.Second
	}
}

// Result is what a throughput run measured.
type Result struct {
	Config      Config
	Requests    uint64  // requests the server handled in the measured time
	Events      uint64  // handler calls on the server
	PerSecond   float64 // requests per second
	EventsPerS  float64 // handler calls per second
	PerHandler  []uint64
	Latency     []verbs.LatencySummary // per server handler: completion to handler call
	ClientCalls uint64
}

// busyPoll is the devices' receive busy-polling: off. The consumers here are event driven
// and CPU bound; a receive goroutine spinning between packets would take their CPU.
const busyPoll = -1

// rig is a client and a server device with connections between them.
type rig struct {
	cli, srv     *verbs.Device
	cpd, spd     *verbs.PD
	ccq          []*verbs.CQ // client CQs, one per connection group
	scq          []*verbs.CQ // server CQs
	cqps, sqps   []*verbs.QP
	cbuf, sbuf   *verbs.MR
	msg          int
	work         time.Duration
	handled      []paddedCounter // per server handler
	stop         atomic.Bool
	errOnce      sync.Once
	err          error
	cliQPOf      map[uint32]int
	srvQPOf      map[uint32]int
	pingConn     int      // the connection whose requests are pings: no work, no reply, no follow-up (-1: none)
	sendCount    []uint32 // per connection: sends posted (client), for periodic signaling
	srvSendCount []uint32
}

type paddedCounter struct {
	atomic.Uint64
	_ [56]byte
}

const (
	recvDepth   = 64
	sendDepth   = 128
	signalEvery = 16
)

func (r *rig) fail(err error) {
	r.errOnce.Do(func() { r.err = err })
	r.stop.Store(true)
}

func cpuOf(i int) int {
	return i % runtime.NumCPU()
}

// newRig opens the devices and connects nqp QPs; server CQ j (of ncq) is bound to handler
// bind(j).
func newRig(handlers []verbs.HandlerConfig, nqp, ncq int, bind func(cq int) int, msg int, work time.Duration) (*rig, error) {
	r := &rig{msg: msg, work: work, cliQPOf: map[uint32]int{}, srvQPOf: map[uint32]int{}, pingConn: -1}
	var err error
	if r.srv, err = verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr("127.0.0.2"), Port: verbs.AnyPort, Faults: &verbs.Faults{},
		CompletionHandlers: handlers, BusyPoll: busyPoll}); err != nil {
		return nil, err
	}
	if r.cli, err = verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr("127.0.0.1"), Port: verbs.AnyPort, Faults: &verbs.Faults{},
		NumCompVectors: 1, BusyPoll: busyPoll}); err != nil {
		r.close()
		return nil, err
	}
	r.handled = make([]paddedCounter, len(handlers))
	r.cpd, _ = r.cli.AllocPD()
	r.spd, _ = r.srv.AllocPD()
	if r.cbuf, err = r.cpd.RegMR(make([]byte, nqp*recvDepth*msg+msg), verbs.AccessLocalWrite); err != nil {
		r.close()
		return nil, err
	}
	if r.sbuf, err = r.spd.RegMR(make([]byte, nqp*recvDepth*msg+msg), verbs.AccessLocalWrite); err != nil {
		r.close()
		return nil, err
	}
	cqe := nqp*(recvDepth+sendDepth)/max(1, ncq) + 256
	for j := 0; j < ncq; j++ {
		cq, err := r.srv.CreateCQ(cqe, nil, bind(j))
		if err != nil {
			r.close()
			return nil, err
		}
		r.scq = append(r.scq, cq)
	}
	ccq, err := r.cli.CreateCQ(nqp*(recvDepth+sendDepth)+256, nil, 0)
	if err != nil {
		r.close()
		return nil, err
	}
	r.ccq = []*verbs.CQ{ccq}
	r.sendCount = make([]uint32, nqp)
	r.srvSendCount = make([]uint32, nqp)
	for i := 0; i < nqp; i++ {
		capa := verbs.QPCap{MaxSendWR: sendDepth, MaxRecvWR: recvDepth, MaxSendSGE: 1, MaxRecvSGE: 1}
		cq, err := r.cpd.CreateQP(&verbs.QPInitAttr{SendCQ: ccq, RecvCQ: ccq, Cap: capa})
		if err != nil {
			r.close()
			return nil, err
		}
		scq := r.scq[i%ncq]
		sq, err := r.spd.CreateQP(&verbs.QPInitAttr{SendCQ: scq, RecvCQ: scq, Cap: capa})
		if err != nil {
			r.close()
			return nil, err
		}
		o := verbs.ConnectOptions{MinRNRTimer: 1, RNRRetry: 7}
		epC, epS := cq.Endpoint(verbs.RandomPSN()), sq.Endpoint(verbs.RandomPSN())
		if err := cq.Connect(epC.PSN, epS, o); err != nil {
			r.close()
			return nil, err
		}
		if err := sq.Connect(epS.PSN, epC, o); err != nil {
			r.close()
			return nil, err
		}
		r.cqps, r.sqps = append(r.cqps, cq), append(r.sqps, sq)
		r.cliQPOf[cq.QPNum()], r.srvQPOf[sq.QPNum()] = i, i
		for k := 0; k < recvDepth; k++ {
			if err := cq.PostRecv([]verbs.RecvWR{{WRID: uint64(k), SGList: []verbs.SGE{r.slot(r.cbuf, i, k)}}}); err != nil {
				r.close()
				return nil, err
			}
			if err := sq.PostRecv([]verbs.RecvWR{{WRID: uint64(k), SGList: []verbs.SGE{r.slot(r.sbuf, i, k)}}}); err != nil {
				r.close()
				return nil, err
			}
		}
	}
	return r, nil
}

func (r *rig) slot(mr *verbs.MR, qp, k int) verbs.SGE {
	return mr.SGE((qp*recvDepth+k)*r.msg, r.msg)
}

func (r *rig) close() {
	r.stop.Store(true)
	if r.cli != nil {
		r.cli.Close()
	}
	if r.srv != nil {
		r.srv.Close()
	}
}

// send posts one message on qp, signaled every signalEvery-th so the send queue is reaped.
func (r *rig) send(qp *verbs.QP, count *uint32, mr *verbs.MR) error {
	return r.sendBurst(qp, count, mr, 1)
}

// sendBurst posts n messages on qp in one PostSend. The count is only touched before the
// post: a reply to these messages can make the client's handler send on qp (and count) as
// soon as they leave, and the post is what orders the two.
func (r *rig) sendBurst(qp *verbs.QP, count *uint32, mr *verbs.MR, n int) error {
	wrs := make([]verbs.SendWR, n)
	for k := range wrs {
		*count++
		f := verbs.SendFlags(0)
		if *count%signalEvery == 0 {
			f = verbs.SendSignaled
		}
		wrs[k] = verbs.SendWR{Opcode: verbs.WRSend, SendFlags: f, SGList: []verbs.SGE{mr.SGE(mr.Len()-r.msg, r.msg)}}
	}
	return qp.PostSend(wrs)
}

// budget is how many completions a handler function handles per call before it lets the
// handler's other CQs have their turn.
const budget = 16

// drainLoop is the arm-then-drain loop every handler function here runs: it calls each
// for every completion until the CQ is empty and armed, or, after budget completions,
// schedules the CQ's next event behind the handler's other CQs.
func drainLoop(cq *verbs.CQ, wc []verbs.WorkCompletion, each func(w *verbs.WorkCompletion) error, flush func() error) error {
	for done := 0; ; {
		if done >= budget {
			return cq.ScheduleEvent()
		}
		n := cq.PollCQ(wc[:min(len(wc), budget-done)])
		done += n
		if n == 0 {
			if err := cq.ReqNotifyCQ(false); err != nil {
				return err
			}
			if n = cq.PollCQ(wc); n == 0 {
				return nil
			}
		}
		for i := range wc[:n] {
			if err := each(&wc[i]); err != nil {
				return err
			}
		}
		if err := flush(); err != nil {
			return err
		}
	}
}

// sender batches the messages a handler function sends: one PostSend per connection per
// polled batch of completions, not one per message.
type sender struct {
	r       *rig
	qps     []*verbs.QP
	counts  []uint32
	mr      *verbs.MR
	pending []int // messages to send, per connection
	touched []int
	wrs     []verbs.SendWR
	sges    []verbs.SGE
}

func (r *rig) newSender(qps []*verbs.QP, counts []uint32, mr *verbs.MR) *sender {
	return &sender{r: r, qps: qps, counts: counts, mr: mr, pending: make([]int, len(qps)), sges: []verbs.SGE{mr.SGE(mr.Len()-r.msg, r.msg)}}
}

func (s *sender) add(i int) {
	if s.pending[i] == 0 {
		s.touched = append(s.touched, i)
	}
	s.pending[i]++
}

func (s *sender) flush() error {
	for _, i := range s.touched {
		s.wrs = s.wrs[:0]
		for k := 0; k < s.pending[i]; k++ {
			s.counts[i]++
			f := verbs.SendFlags(0)
			if s.counts[i]%signalEvery == 0 {
				f = verbs.SendSignaled
			}
			s.wrs = append(s.wrs, verbs.SendWR{Opcode: verbs.WRSend, SendFlags: f, SGList: s.sges})
		}
		s.pending[i] = 0
		if err := s.qps[i].PostSend(s.wrs); err != nil {
			return err
		}
	}
	s.touched = s.touched[:0]
	return nil
}

// spin spends d of CPU time: the consumer's work on a request.
func spin(d time.Duration, buf []byte) byte {
	var x byte
	for t0 := time.Now(); time.Since(t0) < d; {
		for _, b := range buf {
			x += b
		}
	}
	return x
}

// serverFn is the server handlers' function: each request costs work, then gets a reply.
func (r *rig) serverFn(wcs [][]verbs.WorkCompletion) verbs.CompletionHandlerFunc {
	senders := make([]*sender, len(wcs))
	for h := range senders {
		senders[h] = r.newSender(r.sqps, r.srvSendCount, r.sbuf)
	}
	return func(h int, cq *verbs.CQ) {
		snd := senders[h]
		if r.stop.Load() {
			return
		}
		err := drainLoop(cq, wcs[h], func(w *verbs.WorkCompletion) error {
			if w.Status != verbs.WCSuccess {
				if r.stop.Load() {
					return nil
				}
				return fmt.Errorf("server completion %v", w.Status)
			}
			if w.Opcode != verbs.WCRecv {
				return nil
			}
			i := r.srvQPOf[w.QPNum]
			if i == r.pingConn {
				return r.sqps[i].PostRecv([]verbs.RecvWR{{WRID: w.WRID, SGList: []verbs.SGE{r.slot(r.sbuf, i, int(w.WRID))}}})
			}
			if r.work > 0 {
				spin(r.work, r.sbuf.Buf()[(i*recvDepth+int(w.WRID))*r.msg:][:r.msg])
			}
			r.handled[h].Add(1)
			if err := r.sqps[i].PostRecv([]verbs.RecvWR{{WRID: w.WRID, SGList: []verbs.SGE{r.slot(r.sbuf, i, int(w.WRID))}}}); err != nil {
				return err
			}
			snd.add(i)
			return nil
		}, snd.flush)
		if err != nil && !r.stop.Load() {
			r.fail(err)
		}
	}
}

// clientFn answers each reply with the next request.
func (r *rig) clientFn() verbs.CompletionHandlerFunc {
	wc := make([]verbs.WorkCompletion, 64)
	snd := r.newSender(r.cqps, r.sendCount, r.cbuf)
	return func(h int, cq *verbs.CQ) {
		if r.stop.Load() {
			return
		}
		err := drainLoop(cq, wc, func(w *verbs.WorkCompletion) error {
			if w.Status != verbs.WCSuccess {
				if r.stop.Load() {
					return nil
				}
				return fmt.Errorf("client completion %v", w.Status)
			}
			if w.Opcode != verbs.WCRecv {
				return nil
			}
			i := r.cliQPOf[w.QPNum]
			if err := r.cqps[i].PostRecv([]verbs.RecvWR{{WRID: w.WRID, SGList: []verbs.SGE{r.slot(r.cbuf, i, int(w.WRID))}}}); err != nil {
				return err
			}
			if !r.stop.Load() {
				snd.add(i)
			}
			return nil
		}, snd.flush)
		if err != nil && !r.stop.Load() {
			r.fail(err)
		}
	}
}

// start registers the functions, arms every CQ and posts the first requests.
func (r *rig) start(nh int, outstanding int, qps []int) error {
	wcs := make([][]verbs.WorkCompletion, nh)
	for h := range wcs {
		wcs[h] = make([]verbs.WorkCompletion, 64)
	}
	for h := 0; h < nh; h++ {
		if err := r.srv.SetCompletionHandler(h, r.serverFn(wcs)); err != nil {
			return err
		}
	}
	if err := r.cli.SetCompletionHandler(0, r.clientFn()); err != nil {
		return err
	}
	for _, cq := range append(append([]*verbs.CQ(nil), r.scq...), r.ccq...) {
		if err := cq.ReqNotifyCQ(false); err != nil {
			return err
		}
	}
	for _, i := range qps {
		if err := r.sendBurst(r.cqps[i], &r.sendCount[i], r.cbuf, outstanding); err != nil {
			return err
		}
	}
	return nil
}

func (r *rig) total() uint64 {
	var t uint64
	for i := range r.handled {
		t += r.handled[i].Load()
	}
	return t
}

// Throughput runs the closed-loop request/reply load and measures what the server's
// handlers handle.
func Throughput(cfg Config) (Result, error) {
	cfg.defaults()
	hc := make([]verbs.HandlerConfig, cfg.Handlers)
	if cfg.Pin {
		for i := range hc {
			hc[i].CPUs = []int{cpuOf(i)}
		}
	}
	r, err := newRig(hc, cfg.QPs, cfg.CQs, func(j int) int { return j % cfg.Handlers }, cfg.MsgSize, cfg.Work)
	if err != nil {
		return Result{}, err
	}
	defer r.close()
	all := make([]int, cfg.QPs)
	for i := range all {
		all[i] = i
	}
	if err := r.start(cfg.Handlers, cfg.Outstanding, all); err != nil {
		return Result{}, err
	}
	time.Sleep(200 * time.Millisecond) // warm up
	per0 := make([]uint64, cfg.Handlers)
	for h := range per0 {
		per0[h] = r.handled[h].Load()
		_ = r.srv.ResetHandlerStats(h)
	}
	c0, _ := r.cli.HandlerStats(0)
	t0 := time.Now()
	time.Sleep(cfg.Duration)
	el := time.Since(t0).Seconds()
	res := Result{Config: cfg}
	for h := 0; h < cfg.Handlers; h++ {
		n := r.handled[h].Load() - per0[h]
		res.PerHandler = append(res.PerHandler, n)
		res.Requests += n
		st, _ := r.srv.HandlerStats(h)
		res.Events += st.Calls
		res.Latency = append(res.Latency, st.Latency)
	}
	c1, _ := r.cli.HandlerStats(0)
	res.ClientCalls = c1.Calls - c0.Calls
	r.stop.Store(true)
	if r.err != nil {
		return res, r.err
	}
	res.PerSecond = float64(res.Requests) / el
	res.EventsPerS = float64(res.Events) / el
	return res, nil
}

// IsolationConfig describes an isolation run: a flood of requests on CQs bound to handler
// 0 (priority 0) while pings arrive on a CQ bound to handler 1 (priority 1).
type IsolationConfig struct {
	// CPUs are the two handlers' CPU sets (nil: unpinned). Both on one CPU makes the
	// priorities decide between them there, and leaves the other CPUs to the network.
	CPUs        [2][]int
	RealTime    bool          // run the ping handler under SCHED_FIFO
	FloodQPs    int           // default 32
	Outstanding int           // flood requests in flight per connection (default 8)
	Work        time.Duration // server work per flood request (default 50 µs)
	PingEvery   time.Duration // default 500 µs
	Duration    time.Duration // per phase (default 2 s)
}

// IsolationResult compares handler 1's notification latency without and with the flood.
type IsolationResult struct {
	Config         IsolationConfig
	Idle, Flooded  verbs.LatencySummary
	FloodPerSecond float64 // flood requests handled per second in the flooded phase
	// PingsSkipped counts ping ticks that found the ping connection's send queue full
	// (its completions not yet reaped: a machine busy with other work); they are skipped,
	// as a probe at a fixed rate skips a tick it missed.
	PingsSkipped int
}

// Isolation measures the ping handler's notification latency idle, then under the flood.
func Isolation(cfg IsolationConfig) (IsolationResult, error) {
	if cfg.FloodQPs <= 0 {
		cfg.FloodQPs = 32
	}
	if cfg.Outstanding <= 0 {
		cfg.Outstanding = 8
	}
	if cfg.Work == 0 {
		cfg.Work = 50 * time.Microsecond
	}
	if cfg.PingEvery <= 0 {
		cfg.PingEvery = 500 * time.Microsecond
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 2 * time.Second
	}
	hc := []verbs.HandlerConfig{{Priority: 0, CPUs: cfg.CPUs[0]}, {Priority: 1, CPUs: cfg.CPUs[1], RealTime: cfg.RealTime}}
	// Connection 0 is the ping connection, on CQ 0 (handler 1); the others flood CQs 1..4
	// (handler 0).
	nq := cfg.FloodQPs + 1
	r, err := newRig(hc, nq, 5, func(j int) int {
		if j == 0 {
			return 1
		}
		return 0
	}, 64, cfg.Work)
	if err != nil {
		return IsolationResult{}, err
	}
	defer r.close()
	// Connection i uses server CQ i%5; those that share CQ 0 with the pings (5, 10, ...)
	// stay idle.
	r.pingConn = 0
	var flood []int
	for i := 1; i < nq; i++ {
		if i%5 != 0 {
			flood = append(flood, i)
		}
	}
	if err := r.start(2, 0, nil); err != nil {
		return IsolationResult{}, err
	}
	res := IsolationResult{Config: cfg}
	ping := func(d time.Duration) (verbs.LatencySummary, error) {
		_ = r.srv.ResetHandlerStats(1)
		var count uint32
		end := time.Now().Add(d)
		for next := time.Now(); time.Now().Before(end); next = next.Add(cfg.PingEvery) {
			if w := time.Until(next); w > 0 {
				time.Sleep(w)
			} else if -w > cfg.PingEvery {
				// Late by more than a tick (the process was not scheduled): go on from now
				// rather than send the missed pings in a burst.
				next = time.Now()
			}
			if err := r.send(r.cqps[0], &count, r.cbuf); err != nil {
				if errors.Is(err, verbs.ErrLimit) {
					count-- // not sent
					res.PingsSkipped++
					continue
				}
				return verbs.LatencySummary{}, err
			}
			if r.err != nil {
				return verbs.LatencySummary{}, r.err
			}
		}
		st, _ := r.srv.HandlerStats(1)
		return st.Latency, nil
	}
	if res.Idle, err = ping(cfg.Duration); err != nil {
		return res, err
	}
	for _, i := range flood {
		if err := r.sendBurst(r.cqps[i], &r.sendCount[i], r.cbuf, cfg.Outstanding); err != nil {
			return res, err
		}
	}
	time.Sleep(200 * time.Millisecond)
	n0 := r.total()
	t0 := time.Now()
	if res.Flooded, err = ping(cfg.Duration); err != nil {
		return res, err
	}
	res.FloodPerSecond = float64(r.total()-n0) / time.Since(t0).Seconds()
	r.stop.Store(true)
	if r.err != nil && !errors.Is(r.err, verbs.ErrClosed) {
		return res, r.err
	}
	return res, nil
}
