package transport

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

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
	// Window is the most unacknowledged PSNs a QP's requester keeps in flight (default
	// 128).
	Window int
	// AckReqEvery sets AckReq on every n-th packet of a long message besides its last
	// (default 64).
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

	mrs *tpt.Table

	qpMu    mutex
	qps     ptab.Table[QP]
	qpSet   map[*QP]struct{}
	qpns    *ptab.Allocator // draws QP numbers (QP0 and QP1 reserved)
	qpCount int
	retired Stats // counters of destroyed QPs

	// Receive path state, owned by whoever holds rxMu (the receive goroutine, or a
	// polling consumer driving progress).
	rxMu     mutex
	rxBatch  *netio.RecvBatch
	rxOut    *netio.SendBatch
	ackList  []*QP
	kickList []*QP
	respList []*QP
	// respLater holds QPs that spent their response budget in this round: their responses
	// go on in the next round, after the socket was read again (see finishBatch).
	respLater []*QP
	respRound uint32
	// parked: the receive goroutine went to sleep in the network poller (rxMu held to
	// read or write). A polling consumer that leaves responses pending rings the doorbell.
	parked   bool
	owned    []*QP
	deferred []*QP // QPs with an ACK held back (see Progress)
	// The spare halves of kickList and respList, swapped in so draining a list does not
	// allocate a new one.
	kickSpare, respSpare []*QP
	polling              bool // the receive path runs in a polling consumer's goroutine
	flushNow             bool // rxOut holds an ACK that should not wait for the batch's end
	rx                   rxStats
	rxPkt                wire.Packet    // the packet being processed (not on the stack: it goes through the mode interface)
	rxFrom               netip.AddrPort // where it came from
	quiesced             uint64         // Quiesce calls that waited for the receive path

	// polled is set when a consumer polls (Progress) and cleared when the receive goroutine
	// looks: while consumers poll, the receive goroutine leaves the socket to them and ACKs
	// wait to ride along with their sends.
	polled   atomic.Bool
	yieldReq atomic.Bool // a completion handler was woken: yield after this batch

	atomicMu mutex // serialises remote atomic operations (ATOMIC_HCA semantics)

	batches sync.Pool // *netio.SendBatch for transmit from other goroutines

	// acks is the set of devices whose held-back ACKs a goroutine polling this device
	// also flushes (Config.AckGroup; a group of its own if none was given).
	acks        *AckGroup
	holdingAcks atomic.Bool // d holds ACKs back (see AckGroup.hold)

	timers timerQueue

	// OnEvent receives asynchronous events. It is called with engine locks held and must
	// only queue the event.
	OnEvent func(Event)

	closed atomic.Bool
	wg     sync.WaitGroup
}

type rxStats struct {
	packets, bytes, icrc, malformed, unknownQP, pkey uint64
}

// Defaults.
const (
	DefaultWindow      = 128
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
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Window > 1<<22 {
		return nil, errors.New("transport: window larger than 2^22 PSNs")
	}
	if cfg.AckReqEvery <= 0 {
		cfg.AckReqEvery = DefaultAckReqEvery
	}
	if cfg.ReadChunk <= 0 {
		cfg.ReadChunk = DefaultReadChunk
	}
	if cfg.ReadChunk > cfg.Window {
		cfg.ReadChunk = cfg.Window
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
	wire.PrepareIdentification()
	tp := &tap{w: cfg.Tap}
	nc := netio.Config{
		Local: cfg.Local, SocketBuffer: cfg.SocketBuffer, DisableGSO: cfg.DisableGSO,
		DisableGRO: cfg.DisableGRO, Faults: cfg.Faults, FaultFilter: cfg.FaultFilter,
		SegmentID:   wire.SegmentICRC, // segment i of a GSO send carries IPv4 identification i
		SourcePorts: cfg.SourcePorts,
	}
	if cfg.Tap != nil {
		nc.Tap = tp.sent
	}
	conn, err := netio.Listen(nc)
	if err != nil {
		return nil, err
	}
	tp.local = conn.LocalAddr()
	d := &Device{
		cfg:   cfg,
		conn:  conn,
		local: conn.LocalAddr(),
		v4:    conn.LocalAddr().Addr().Is4(),
		tap:   tp,
		epoch: time.Now(),
		mrs:   tpt.New(cfg.MaxMR),
		qpSet: make(map[*QP]struct{}),
		qpns:  ptab.NewAllocator(2, true), // QP0 and QP1 are reserved
	}
	d.rxMu.rank, d.qpMu.rank, d.atomicMu.rank = rankRx, rankQPTable, rankAtomic
	d.rxBatch = conn.NewRecvBatch(cfg.RecvBatch, 4096+256)
	d.rxOut = netio.NewSendBatch(outPkts, outIovs, outArena)
	d.batches.New = func() any { return netio.NewSendBatch(outPkts, outIovs, outArena) }
	if d.acks = cfg.AckGroup; d.acks == nil {
		d.acks = NewAckGroup()
	}
	d.acks.join(d)
	d.timers.init(d)
	d.wg.Add(2)
	go d.rxLoop()
	go d.timers.run()
	return d, nil
}

// Close stops the device. QPs stop moving packets; it does not flush them.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	d.timers.stop()
	d.acks.leave(d)
	err := d.conn.Close()
	d.wg.Wait()
	return err
}

