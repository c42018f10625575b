package transport

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/internal/lockrank"
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/pcap"
	"github.com/softrnic/softrnic/internal/ptab"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// Config configures a device engine.
type Config struct {
	// Local is the device's IP address and UDP port (port 0: ephemeral).
	Local netip.AddrPort
	// MTU is the port's active MTU (wire.MTU256..MTU4096; 0: MTU4096): a UD message's
	// size limit. The verbs layer keeps RC path MTUs at or below it.
	MTU uint8
	// Faults and FaultFilter are applied to outgoing datagrams (see netio).
	Faults      netio.Faults
	FaultFilter netio.FilterFunc
	// Tap, if set, receives every packet the device sends and receives, as a link would
	// carry it (see tap.go).
	Tap *pcap.Writer
	// SourcePorts is how many more UDP sockets the device sends from (see sourceFor).
	SourcePorts int
	// SocketBuffer, DisableGSO and DisableGRO tune the socket (see netio.Config).
	SocketBuffer           int
	DisableGSO, DisableGRO bool
	// MaxQP and MaxMR bound the number of queue pairs and memory regions.
	MaxQP, MaxMR int
	// Window is the most packets a QP's requester keeps in flight (default 1024): PSNs past
	// the oldest unacknowledged one in ordered mode, unacknowledged packets in weak mode
	// (whose PSNs stay within its hole span, Attr.MaxHole). A QP's window opens from
	// BaseWindow (or Window, if smaller) and closes to it again at every loss (see
	// requester.openWindow); it opens no further than the socket's receive buffer holds (a
	// packet per 8 KiB).
	Window int
	// AckReqEvery sets AckReq on every n-th packet of a long message besides its last
	// (default: a quarter of the QP's window, at least 64).
	AckReqEvery int
	// ReadChunk is the most response packets one RDMA READ request asks for; longer READ
	// work requests are sent as several requests (default 64).
	ReadChunk int
	// RecvBatch is the number of datagrams per recvmmsg (default 32).
	RecvBatch int
	// ReorderThreshold is how many packets sent after a packet must be acknowledged before
	// weak mode declares it lost (default 16). Reordering by fewer packets costs no
	// retransmission.
	ReorderThreshold int
	// LossProbe is weak mode's loss probe: packets still unacknowledged this long after
	// they were sent are sent again (default 4 ms, doubling while nothing is acknowledged;
	// negative: off, leaving it to the ACK timeout). It consumes no retries.
	LossProbe time.Duration
	// BusyPoll is how long the receive goroutine keeps polling the socket after the last
	// packet it received before it sleeps in the network poller (default 50 µs; negative:
	// never). Waking a sleeping goroutine (and an idle CPU) costs several microseconds per
	// packet; while traffic flows, polling avoids that.
	BusyPoll time.Duration
	// Queues is the number of receive queues, each a socket bound to Local with
	// SO_REUSEPORT and its own goroutines, the kernel steering each packet to the queue of
	// its destination QP (default DefaultQueues(); 1 where steering is not available).
	Queues int
	// AckGroup is shared by devices whose pollers flush each other's held-back ACKs: a
	// consumer polling one device must not leave the peers of another device it also
	// drives waiting for their delayed ACKs. nil: the device is a group of its own.
	AckGroup *AckGroup
}

// Device is one software RNIC: a UDP socket, its QPs, memory regions and timers.
type Device struct {
	cfg   Config
	conn  *netio.Conn
	local netip.AddrPort
	v4    bool
	tap   *tap // its writer is nil when the device has no tap
	epoch time.Time
	bare  *bareIO // a device without sockets (the role tests'); nil when opened on sockets

	mrs *tpt.Table

	qpMu    mutex
	qps     ptab.Table[QP]
	qpSet   map[*QP]struct{}
	qpns    *ptab.Allocator // draws QP numbers (QP0 and QP1 reserved)
	qpCount int
	retired Stats // counters of destroyed QPs

	// winBase and winMax bound a QP's window (see requester.openWindow).
	winBase, winMax int32

	// queues are the device's receive queues (see queue); a QP lives on queues[qpn %
	// len(queues)], where the kernel steers its packets.
	queues []*queue

	atomicMu mutex // serialises remote atomic operations (ATOMIC_HCA semantics)

	batches batchList // send batches for transmit from goroutines other than a queue's

	// acks is the set of devices whose held-back ACKs a goroutine polling this device
	// also flushes (Config.AckGroup; a group of its own if none was given).
	acks *AckGroup

	// OnEvent receives asynchronous events. It is called with engine locks held and must
	// only queue the event.
	OnEvent func(Event)
	// OnQPError, if set, is told when a QP enters the error state on a failure of its own
	// (not a ModifyQP): status is the completion status of the work request that failed
	// (StatusWRFlushErr when the failure was the responder's, which raised an event too).
	// It is called with engine locks held and must only queue the report.
	OnQPError func(q *QP, status uint8)
	// OnUnreachable, if set, receives the reports that the host of a UD datagram's
	// destination dst answered it with ICMP port unreachable (Linux; see unreach.go):
	// destQP is the datagram's destination QP and payload what the report quotes of its
	// payload (possibly cut short), valid during the call. Reports are hints anyone can
	// forge: the receiver checks them against what it sent. It is called from a receive
	// path with engine locks held and must only queue the report.
	OnUnreachable func(dst netip.AddrPort, destQP uint32, payload []byte)

	closed atomic.Bool
	wg     sync.WaitGroup
}

