package msg

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// servicePort is the connection manager port every rank listens on.
const servicePort = 18600

// Comm is one rank of a job: its device, its connections to the other ranks (made on
// first use), and the progress engine that moves all of them.
//
// Every method may be called from any goroutine. Locking: the progress lock (pmu) guards
// the connection state, the rings, the matching queues and the requests. Whoever holds it
// progresses (round): an API call that starts an operation, a Wait that polls for its
// request (in the caller's goroutine, as MPI libraries progress in the caller's thread:
// no hand-off between goroutines on the way to a completion), or the progress goroutine,
// which sleeps on the CQ's completion channel while no caller polls and keeps
// connections moving between calls. Goroutines that must not wait for the lock (the CM's
// answers, the listener) hand work over with submit, under mu.
type Comm struct {
	cfg  Config
	rank int
	size int
	job  uint64
	book []netip.AddrPort

	dev *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
	ch  *verbs.CompChannel
	srq *verbs.SRQ
	lis *cm.Listener

	mu     sync.Mutex
	ops    []func() // guarded by mu
	closed bool     // guarded by mu
	wake   chan struct{}
	cqEv   chan struct{}
	done   chan struct{} // the progress goroutine ended

	// spinners counts the Waits polling for their request: while there are any, the
	// progress goroutine sleeps without asking for completion events.
	spinners atomic.Int32

	pmu sync.Mutex // the progress lock: everything below

	peers      []*peer
	byQPN      map[uint32]*peer
	active     []*peer // peers with something to send
	spare      []*peer // the other list, while pump walks one
	posted     []*Request
	unexpected []*inMsg
	probes     []*probe
	regs       regCache
	pool       bufPool
	nextID     uint64
	nonce      uint32
	stopping   bool // shutdown began: nothing is posted to the SRQ any more
	down       bool // shutdown ended: every call fails with ErrClosed
	stats      Stats
	wcs        []verbs.WorkCompletion
	srqOwed    int // SRQ receives consumed and not yet put back
	recvWRs    []verbs.RecvWR
	transfers  int // rendezvous transfers under way (a Wait keeps polling while data moves)

	spin    time.Duration // how long a Wait polls after the last progress before it sleeps
	collSeq int           // collectives called so far (the caller's goroutine; collectives are not concurrent)
}

// Stats counts what a rank's connections did.
type Stats struct {
	EagerSent, EagerReceived   uint64
	RendezvousSent, Rendezvous uint64 // rendezvous sends, and receives (the sender RDMA-WRITEs into the receive buffer)
	Enlargements               uint64 // control messages sent asking a peer for a larger ring
	EnlargementsServed         uint64 // rings enlarged at a peer's request
	AckResends                 uint64 // acknowledgements asked for again
	AckPartialSeen             uint64 // polls that found a partial acknowledgement
	ZeroByteReports            uint64 // times the send routine reported 0 bytes transferred
	PrefixSends                uint64 // vectors whose prefix went before a larger element
	CreditMessages             uint64
	Connections                uint64
	// LastEnlargement is where the time of the rank's last enlargement went, in each of
	// its two roles.
	LastEnlargement EnlargementTimes
}

// EnlargementTimes times the steps of an enlargement (seed 004's Figures 3, 4 and 6), as
// the rank saw them. Zero where the rank has not had that role yet.
type EnlargementTimes struct {
	// The sender's: from writing the control message (its post included) to reading a
	// complete acknowledgement (a round trip, with the receiver's Serve and AckPost in
	// it); its own provisioning (Figure 4: the small staging buffers unregistered, the
	// large ones registered); and from writing the control message to the return of the
	// first post through the larger slots.
	AckWait, Provision, ToFirstSend time.Duration
	// The receiver's: its provisioning (Figure 6: the small ring unregistered, the large
	// one registered), and the acknowledgement's post (the WRITE with immediate).
	Serve, AckPost time.Duration
}