// Quiesce waits until the receive path has finished what it was doing when Quiesce was
// called. Deregistration calls it after revoking a region: no access on behalf of a peer
// that checked the region before it was revoked is still running when it returns (see the
// package doc). It must not be called with a QP's lock or the receive path held.
func (d *Device) Quiesce() {
	d.rxMu.Lock()
	d.quiesced++
	d.rxMu.Unlock()
}

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

func (d *Device) now() int64 { return int64(time.Since(d.epoch)) }

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
	n := d.qpns.Alloc(d.qpCount, func(i uint32) bool { return d.qps.Load(i) != nil })
	q.qpn = n
	d.qps.Store(n, q)
	d.qpSet[q] = struct{}{}
	d.qpCount++
	return nil
}

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
		}
	}
	q.mu.Lock()
	st := q.statsLocked()
	q.mu.Unlock()
	d.retired.add(&st)
	d.qpMu.Unlock()
}

// rxLoop is the device's receive goroutine: it sleeps in the runtime's network poller and
// runs every arriving packet to completion.
func (d *Device) rxLoop() {
	defer d.wg.Done()
	_ = d.conn.Serve(d.rxReady)
}

// rxReady drains the socket, then keeps polling for up to BusyPoll after the last packet
// it found before going back to sleep (unless a consumer is polling the device, which then
// receives the packets itself). It returns true to stop serving (device closed).
func (d *Device) rxReady() bool {
	spin := int64(d.cfg.BusyPoll)
	d.rxMu.Lock()
	d.parked = false
	last := d.now()
	for i := 1; ; i++ {
		if d.closed.Load() {
			d.rxMu.Unlock()
			return true
		}
		n, err := d.conn.Poll(d.rxBatch)
		if err != nil {
			d.rxMu.Unlock()
			return errors.Is(err, netio.ErrClosed)
		}
		if n > 0 {
			d.processBatch(n)
			last = d.now()
			if d.yieldReq.Load() && d.yieldReq.Swap(false) {
				// The batch woke a completion handler: hand it this P now rather than
				// after the next batches (see RequestYield).
				d.rxMu.Unlock()
				runtime.Gosched()
				d.rxMu.Lock()
				continue
			}
		} else if len(d.respList) > 0 {
			d.finishBatch() // the next round of READ responses
			last = d.now()
		} else if spin <= 0 || d.now()-last >= spin || d.polled.Swap(false) {
			d.parked = true
			d.rxMu.Unlock()
			return false
		}
		if n == 0 || i%8 == 0 {
			// Let a polling consumer (and other goroutines) in.
			d.rxMu.Unlock()
			runtime.Gosched()
			d.rxMu.Lock()
		}
	}
}

// RequestYield asks the receive goroutine to yield its processor after the batch it is
// processing: a completion handler was woken and should run without waiting for the
// receive goroutine to go idle.
func (d *Device) RequestYield() { d.yieldReq.Store(true) }

// Progress receives and processes whatever is queued on the socket, in the caller's
// goroutine, unless the receive path is busy elsewhere. Busy-polling consumers call it
// (through CQ.Progress) so a completion does not wait for the receive goroutine to wake.
func (d *Device) Progress() {
	if !d.polled.Load() {
		d.polled.Store(true)
	}
	if !d.rxMu.TryLock() {
		return
	}
	if !d.closed.Load() {
		d.flushDeferred()
		d.acks.flushOthers(d)
		if n, _ := d.conn.Poll(d.rxBatch); n > 0 {
			d.processBatch(n)
		} else if len(d.respList) > 0 {
			d.finishBatch()
		}
		if len(d.respList) > 0 && d.parked {
			// Responses remain for later rounds and the receive goroutine sleeps: wake it,
			// as this consumer may not poll again.
			d.parked = false
			d.conn.Doorbell()
		}
	}
	d.rxMu.Unlock()
}