type rxStats struct {
	packets, bytes, icrc, malformed, unknownQP, pkey, misrouted uint64
	direct                                                      uint64 // WRITE packets placed as verified (queue.placeDirect)
}

// Defaults.
const (
	DefaultWindow = 1024
	// BaseWindow is where a QP's window starts, and where it goes back at a loss (see
	// Config.Window).
	BaseWindow         = 128
	DefaultAckReqEvery = 64
	DefaultReadChunk   = 64
	DefaultMaxQP       = 65536
	DefaultMaxMR       = 1 << 20
	DefaultBusyPoll    = 50 * time.Microsecond
	// DefaultReorderThreshold is Config.ReorderThreshold's default.
	DefaultReorderThreshold = 16
	// DefaultLossProbe is Config.LossProbe's default.
	DefaultLossProbe = 4 * time.Millisecond
	outPkts          = 256
	outIovs          = 2048
	outArena         = outPkts * 96
	outReserve       = 4 // packets kept free for ACKs/NAKs generated under a QP lock
	// respBudget is the most READ response packets one QP sends per round of the receive
	// path (256 KiB at MTU 4096): a QP answering long READs shares the device with the
	// others' packets and ACKs, round by round, as a NIC arbitrates between its QPs.
	respBudget = 64
)

// Open creates the device and starts its receive and timer goroutines.
func Open(cfg Config) (*Device, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	tp := &tap{w: cfg.Tap}
	nc := netio.Config{
		Local: cfg.Local, SocketBuffer: cfg.SocketBuffer, DisableGSO: cfg.DisableGSO,
		DisableGRO: cfg.DisableGRO, Faults: cfg.Faults, FaultFilter: cfg.FaultFilter,
		SegmentID:   new(wire.Segmenter).Fix, // segment i of a GSO send carries IPv4 identification i
		SourcePorts: cfg.SourcePorts,
	}
	if cfg.Tap != nil {
		nc.Tap = tp.sent
	}
	var d *Device // set before the receive goroutines start, which call this
	nc.Unreachable = func(dst netip.AddrPort, quote []byte) { d.portUnreachable(dst, quote) }
	queues := cfg.Queues
	if queues <= 0 {
		queues = DefaultQueues()
	}
	if queues > MaxQueues {
		return nil, fmt.Errorf("transport: %d receive queues, at most %d", queues, MaxQueues)
	}
	if !netio.CanSteer {
		queues = 1
	}
	if queues > 1 {
		// The port must be free, not another reuse-port group's (see netio.CheckPort).
		local, err := netio.CheckPort(nc.Local)
		if err != nil {
			return nil, err
		}
		nc.Local, nc.ReusePort = local, true
	}
	conn, err := netio.Listen(nc)
	if err != nil {
		return nil, err
	}
	conns := []*netio.Conn{conn}
	if queues > 1 {
		for len(conns) < queues && err == nil {
			var c *netio.Conn
			// An ICMP report may reach any socket of the group (the kernel picks one by the
			// flow's hash, as for a datagram).
			c, err = netio.Listen(netio.Config{Local: conn.LocalAddr(), ReusePort: true, SocketBuffer: cfg.SocketBuffer,
				DisableGSO: cfg.DisableGSO, DisableGRO: cfg.DisableGRO, Unreachable: nc.Unreachable})
			if err == nil {
				conns = append(conns, c)
			}
		}
		if err == nil {
			err = conn.SteerByQP(queues)
		}
		if err != nil {
			// No steering here (a kernel before 4.5): one queue, as a NIC without RSS.
			for _, c := range conns {
				c.Close()
			}
			cfg.Queues = 1
			return Open(cfg)
		}
	}
	cfg.Queues = queues
	tp.local = conn.LocalAddr()
	// The window opens no further than the receive buffer holds, a packet per 8 KiB (the
	// kernel charges a 4 KiB packet about that much).
	rcv, _ := conn.SocketBuffers()
	d = newDevice(cfg, conns, tp, rcv/8192)
	for _, u := range d.queues {
		d.wg.Add(2)
		go u.rxLoop()
		go u.timers.run()
	}
	return d, nil
}

