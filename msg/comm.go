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

// Comm is one rank of a job (MPI_COMM_WORLD as this rank sees it): its device, its
// connections to the other ranks (made on first use), and the progress engine that moves
// all of them. Init makes it; Close ends it.
//
// Every method may be called from any goroutine. Operations progress in the goroutine
// that waits for them (as MPI libraries progress in the caller's thread), and in a
// progress goroutine of the rank's own while no caller waits, so that connections keep
// moving between calls.
type Comm struct {
	// Locking: the progress lock (pmu) guards the connection state, the rings, the
	// matching queues and the requests. Whoever holds it progresses (round): an API call
	// that starts an operation, a Wait that polls for its request (no hand-off between
	// goroutines on the way to a completion), or the progress goroutine, which sleeps on
	// the CQ's completion channel while no caller polls. Goroutines that must not wait
	// for the lock (the CM's answers, the listener) hand work over with submit, under mu.

	cfg  Config
	rank int
	size int
	job  uint64
	mtu  verbs.MTU // the connections' path MTU (pathMTU)
	// rvStop ends rank 0's rendezvous, which refuses late reports until Close.
	rvStop func()
	book   []netip.AddrPort

	dev *verbs.Device
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
	lab        LabStats // what experiments on the enlargement measure
	wcs        []verbs.WorkCompletion
	srqOwed    int // SRQ receives consumed and not yet put back
	recvWRs    []verbs.RecvWR
	transfers  int // rendezvous transfers under way (a Wait keeps polling while data moves)

	spin    time.Duration // how long a Wait polls after the last progress before it sleeps
	collSeq int           // collectives called so far (the caller's goroutine; collectives are not concurrent)
}

// Init starts this rank: it opens the device, finds the other ranks through the
// rendezvous at cfg.Root (rank 0 serves it), and starts listening for connections.
// Connections are made on first use (a rank talks to few of a large job's ranks; 1,000
// peers cost nothing until used). With cfg.Size 0 it reads the launcher's environment;
// a program run without a launcher is a job of one rank (Rank 0, Size 1), as an MPI
// program run without mpirun is, whose sends to itself and collectives work.
func Init(ctx context.Context, cfg Config) (*Comm, error) {
	if cfg.Size == 0 {
		if err := fromEnvOrAlone(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("msg: Init: %w: rank %d of a job of %d ranks", ErrInvalid, cfg.Rank, cfg.Size)
	}
	if cfg.Size > 1 && cfg.Root == "" {
		return nil, fmt.Errorf("msg: Init: %w: Config.Root (host:port of rank 0's rendezvous) is empty in a job of %d ranks", ErrInvalid, cfg.Size)
	}
	if !cfg.Addr.IsValid() && cfg.Size > 1 {
		cfg.Addr = addrTowards(cfg.Root)
	}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if !cfg.KeepGOMAXPROCS && os.Getenv("GOMAXPROCS") == "" {
		if n := cpuShare(runtime.NumCPU(), onlineCPUs(), cfg.LocalSize, cfg.CPUs); n > 0 {
			runtime.GOMAXPROCS(n)
		}
	}
	dc := cfg.Device
	dc.Addr, dc.Port = cfg.Addr, verbs.AnyPort
	dev, err := verbs.OpenDevice(dc)
	if err != nil {
		return nil, fmt.Errorf("msg: rank %d: %w", cfg.Rank, err)
	}
	c := &Comm{cfg: cfg, rank: cfg.Rank, size: cfg.Size, dev: dev, wake: make(chan struct{}, 1), cqEv: make(chan struct{}, 1),
		done: make(chan struct{}), byQPN: map[uint32]*peer{}, peers: make([]*peer, cfg.Size)}
	c.mtu = pathMTU(dev)
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
	rv := &rendezvous{rank: cfg.Rank, size: cfg.Size, job: cfg.Job, root: cfg.Root, dev: dev.Addr(), timeout: cfg.RendezvousTimeout}
	if c.book, c.job, c.rvStop, err = rv.exchange(ctx, job); err != nil {
		return fail(err)
	}
	c.pool.init(c)
	go c.events()
	go c.accept()
	go c.run()
	return c, nil
}

// ended reports whether the connection (nil: none yet) has ended: its peer disconnected,
// died or restarted, and what is in flight on it will not be acknowledged.
func ended(cn *cm.Conn) bool {
	if cn == nil {
		return false
	}
	select {
	case <-cn.Done():
		return true
	default:
		return false
	}
}

// Rank is this rank's number, Size the job's.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in the job.
func (c *Comm) Size() int { return c.size }

// Job is the job's identity (Config.Job, from the launcher): "" if none was known.
func (c *Comm) Job() string { return c.cfg.Job }

// Device is the rank's device.
func (c *Comm) Device() *verbs.Device { return c.dev }

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
//
// Close waits for two things, each bounded, so that a dead rank does not hold it up:
// sends already handed to a live connection, to finish (at most 5 s, and no longer than
// the connection lasts: the QP's own retries or the keep-alive end a dead peer's), and
// the peers' answers to its DisconnectRequests (at most one keep-alive period,
// cm.DefaultKeepAlive: 1 s). A rank that died with nothing in flight to it costs one
// keep-alive period; CloseContext bounds the whole wait by a context.
func (c *Comm) Close() error { return c.CloseContext(context.Background()) }

// CloseContext is Close with its waits (see Close) also ended when ctx is done: the rank
// is closed all the same (connections ended, device closed, requests failed), and the
// error is ctx's, wrapped. A second Close or CloseContext waits, until its own ctx is
// done, for the first one to finish.
func (c *Comm) CloseContext(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		select {
		case <-c.done:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("msg: Close: %w", ctx.Err())
		}
	}
	c.closed = true
	c.mu.Unlock()
	c.rvStop()
	c.pmu.Lock()
	c.runOps() // handed over before Close: nothing is added now
	c.stopping = true
	c.shutdown(ctx)
	c.down = true
	c.pmu.Unlock()
	c.kick()
	<-c.done
	err := c.dev.Close()
	if ctx.Err() != nil {
		return fmt.Errorf("msg: Close: %w", ctx.Err())
	}
	return err
}

// drainFor bounds how long Close waits for sends in flight.
const drainFor = 5 * time.Second

// shutdown fails what is pending and disconnects (progress lock held, last). Sends
// already handed to a connection are let finish first (bounded by drainFor and ctx, and
// no longer than the connection is up): an eager send completes when its data was
// copied, so a rank that returns from its last send and closes must not take the data
// down with its QP. The wait for the peers' DisconnectReplies is bounded by one
// keep-alive period and ctx.
func (c *Comm) shutdown(ctx context.Context) {
	c.lis.Close()
	for deadline := time.Now().Add(drainFor); time.Now().Before(deadline) && ctx.Err() == nil; {
		busy := false
		for _, p := range c.peers {
			if p != nil && p.state == psUp && (p.sqUsed > 0 || len(p.sendQ) > 0) && !ended(p.conn) {
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
	dctx, cancel := context.WithTimeout(ctx, cm.DefaultKeepAlive)
	defer cancel()
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
				cn.DisconnectContext(dctx)
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