// drainReceive processes what waits in the socket before timers act (the timer
// goroutine, no lock held): a retransmission timeout must not fire for an ACK that has
// arrived but that the receive goroutine, starved of CPU on a machine busy with other
// work, has not read yet. Without this, on a loaded machine a QP could spend its retry
// count on answers queued in its own socket, and end in ERR.
func (d *Device) drainReceive() {
	d.rxMu.Lock()
	defer d.rxMu.Unlock()
	for i := 0; i < drainBatches && !d.closed.Load(); i++ {
		n, err := d.conn.Poll(d.rxBatch)
		if err != nil || n == 0 {
			return
		}
		d.processBatch(n)
	}
}

// drainBatches bounds drainReceive's work: a full socket is the receive goroutine's.
const drainBatches = 8

// ackDelay bounds how long an ACK is held back for piggybacking.
const ackDelay = 100 * time.Microsecond

// flushDeferred sends ACKs still held back (rxMu held).
func (d *Device) flushDeferred() { d.flushDeferredOlder(0, false) }

// flushDeferredOlder sends the ACKs held back for at least minAge ns (rxMu held). With try
// (another device's poller flushing for it) a QP whose lock is taken is left for later:
// its own goroutine is busy with it.
func (d *Device) flushDeferredOlder(minAge int64, try bool) {
	if len(d.deferred) == 0 {
		return
	}
	cutoff := d.now() - minAge + int64(ackDelay) // held since before now-minAge
	kept := d.deferred[:0]
	for _, q := range d.deferred {
		if !try {
			q.mu.Lock()
		} else if !q.mu.TryLock() {
			kept = append(kept, q)
			continue
		}
		switch {
		case !q.resp.ackDeferred || !q.resp.ackPending:
			q.resp.ackDeferred = false
		case minAge > 0 && q.resp.ackAt > cutoff:
			kept = append(kept, q)
		default:
			d.ackOutRelock(q)
		}
		q.mu.Unlock()
	}
	clear(d.deferred[len(kept):])
	d.deferred = kept
	if len(kept) == 0 {
		d.acks.hold(d, false)
	}
	d.flushOut()
}

// processBatch handles n received datagrams, splitting GRO-coalesced ones, then sends the
// ACKs and responses they caused. While a consumer polls the device, ACKs are held back to
// ride along with its next send (see finishBatch).
func (d *Device) processBatch(n int) {
	d.polling = d.polled.Load()
	defer func() { d.polling = false }()
	for i := 0; i < n; i++ {
		data, seg, from := d.rxBatch.Datagram(i)
		if len(data) == 0 {
			if from != d.local {
				d.rx.malformed++ // an empty datagram; from this device itself it is the doorbell
			}
			continue
		}
		if seg == 0 {
			d.input(data, from)
		} else {
			for len(data) > 0 {
				k := min(seg, len(data))
				d.input(data[:k], from)
				data = data[k:]
			}
		}
		if d.flushNow {
			d.flushNow = false
			d.flushOut()
		}
	}
	d.finishBatch()
}

// input handles one packet (rxMu held).
func (d *Device) input(pkt []byte, from netip.AddrPort) {
	d.rx.packets++
	d.rx.bytes += uint64(len(pkt))
	flow := wire.Flow{Src: from.Addr(), Dst: d.local.Addr(), SrcPort: from.Port(), DstPort: d.local.Port(), DF: d.v4}
	// Any IPv4 identification: a standard peer's is not 0, and a UDP socket does not show
	// it (see wire.VerifyICRCAnyID for what is then verified).
	id, ok := flow.VerifyICRCAnyID(pkt)
	if d.tap.w != nil {
		d.tap.received(from, id, pkt)
	}
	if !ok {
		d.rx.icrc++
		return
	}
	p := &d.rxPkt
	*p = wire.Packet{} // Decode sets only the fields the opcode has
	if p.Decode(pkt) != nil {
		d.rx.malformed++
		return
	}
	if p.BTH.PKey != wire.DefaultPKey {
		d.rx.pkey++
		return
	}
	q := d.lookupQP(p.BTH.DestQP)
	if q == nil {
		d.rx.unknownQP++
		return
	}
	if !d.rxOut.Room(outReserve, outReserve*96) {
		d.flushOut()
	}
	d.rxFrom = from
	q.input(p, from, len(pkt))
}