// withDefaults returns cfg with every value left at zero set to its default, or an error
// for a value out of range.
func (cfg Config) withDefaults() (Config, error) {
	if wire.MTUBytes(cfg.MTU) == 0 {
		cfg.MTU = wire.MTU4096
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Window > 1<<22 {
		return cfg, errors.New("transport: window larger than 2^22 PSNs")
	}
	if cfg.AckReqEvery < 0 {
		cfg.AckReqEvery = 0
	}
	if cfg.ReadChunk <= 0 {
		cfg.ReadChunk = DefaultReadChunk
	}
	if cfg.ReadChunk > min(cfg.Window, BaseWindow) {
		cfg.ReadChunk = min(cfg.Window, BaseWindow) // a READ request fits in the smallest window
	}
	if cfg.MaxQP <= 0 {
		cfg.MaxQP = DefaultMaxQP
	}
	cfg.MaxQP = min(cfg.MaxQP, ptab.Size-ptab.Quarantine-2) // the allocator needs room
	if cfg.MaxMR <= 0 {
		cfg.MaxMR = DefaultMaxMR
	}
	if cfg.RecvBatch <= 0 {
		cfg.RecvBatch = 32
	}
	if cfg.BusyPoll == 0 {
		cfg.BusyPoll = DefaultBusyPoll
	}
	if cfg.ReorderThreshold <= 0 {
		cfg.ReorderThreshold = DefaultReorderThreshold
	}
	if cfg.LossProbe == 0 {
		cfg.LossProbe = DefaultLossProbe
	}
	return cfg, nil
}

// newDevice builds the device on its receive queues' sockets, conns (one queue each),
// bound to tp.local, with its tap tp; its window opens to at most maxWindow packets (what
// the socket's receive buffer holds). It starts no goroutine.
func newDevice(cfg Config, conns []*netio.Conn, tp *tap, maxWindow int) *Device {
	wire.PrepareIdentification()
	winBase := int32(min(cfg.Window, BaseWindow))
	d := &Device{
		winBase: winBase,
		winMax:  max(winBase, int32(min(cfg.Window, maxWindow))),
		cfg:     cfg,
		conn:    conns[0],
		local:   tp.local,
		v4:      tp.local.Addr().Is4(),
		tap:     tp,
		epoch:   time.Now(),
		mrs:     tpt.New(cfg.MaxMR),
		qpSet:   make(map[*QP]struct{}),
		qpns:    ptab.NewAllocator(2, true), // QP0 and QP1 are reserved
	}
	d.qpMu.Rank, d.atomicMu.Rank = lockrank.QPTable, lockrank.Atomic
	d.batches.init()
	if d.acks = cfg.AckGroup; d.acks == nil {
		d.acks = NewAckGroup()
	}
	for i, c := range conns {
		u := &queue{d: d, idx: i, conn: c, rxMu: mutex{Rank: lockrank.Rx}}
		u.rxBatch = c.NewRecvBatch(cfg.RecvBatch, 4096+256)
		u.rxOut = netio.NewSendBatch(outPkts, outIovs, outArena)
		u.timers.init(u)
		d.queues = append(d.queues, u)
		d.acks.join(u)
	}
	return d
}

// MaxQueues is the most receive queues a device has (a CQ keeps the queues of its QPs as
// bits of a word).
const MaxQueues = 64

// DefaultQueues is Config.Queues's default: one receive queue for every two processors the
// process runs on (GOMAXPROCS: one for the queue's goroutine, one for the application's),
// at most 8. A second queue without a processor to drain it only splits the receive
// batches (8 QPs between two processes of one processor each: about 0.93 x one queue).
func DefaultQueues() int { return max(1, min(runtime.GOMAXPROCS(0)/2, 8)) }

// Close stops the device. QPs stop moving packets; it does not flush them.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	for _, u := range d.queues {
		u.timers.stop()
	}
	// ACKs held back for messages already completed here go out before the sockets close
	// (see QP.Destroy): a program that closes the device without destroying its QPs
	// first must not leave its peer's last messages unacknowledged.
	for _, u := range d.queues {
		u.rxMu.Lock()
		u.flushDeferred()
		u.rxMu.Unlock()
	}
	var err error
	if d.bare == nil { // a device without sockets has none to close
		err = d.conn.Close()
		for _, u := range d.queues[1:] {
			u.conn.Close()
		}
	}
	d.wg.Wait()
	// After the receive goroutines: one still running could hold ACKs back again.
	for _, u := range d.queues {
		d.acks.leave(u)
	}
	return err
}