// Init starts this rank: it opens the device, finds the other ranks through the
// rendezvous at cfg.Root (rank 0 serves it), and starts listening for connections.
// Connections are made on first use (a rank talks to few of a large job's ranks; 1,000
// peers cost nothing until used). With cfg.Size 0 it reads the launcher's environment.
func Init(ctx context.Context, cfg Config) (*Comm, error) {
	if cfg.Size == 0 {
		if err := FromEnv(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("msg: rank %d of %d", cfg.Rank, cfg.Size)
	}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if cfg.LocalSize > 1 && !cfg.KeepGOMAXPROCS && os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(max(1, runtime.NumCPU()/cfg.LocalSize))
	}
	dc := cfg.Device
	dc.Addr, dc.Port = cfg.Addr, verbs.AnyPort
	dev, err := verbs.OpenDevice(dc)
	if err != nil {
		return nil, fmt.Errorf("msg: rank %d: %w", cfg.Rank, err)
	}
	c := &Comm{cfg: cfg, rank: cfg.Rank, size: cfg.Size, dev: dev, wake: make(chan struct{}, 1), cqEv: make(chan struct{}, 1),
		done: make(chan struct{}), byQPN: map[uint32]*peer{}, peers: make([]*peer, cfg.Size)}
	c.regs.init(c)
	c.wcs = make([]verbs.WorkCompletion, 64)
	c.recvWRs = make([]verbs.RecvWR, cfg.SRQDepth) // zero-length: a WRITE with immediate takes one
	local := cfg.LocalSize
	if local == 0 {
		local = cfg.Size
	}
	if local <= runtime.NumCPU() {
		c.spin = spinFor // oversubscribed ranks do not spin (as MPI libraries yield when idle)
	}
	fail := func(err error) (*Comm, error) {
		dev.Close()
		return nil, err
	}
	var seed [12]byte
	crand.Read(seed[:])
	job := binary.LittleEndian.Uint64(seed[:])
	c.nonce = binary.LittleEndian.Uint32(seed[8:])
	if c.pd, err = dev.AllocPD(); err != nil {
		return fail(err)
	}
	if c.ch, err = dev.CreateCompChannel(); err != nil {
		return fail(err)
	}
	if c.cq, err = dev.CreateCQ(cfg.CQDepth, c.ch, verbs.NoHandler); err != nil {
		return fail(err)
	}
	if c.srq, err = c.pd.CreateSRQ(&verbs.SRQInitAttr{MaxWR: cfg.SRQDepth, MaxSGE: 1}); err != nil {
		return fail(err)
	}
	if err := c.srq.PostSRQRecv(c.recvWRs); err != nil {
		return fail(err)
	}
	if c.lis, err = cm.Listen(dev, servicePort); err != nil {
		return fail(err)
	}
	if c.book, c.job, err = exchange(ctx, cfg.Rank, cfg.Size, cfg.Root, dev.Addr(), job); err != nil {
		return fail(err)
	}
	c.pool.init(c)
	go c.events()
	go c.accept()
	go c.run()
	return c, nil
}

// Rank is this rank's number, Size the job's.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in the job.
func (c *Comm) Size() int { return c.size }

// Device is the rank's device.
func (c *Comm) Device() *verbs.Context { return c.dev }

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

// peer returns the state of rank r, creating it (its QP and first rings) on first use.
func (c *Comm) peer(r int) (*peer, error) {
	if p := c.peers[r]; p != nil {
		return p, nil
	}
	p, err := newPeer(c, r)
	if err != nil {
		return nil, err
	}
	c.peers[r] = p
	if p.qp != nil { // not this rank itself
		c.byQPN[p.qp.QPNum()] = p
	}
	return p, nil
}

// Close ends this rank: its connections are disconnected (their peers' requests on them
// fail), its device closed; every request still pending ends with ErrClosed. Call it
// after a Barrier so that no rank closes while others still talk to it.
func (c *Comm) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.done
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.pmu.Lock()
	c.runOps() // handed over before Close: nothing is added now
	c.stopping = true
	c.shutdown()
	c.down = true
	c.pmu.Unlock()
	c.kick()
	<-c.done
	return c.dev.Close()
}

// drainFor bounds how long Close waits for sends in flight.
const drainFor = 5 * time.Second

// spinnerCheck is how often the progress goroutine looks whether callers still poll.
const spinnerCheck = time.Millisecond

// spinFor is how long a Wait polls, after the last progress, before it sleeps.
const spinFor = 200 * time.Microsecond

// shutdown fails what is pending and disconnects (progress lock held, last). Sends
// already handed to a connection are let finish first (bounded): an eager send completes
// when its data was copied, so a rank that returns from its last send and closes must
// not take the data down with its QP.
func (c *Comm) shutdown() {
	c.lis.Close()
	for deadline := time.Now().Add(drainFor); time.Now().Before(deadline); {
		busy := false
		for _, p := range c.peers {
			if p != nil && p.state == psUp && (p.sqUsed > 0 || len(p.sendQ) > 0) {
				busy = true
				p.progress()
			}
		}
		if !busy {
			break
		}
		c.pollCQ()
		runtime.Gosched()
	}
	var wg sync.WaitGroup
	for _, p := range c.peers {
		if p == nil {
			continue
		}
		p.fail(ErrClosed)
		if p.conn != nil {
			wg.Add(1)
			go func(cn *cm.Conn) {
				defer wg.Done()
				cn.Disconnect()
			}(p.conn)
		}
	}
	for _, r := range c.posted {
		r.complete(ErrClosed)
	}
	c.posted = nil
	for _, pr := range c.probes {
		pr.gone = true
		pr.fire()
	}
	wg.Wait()
}