// ackOutRelock adds q's ACK to the receive path's batch, sending the batch first if it is
// full (rxMu and q.mu held; q.mu is released around that send and taken again).
func (d *Device) ackOutRelock(q *QP) {
	if !d.rxOut.Room(2, 64) {
		q.mu.Unlock()
		d.flushOut()
		q.mu.Lock()
	}
	q.resp.sendAck(d.rxOut)
}

// flushOut sends what the receive path has built (rxMu held, no QP lock).
func (d *Device) flushOut() {
	if d.rxOut.Len() > 0 {
		_ = d.conn.Send(d.rxOut)
	}
}

// finishBatch sends a round of pending read responses, coalesced ACKs and requester
// packets that the batch's ACKs released (rxMu held). In a round each QP sends at most
// respBudget response packets; a QP with more waits in respLater for the next round, which
// comes after the socket was read again (rxReady, Progress), so that a peer's long READs
// cannot hold up other QPs' packets, ACKs and completions.
func (d *Device) finishBatch() {
	d.respRound++
	for len(d.respList) > 0 || len(d.ackList) > 0 || len(d.kickList) > 0 {
		// Read and atomic responses first: they must precede ACKs of later requests.
		for len(d.respList) > 0 {
			list := d.respList
			d.respList, d.respSpare = d.respSpare[:0], list
			for _, q := range list {
				q.mu.Lock()
				q.resp.queued = false
				if q.resp.round != d.respRound {
					q.resp.round, q.resp.budget = d.respRound, respBudget
				}
				if !q.resp.pumpResponses(d.rxOut) {
					if q.resp.budget == 0 {
						q.resp.queued = true
						d.respLater = append(d.respLater, q)
					} else {
						d.queueResp(q) // the batch filled up: send it, then go on
					}
				}
				q.mu.Unlock()
			}
			clear(list)
			if len(d.respList) > 0 {
				d.flushOut()
			}
		}
		for _, q := range d.ackList {
			q.mu.Lock()
			q.resp.ackQueued = false
			if q.resp.ackPending && !q.resp.pumping() {
				if d.polling {
					// A consumer is polling in this goroutine and will likely post next:
					// let the ACK ride along with that send (see QP.fill).
					if !q.resp.ackDeferred {
						q.resp.ackDeferred = true
						q.resp.ackAt = d.now() + int64(ackDelay)
						d.deferred = append(d.deferred, q)
						if len(d.deferred) == 1 {
							d.acks.hold(d, true)
						}
						d.timers.arm(q, q.resp.ackAt)
					}
					q.mu.Unlock()
					continue
				}
				d.ackOutRelock(q)
			}
			q.mu.Unlock()
		}
		d.ackList = d.ackList[:0]
		d.runKicks()
	}
	if !d.polling {
		d.flushDeferred()
	}
	d.flushOut()
	// What spent its budget is the next round's.
	d.respList = append(d.respList, d.respLater...)
	clear(d.respLater)
	d.respLater = d.respLater[:0]
}

// runKicks lets QPs whose window opened send more, from the receive path. A QP whose
// transmit is owned by another goroutine is left to that goroutine.
func (d *Device) runKicks() {
	for len(d.kickList) > 0 {
		list := d.kickList
		d.kickList, d.kickSpare = d.kickSpare[:0], list
		for _, q := range list {
			q.mu.Lock()
			q.kickQueued = false
			if q.txOwner {
				q.txPending = true
			} else {
				q.txOwner = true
				q.txMore = q.req.fill(d.rxOut)
				d.owned = append(d.owned, q)
			}
			q.mu.Unlock()
		}
		d.flushOut()
		for _, q := range d.owned {
			q.mu.Lock()
			q.mode.transmitted(q)
			q.releaseTx()
			if q.txPending || q.txMore {
				q.txPending, q.txMore = false, false
				d.queueKick(q)
			}
			q.mu.Unlock()
		}
		clear(d.owned)
		d.owned = d.owned[:0]
	}
}

// queueKick asks the receive path to run q's requester at the end of the batch (rxMu held).
func (d *Device) queueKick(q *QP) {
	if !q.kickQueued {
		q.kickQueued = true
		d.kickList = append(d.kickList, q)
	}
}

func (d *Device) queueAck(q *QP) {
	if !q.resp.ackQueued {
		q.resp.ackQueued = true
		d.ackList = append(d.ackList, q)
	}
}

func (d *Device) queueResp(q *QP) {
	if !q.resp.queued {
		q.resp.queued = true
		d.respList = append(d.respList, q)
	}
}

func (d *Device) getBatch() *netio.SendBatch  { return d.batches.Get().(*netio.SendBatch) }
func (d *Device) putBatch(b *netio.SendBatch) { d.batches.Put(b) }