// Quiesce waits until the receive path has finished what it was doing when Quiesce was
// called. Deregistration calls it after revoking a region: no access on behalf of a peer
// that checked the region before it was revoked is still running when it returns (see the
// package doc). It must not be called with a QP's lock or the receive path held.
func (d *Device) Quiesce() {
	for _, u := range d.queues {
		u.rxMu.Lock()
		u.quiesced++
		u.rxMu.Unlock()
	}
}

// RequestYield asks the receive goroutines to yield their processor after the batch they
// are processing: a completion handler was woken and should run without waiting for them
// to go idle.
func (d *Device) RequestYield() {
	for _, u := range d.queues {
		u.yieldReq.Store(true)
	}
}

// Queues returns the number of receive queues.
func (d *Device) Queues() int { return len(d.queues) }

// Closed reports whether Close was called.
func (d *Device) Closed() bool { return d.closed.Load() }

// LocalAddr returns the device's address and UDP port.
func (d *Device) LocalAddr() netip.AddrPort { return d.local }

// MRs returns the device's translation and protection table.
func (d *Device) MRs() *tpt.Table { return d.mrs }

// Config returns the effective configuration.
func (d *Device) Config() Config { return d.cfg }

// Conn returns the device's socket (for its counters).
func (d *Device) Conn() *netio.Conn { return d.conn }

// QPCount returns the number of QPs.
func (d *Device) QPCount() int {
	d.qpMu.Lock()
	defer d.qpMu.Unlock()
	return d.qpCount
}

// now returns the device time: nanoseconds since the device was opened (a device without
// sockets: its test's clock).
func (d *Device) now() int64 {
	if d.bare != nil {
		return d.bare.clock
	}
	return int64(time.Since(d.epoch))
}

func (d *Device) raise(e Event) {
	if h := d.OnEvent; h != nil {
		h(e)
	}
}

// lookupQP finds a live QP by number.
func (d *Device) lookupQP(qpn uint32) *QP {
	q := d.qps.Load(qpn)
	if q == nil || q.qpn != qpn {
		return nil
	}
	return q
}

// allocQPN assigns a free QP number, drawn so that it cannot be predicted from the numbers
// before it and a destroyed QP's number is not reused soon (see ptab.Allocator).
func (d *Device) allocQPN(q *QP) error {
	d.qpMu.Lock()
	defer d.qpMu.Unlock()
	if d.qpCount >= d.cfg.MaxQP {
		return fmt.Errorf("device has its maximum of %d QPs", d.cfg.MaxQP)
	}
	// The QP goes to the queue with the fewest QPs: its number is drawn among those the
	// kernel steers there (log2 of the queue count fewer unpredictable bits).
	home := d.queues[0]
	for _, u := range d.queues[1:] {
		if u.qps < home.qps {
			home = u
		}
	}
	n := d.qpns.Alloc(d.qpCount, func(i uint32) bool { return d.qps.Load(i) != nil || d.queueOf(i) != home })
	q.qpn = n
	q.home = home
	home.qps++
	d.qps.Store(n, q)
	d.qpSet[q] = struct{}{}
	d.qpCount++
	return nil
}

// queueOf returns the receive queue QP qpn lives on: the socket the kernel steers its
// packets to (netio.SteerByQP).
func (d *Device) queueOf(qpn uint32) *queue { return d.queues[qpn%uint32(len(d.queues))] }

// GSIQPN is the QP number of the general services interface (QP1).
const GSIQPN = 1

// claimGSI makes q the device's QP1.
func (d *Device) claimGSI(q *QP) error {
	d.qpMu.Lock()
	defer d.qpMu.Unlock()
	if d.qps.Load(GSIQPN) != nil {
		return errors.New("the device already has its GSI QP")
	}
	q.qpn = GSIQPN
	q.home = d.queueOf(GSIQPN)
	d.qps.Store(GSIQPN, q)
	d.qpSet[q] = struct{}{}
	return nil
}

func (d *Device) freeQPN(q *QP) {
	d.qpMu.Lock()
	if d.qps.Load(q.qpn) == q {
		d.qps.Store(q.qpn, nil)
		delete(d.qpSet, q)
		if q.qpn != GSIQPN {
			d.qpns.Free(q.qpn)
			d.qpCount--
			q.home.qps--
		}
	}
	q.mu.Lock()
	st := q.statsLocked()
	q.mu.Unlock()
	d.retired.add(&st)
	d.qpMu.Unlock()
}

func (d *Device) getBatch() *netio.SendBatch  { return d.batches.get() }
func (d *Device) putBatch(b *netio.SendBatch) { d.batches.put(b) }