// Isend starts sending buf to rank dest with tag (MPI_Isend). buf must not change until
// the request is done.
func (c *Comm) Isend(buf []byte, dest, tag int) *Request {
	return c.isend(buf, dest, tag, 0)
}

func (c *Comm) isend(buf []byte, dest, tag int, ctxID uint8) *Request {
	r := new(Request)
	c.sendInto(r, buf, dest, tag, ctxID)
	return r
}

// sendInto starts a send with request r.
func (c *Comm) sendInto(r *Request, buf []byte, dest, tag int, ctxID uint8) {
	*r = Request{c: c, sig: r.sig, send: true, buf: buf, peer: dest, tag: tag, ctx: ctxID} // a pooled request keeps its wake channel
	if dest < 0 || dest >= c.size || tag < 0 {
		r.complete(fmt.Errorf("msg: Isend to rank %d of %d with tag %d: invalid", dest, c.size, tag))
		return
	}
	c.start(r)
}

// Irecv starts receiving into buf a message from source (or AnySource) with tag (or
// AnyTag) (MPI_Irecv).
func (c *Comm) Irecv(buf []byte, source, tag int) *Request {
	return c.irecv(buf, source, tag, 0)
}

func (c *Comm) irecv(buf []byte, source, tag int, ctxID uint8) *Request {
	r := new(Request)
	c.recvInto(r, buf, source, tag, ctxID)
	return r
}

// recvInto starts a receive with request r.
func (c *Comm) recvInto(r *Request, buf []byte, source, tag int, ctxID uint8) {
	*r = Request{c: c, sig: r.sig, buf: buf, peer: source, tag: tag, ctx: ctxID}
	if source < AnySource || source >= c.size || tag < AnyTag {
		r.complete(fmt.Errorf("msg: Irecv from rank %d of %d with tag %d: invalid", source, c.size, tag))
		return
	}
	c.start(r)
}

// start hands a new request to the progress engine: a send is queued and posted at once,
// a receive matched or posted; after Close it fails.
func (c *Comm) start(r *Request) {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	switch {
	case c.down:
		r.complete(ErrClosed)
	case r.send:
		c.startSend(r)
		c.pump() // post it now
	default:
		c.postRecv(r)
	}
}

// Send sends buf to dest with tag and returns when buf may be reused (MPI_Send).
func (c *Comm) Send(ctx context.Context, buf []byte, dest, tag int) error {
	r := reqPool.Get().(*Request)
	c.sendInto(r, buf, dest, tag, 0)
	_, err := r.Wait(ctx)
	r.release()
	return err
}

// Recv receives a message into buf (MPI_Recv).
func (c *Comm) Recv(ctx context.Context, buf []byte, source, tag int) (Status, error) {
	r := reqPool.Get().(*Request)
	c.recvInto(r, buf, source, tag, 0)
	st, err := r.Wait(ctx)
	r.release()
	return st, err
}

// startSend queues a send to its peer (progress lock held).
func (c *Comm) startSend(r *Request) {
	p, err := c.peer(r.peer)
	if err != nil {
		r.complete(err)
		return
	}
	if p.err != nil {
		r.complete(p.err)
		return
	}
	if r.peer == c.rank {
		c.sendSelf(r)
		return
	}
	p.sendQ.push(outMsg{kind: kindData, req: r})
	if len(r.buf) > c.cfg.threshold(len(c.cfg.Phases)-1) {
		p.sendQ[len(p.sendQ)-1].kind = kindRTS
	}
	p.connect()
	c.activate(p)
}

// cancel ends r with err if it has not started (progress lock held).
func (c *Comm) cancel(r *Request, err error) {
	if r.started {
		return
	}
	if r.send {
		if p := c.peers[r.peer]; p != nil {
			for i, m := range p.sendQ {
				if m.req == r {
					p.sendQ.remove(i)
					r.complete(err)
					return
				}
			}
		}
		return
	}
	for i, q := range c.posted {
		if q == r {
			c.posted = append(c.posted[:i], c.posted[i+1:]...)
			r.complete(err)
			return
		}
	}
}
