package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// rperf's perftest mode (Config.Perftest, rperf --perftest): the client and the server speak
// perftest's exchange over TCP (perftest_wire.go) and run perftest's traffic pattern, so
// that either side can be perftest's own ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw,
// ib_write_lat, ib_read_lat, ib_send_lat or ib_atomic_lat, on Linux rxe or a RoCE NIC.
// What differs from rperf's own mode:
//
//   - Each side takes its parameters from its own flags, as perftest does: only the
//     version, page and cache line size and MTU are exchanged, so size, iterations and
//     -a must match on both sides (perftest's defaults: 65536 bytes and 5000 iterations
//     for write_bw, 1000 for the others; 2 bytes for the latency tests, 8 for atomics).
//   - The device listens on UDP port 4791 (Config.RoCEPort), where a standard peer
//     sends; the peer's packets may come from any source port of its address (rxe picks
//     one per QP). One device per address: the exchange carries no port.
//   - The path MTU is the smaller of the two sides' port MTUs; this side's is --mtu if
//     given, otherwise what rxe would report as active on the device address's interface
//     (the interface MTU less 80 bytes of headers, rounded down: 1024 on a 1500-byte link,
//     4096 on loopback).
//   - Ordered mode; no weak mode, no threads or events.
//   - With Config.CM (perftest's -R, perftest_cm.go) the exchange goes over an RC QP
//     that rdma_cm connects, and the test's QPs are connected through rdma_cm too.
//   - The buffers: per QP a source region and a target region of max(size, page size)
//     bytes (rounded up to a cache line), the target region's address is the one
//     advertised; messages smaller than half a page move along the regions in
//     cache-line steps, as perftest's do.
//   - --check works between two rperfs only: the source regions hold a known pattern
//     (perftest fills its buffers with random bytes), checked where it lands.
//   - Results are perftest's: bandwidth from the first post to the last completion with
//     the peak of perftest's sliding computation; latency from the intervals between
//     successive posts (half for write and send), the two largest left out, with perftest's
//     median, mean, standard deviation and percentiles.

// DefaultRoCEPort is where a standard RoCEv2 peer sends: perftest mode's device port.
const DefaultRoCEPort = verbs.DefaultPort

// perftest's constants (perftest_parameters.h, perftest_resources.h).
const (
	ptMaxSize      = 8 << 20 // MAX_SIZE: -a goes up to it
	ptCQModDefault = 100     // DEF_CQ_MOD
	ptCQModLimit   = 8192    // MSG_SIZE_CQ_MOD_LIMIT: above it every WR is signaled
	ptRxSend       = 512     // DEF_RX_SEND
	ptTxBW         = 128     // DEF_TX_BW
	ptMinIters     = 5       // MIN_ITER
	ptNoPeakIters  = 20000   // above it the bandwidth tests compute no peak
	ptCacheLine    = 64      // DEF_CACHE_LINE_SIZE
	ptTailDropped  = 2       // LAT_MEASURE_TAIL
	ptCheckAlive   = 60 * time.Second
)

// ptCMTimeout is the local ACK timeout of the QPs with -R: what Linux's rdma_cm gives a
// RoCE QP (its route's packet lifetime plus one; the REQs of perftest 4.5's -R client on
// Linux 6.1 carry 19, 2.1 s), where perftest without -R sets 14 (67 ms).
const ptCMTimeout = 19

// ptDoneWait bounds the wait for the peer's "done" after the closing handshake.
const ptDoneWait = 2 * time.Second

// ptSetupTimeout bounds the exchange up to the traffic (perftest's client sleeps a second
// after connecting; a peer that stops answering ends the run with an error).
const ptSetupTimeout = 60 * time.Second

// AtomicTypes are perftest's -A values.
var AtomicTypes = []string{"FETCH_AND_ADD", "CMP_AND_SWAP"}

func isAtomic(test string) bool { return strings.HasPrefix(test, "atomic_") }

// perftestDefaults fills zero fields with perftest's defaults for c.Test.
func (c *Config) perftestDefaults() {
	bw := isBW(c.Test)
	switch {
	case isAtomic(c.Test):
		c.Size = 8
	case c.Size == 0 && bw:
		c.Size = 65536
	case c.Size == 0:
		c.Size = 2
	}
	if c.Iters == 0 {
		c.Iters = 1000
		if c.Test == "write_bw" {
			c.Iters = 5000
		}
	}
	if c.QPs == 0 {
		c.QPs = 1
	}
	if c.Threads == 0 {
		c.Threads = 1
	}
	if c.Timeout == 0 {
		c.Timeout = 14 // perftest's ctx_connect
		if c.CM {
			c.Timeout = ptCMTimeout
		}
	}
	if c.TxDepth == 0 {
		c.TxDepth = 1 // DEF_TX_LAT
		if bw {
			c.TxDepth = ptTxBW
		}
	}
	c.TxDepth = min(c.TxDepth, c.Iters)
	if c.RxDepth == 0 {
		c.RxDepth = 1 // DEF_RX_RDMA
		if strings.HasPrefix(c.Test, "send_") {
			c.RxDepth = ptRxSend
		}
	}
	if strings.HasPrefix(c.Test, "send_") {
		c.RxDepth = min(c.RxDepth, c.Iters)
	}
	if c.AtomicType == "" {
		c.AtomicType = AtomicTypes[0]
	}
	if c.RoCEPort == 0 {
		c.RoCEPort = DefaultRoCEPort
	}
}

// cqMod is the CQ moderation perftest uses for size: every cqMod-th work request is
// signaled (all of them for messages above 8 KiB unless --cq-mod was given, never more
// than the TX depth).
func (c *Config) cqMod(size int) int {
	m := c.CQMod
	if m == 0 {
		m = ptCQModDefault
		if size > ptCQModLimit && !c.AllSizes {
			m = 1
		}
	}
	return max(1, min(m, c.TxDepth))
}

// validatePerftest checks a perftest-mode configuration.
func (c *Config) validatePerftest() error {
	if c.MTU != 0 {
		if _, err := verbs.MTUFromBytes(c.MTU); err != nil {
			return err
		}
	}
	switch c.AtomicType {
	case "", AtomicTypes[0], AtomicTypes[1]:
	default:
		return fmt.Errorf("atomic type %q: want %s", c.AtomicType, strings.Join(AtomicTypes, " or "))
	}
	switch {
	case c.Ordering == verbs.OrderingWeak:
		return errors.New("--perftest: a standard peer has ordered mode only")
	case c.Threads > 1 || c.Events:
		return errors.New("--perftest runs one client goroutine, busy-polling (no -t, -e)")
	case c.Size < 1 || c.Size > ptMaxSize:
		return fmt.Errorf("--perftest: size %d out of range 1..%d (perftest's)", c.Size, ptMaxSize)
	case c.Iters < ptMinIters:
		return fmt.Errorf("--perftest: at least %d iterations, as perftest", ptMinIters)
	case c.QPs < 1 || c.QPs > 1024:
		return fmt.Errorf("qps %d out of range 1..1024", c.QPs)
	case c.TxDepth < 1 || c.TxDepth > 8192 || c.RxDepth < 1 || c.RxDepth > 8192:
		return fmt.Errorf("tx-depth %d or rx-depth %d out of range 1..8192", c.TxDepth, c.RxDepth)
	case c.CQMod < 0:
		return errors.New("--cq-mod must be positive")
	case c.AllSizes && isAtomic(c.Test):
		return errors.New("--perftest: -a with the atomic tests (perftest runs 8 bytes only)")
	case !isBW(c.Test) && c.QPs != 1:
		return errors.New("latency tests use one QP")
	case c.RoCEPort < 1 || c.RoCEPort > 65535:
		return fmt.Errorf("RoCE UDP port %d out of range", c.RoCEPort)
	}
	return nil
}

// ptSizes returns the message sizes a run goes through: -a's 2 B .. 8 MiB (perftest's
// RUN_ALL) for the tests whose perftest loops over sizes, c.Size otherwise.
func (c *Config) ptSizes() []int {
	if !c.AllSizes || isAtomic(c.Test) {
		return []int{c.Size}
	}
	var s []int
	for n := 2; n <= c.ptBufSize(); n *= 2 {
		s = append(s, n)
	}
	return s
}

// ptBufSize is the size the buffers are laid out for: the largest message of the run.
func (c *Config) ptBufSize() int {
	switch {
	case c.AllSizes && !isAtomic(c.Test) && c.allUpTo > 0:
		return c.allUpTo
	case c.AllSizes && !isAtomic(c.Test):
		return ptMaxSize
	}
	return c.Size
}

// ptSide is one end of a perftest-mode run: a device (port 4791), a PD, one CQ for sends
// and receives, the QPs and a buffer laid out as perftest's: for QP q a source region at
// q*region and a target region at (QPs+q)*region, whose address the peer gets.
type ptSide struct {
	cfg    *Config
	client bool
	ctx    *verbs.Device
	own    bool
	pd     *verbs.PD
	cq     *verbs.CQ
	qps    []*verbs.QP
	mem    []byte // the allocation buf is cut from (aligned to the cycle buffer)
	buf    []byte
	mr     *verbs.MR
	params ptParams
	region int
	my     []ptDest
	rem    []ptDest
	qpIdx  map[uint32]int
	posted []int      // per QP: receives posted for the current size (send tests)
	conns  []*cm.Conn // with -R: QP q's connection
}

// newPtSide opens a device at addr (or uses ctx) for a side whose exchange settled on p.
func newPtSide(c *Config, client bool, ctx *verbs.Device, addr netip.Addr, p ptParams) (*ptSide, error) {
	s := &ptSide{cfg: c, client: client, params: p, qpIdx: map[uint32]int{}}
	if ctx == nil {
		var capture *verbs.PacketCapture
		if client {
			capture = c.Capture
		}
		var err error
		ctx, err = verbs.OpenDevice(verbs.DeviceConfig{Addr: addr, Port: c.RoCEPort, Queues: c.Queues, Faults: c.Faults,
			Window: c.Window, BusyPoll: c.BusyPoll, Capture: capture})
		if err != nil {
			return nil, err
		}
		c.publish(ctx)
		s.own = true
	}
	s.ctx = ctx
	if err := s.setup(); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// inc is perftest's INC: size rounded up to the cache line.
func (s *ptSide) inc(size int) int {
	cl := s.params.CacheLine
	return (size + cl - 1) / cl * cl
}

func (s *ptSide) setup() error {
	c := s.cfg
	var err error
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		return err
	}
	nqp := c.QPs
	cqe := max(64, nqp*(c.TxDepth+c.RxDepth)+16)
	if s.cq, err = s.ctx.CreateCQ(cqe, nil, 0); err != nil {
		return err
	}
	// perftest: INC(BUFF_SIZE(size, cycle_buffer), cache_line) per QP and direction,
	// aligned to the cycle buffer (memalign), which keeps atomics' targets aligned.
	s.region = s.inc(max(c.ptBufSize(), s.params.Cycle))
	total := 2 * nqp * s.region
	align := max(s.params.Cycle, 8)
	s.mem = make([]byte, total+align)
	off := 0
	if r := int(uintptr(unsafe.Pointer(&s.mem[0])) % uintptr(align)); r != 0 {
		off = align - r
	}
	s.buf = s.mem[off : off+total : off+total]
	s.fill()
	access := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	if s.mr, err = s.pd.RegMR(s.buf, access); err != nil {
		return err
	}
	outReads := uint16(1) // perftest: the device's maximum for READ and atomics, 1 otherwise
	if strings.HasPrefix(c.Test, "read_") || isAtomic(c.Test) {
		outReads = uint16(min(s.ctx.QueryDevice().MaxQPRdAtom, 255))
	}
	gid := verbs.GIDFromAddr(s.ctx.Addr().Addr())
	for q := 0; q < nqp; q++ {
		qp, err := s.pd.CreateQP(&verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, Cap: verbs.QPCap{
			MaxSendWR: max(c.TxDepth, 16), MaxRecvWR: max(c.RxDepth, 16), MaxSendSGE: 1, MaxRecvSGE: 1,
			MaxInlineData: 64}})
		if err != nil {
			return err
		}
		s.qps = append(s.qps, qp)
		s.qpIdx[qp.QPNum()] = q
		s.my = append(s.my, ptDest{OutReads: outReads, QPN: qp.QPNum(), PSN: verbs.RandomPSN(),
			RKey: s.mr.RKey(), VAddr: s.mr.Addr() + uint64(s.targetOff(q)), GID: gid})
	}
	return nil
}

// srcOff and targetOff are the offsets of QP q's source and target regions in buf.
func (s *ptSide) srcOff(q int) int    { return q * s.region }
func (s *ptSide) targetOff(q int) int { return (s.cfg.QPs + q) * s.region }

// fill initialises the buffer. perftest fills it with random bytes (zeros for write_lat);
// with --check (only between two rperfs) the source regions hold a known pattern and
// the targets zeros, or the pattern where the peer reads.
func (s *ptSide) fill() {
	c := s.cfg
	if !c.Check {
		return // zeros: what the peer gets is not checked
	}
	for q := 0; q < c.QPs; q++ {
		at := q // the source region: what this side writes or sends
		if strings.HasPrefix(c.Test, "read_") {
			at = c.QPs + q // the target region: what the peer reads
		}
		pattern(s.buf[at*s.region:(at+1)*s.region], q+1)
	}
}

// connect brings every QP to RTS as perftest's ctx_connect does (its server stops at RTR
// in the one-sided bandwidth tests; RTS costs nothing): the access the test needs, the
// peer's GID and QPN, its PSN, READ/atomic depth from the outstanding reads each side
// gave, local ACK timeout 14, 7 retries, infinite RNR retries, minimum RNR timer 12.
// The peer listens on RoCEPort and sends from any port of its address.
func (s *ptSide) connect() error {
	c := s.cfg
	access := s.access()
	for q, qp := range s.qps {
		my, rem := s.my[q], s.rem[q]
		ep := verbs.Endpoint{GID: rem.GID, Port: uint16(c.RoCEPort), QPNum: rem.QPN, PSN: rem.PSN, AnySourcePort: true}
		steps := []struct {
			attr verbs.QPAttr
			mask verbs.QPAttrMask
		}{
			{verbs.QPAttr{QPState: verbs.StateInit, PortNum: 1, QPAccessFlags: access},
				verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags},
			{verbs.QPAttr{QPState: verbs.StateRTR, PathMTU: s.params.MTU, DestQPNum: ep.QPNum, RQPSN: ep.PSN,
				MaxDestRdAtomic: uint8(min(my.OutReads, 255)), MinRNRTimer: 12,
				AHAttr: verbs.AHAttr{DGID: ep.GID, DestPort: ep.Port, PortNum: 1, IsGlobal: true, HopLimit: 64}},
				verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN |
					verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer},
			{verbs.QPAttr{QPState: verbs.StateRTS, SQPSN: my.PSN, Timeout: c.Timeout, RetryCnt: 7, RNRRetry: 7,
				MaxRdAtomic: uint8(max(1, min(int(rem.OutReads), s.ctx.QueryDevice().MaxQPInitRdAtom)))},
				verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry |
					verbs.QPAttrSQPSN | verbs.QPAttrMaxQPRdAtomic},
		}
		for _, st := range steps {
			if err := qp.ModifyQP(&st.attr, st.mask); err != nil {
				return fmt.Errorf("QP %#x to %v (peer QP %#x at %v): %w", qp.QPNum(), st.attr.QPState, rem.QPN, rem.GID, err)
			}
		}
	}
	return nil
}

// access is the remote access the test needs on its QPs, as perftest's ctx_connect gives.
func (s *ptSide) access() verbs.AccessFlags {
	switch test := s.cfg.Test; {
	case isAtomic(test):
		return verbs.AccessRemoteAtomic
	case strings.HasPrefix(test, "read_"):
		return verbs.AccessRemoteRead
	case strings.HasPrefix(test, "write_"):
		return verbs.AccessRemoteWrite
	}
	return verbs.AccessRemoteWrite | verbs.AccessLocalWrite
}

// readOrAtomic reports whether test issues RDMA READs or atomics (perftest's out_reads
// and rdma_cm's responder resources matter).
func readOrAtomic(test string) bool { return strings.HasPrefix(test, "read_") || isAtomic(test) }

func (s *ptSide) close() {
	_ = s.endCM(true, true) // what the session did not end (nothing normally)
	for _, qp := range s.qps {
		qp.DestroyQP()
	}
	if s.mr != nil {
		s.mr.DeregMR()
	}
	if s.cq != nil {
		s.cq.DestroyCQ()
	}
	if s.pd != nil {
		s.pd.DeallocPD()
	}
	if s.own {
		s.ctx.Close()
	}
}

// ptSession runs one perftest-mode test over an established control connection.
type ptSession struct {
	cfg   *Config
	pc    *ptConn
	s     *ptSide
	stats bool
	// open creates this side once the exchange has settled the parameters.
	open func(p ptParams) (*ptSide, error)
	// ownMTU is this side's port MTU for the exchange.
	ownMTU verbs.MTU
	// traffic, if set, replaces the traffic of each size (the exchange tests).
	traffic func(size int) (Result, error)
	// cm, with -R: the QPs are connected through the connection manager.
	cm *ptCM
	// base is the device's counters before the session (a server's device serves one
	// client after another): results carry what the session added.
	base verbs.Counters
}

// hsSync is a handshake whose only purpose is to synchronise (perftest's around its
// rdma_cm connections, with destinations of zeros).
func (t *ptSession) hsSync() error {
	_, err := t.pc.handshake(ptDest{})
	return err
}

// connectCM is -R's part of create_rdma_cm_connection: a handshake, the connections
// (the server listening, the client connecting one per QP), another handshake.
func (t *ptSession) connectCM() error {
	if err := t.s.cmInit(); err != nil {
		return err
	}
	if err := t.hsSync(); err != nil {
		return err
	}
	if err := t.cm.connect(t.s); err != nil {
		return err
	}
	t.s.cmConnected()
	return t.hsSync()
}

// hs is one handshake with QP q's destination (all of them are the same string again
// after the first per QP).
func (t *ptSession) hs(q int) error {
	d, err := t.pc.handshake(t.s.my[q])
	if err != nil {
		return err
	}
	if len(t.s.rem) <= q {
		t.s.rem = append(t.s.rem, d)
	}
	return nil
}

// hsAll is one handshake per QP.
func (t *ptSession) hsAll() error {
	for q := range t.s.qps {
		if err := t.hs(q); err != nil {
			return err
		}
	}
	return nil
}

// checkPeer looks at the peer's destinations before connecting: the same GID family
// (perftest's ctx_check_gid_compatibility) and not this device's own GID (the exchange
// carries no UDP port, so two devices on one address cannot tell their packets apart).
func (t *ptSession) checkPeer() error {
	for q, rem := range t.s.rem {
		mine := t.s.my[q].GID
		if rem.GID.Addr().Is4() != mine.Addr().Is4() {
			return fmt.Errorf("GID %v and the peer's %v are of different IP versions (perftest: \"Found Incompatibility issue with GID types\")", mine, rem.GID)
		}
		if rem.GID == mine {
			return fmt.Errorf("the peer's device has this device's address %v: perftest's exchange carries no UDP port, so each side needs an address of its own (--dev-addr)", mine)
		}
	}
	return nil
}

// connectPhase runs the handshakes around connecting the QPs, as each test's main()
// orders them, up to the last one before the traffic (exclusive for send tests, whose
// receives are posted first).
func (t *ptSession) connectPhase() error {
	connect := func() error {
		if t.cm != nil {
			return nil // rdma_cm connected them (perftest skips ctx_connect with -R)
		}
		if err := t.checkPeer(); err != nil {
			return err
		}
		return t.s.connect()
	}
	steps := []func() error{}
	switch t.cfg.Test {
	case "write_bw", "read_bw", "atomic_bw":
		steps = append(steps, t.hsAll, connect, t.hsAll, func() error { return t.hs(0) })
	case "send_bw", "send_lat":
		steps = append(steps, t.hsAll, connect, func() error { return t.hs(0) }, t.hsAll)
	case "write_lat", "read_lat", "atomic_lat":
		steps = append(steps, func() error { return t.hs(0) }, t.hsAll, connect, t.hsAll, func() error { return t.hs(0) })
	default:
		return fmt.Errorf("--perftest: no test %q", t.cfg.Test)
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// run runs the test: the exchange's first steps, the resources, the handshakes, the
// traffic for each size, the reports and the close. It returns what this side's perftest
// would print: the client its own results; the server of write/read/atomic_bw the
// client's report, of send_bw and the ping-pong latency tests its own, of read_lat and
// atomic_lat nothing (a Passive result).
func (t *ptSession) run() (_ []Result, err error) {
	c := t.cfg
	t.pc.setDeadline(time.Now().Add(ptSetupTimeout))
	params, err := t.pc.prefix(ptParams{Cycle: os.Getpagesize(), CacheLine: ptCacheLine, MTU: t.ownMTU})
	if err != nil {
		return nil, err
	}
	if t.s, err = t.open(params); err != nil {
		return nil, err
	}
	defer t.s.close()
	if t.cm != nil {
		defer func() {
			if cerr := t.s.endCM(t.cm.client, err != nil); err == nil {
				err = cerr
			}
		}()
		if err := t.connectCM(); err != nil {
			return nil, err
		}
	}
	if err := t.connectPhase(); err != nil {
		return nil, err
	}
	t.pc.setDeadline(time.Time{}) // the peer may take long over the traffic
	var out []Result
	traffic := t.traffic
	if traffic == nil {
		traffic = t.s.traffic
	}
	runSizes := func() error {
		for _, size := range c.ptSizes() {
			r, err := traffic(size)
			if err != nil {
				return err
			}
			out = append(out, t.decorate(r))
		}
		return nil
	}
	switch c.Test {
	case "write_bw", "read_bw", "atomic_bw":
		if t.pc.client {
			if err := runSizes(); err != nil {
				return nil, err
			}
			if err := t.hs(0); err != nil {
				return nil, err
			}
			last := out[len(out)-1]
			if _, err := t.pc.reports(ptReport{Size: uint64(last.Size), Iters: uint64(last.Iters), Peak: last.BWPeak,
				Avg: last.BW, MsgRate: last.MsgRate}); err != nil {
				return nil, err
			}
		} else {
			if err := t.hs(0); err != nil { // the client has finished
				return nil, err
			}
			rep, err := t.pc.reports(ptReport{})
			if err != nil {
				return nil, err
			}
			if err := t.s.verifyTargets(); err != nil {
				return nil, err
			}
			out = append(out, t.decorate(Result{Test: c.Test, Size: int(rep.Size), Iters: int(rep.Iters), BW: rep.Avg,
				BWPeak: rep.Peak, MsgRate: rep.MsgRate, Measured: "client"}))
		}
		return out, t.pc.close(t.s.my[0])
	case "send_bw", "send_lat":
		for i, size := range c.ptSizes() {
			if i > 0 && c.Test == "send_bw" {
				if err := t.hs(0); err != nil { // perftest's send_bw: after each size of -a
					return nil, err
				}
			}
			if t.traffic == nil && (!t.pc.client || c.Test == "send_lat") {
				if err := t.s.postRecvs(size); err != nil {
					return nil, err
				}
			}
			if err := t.hs(0); err != nil {
				return nil, err
			}
			r, err := traffic(size)
			if err != nil {
				return nil, err
			}
			out = append(out, t.decorate(r))
		}
		if c.AllSizes && c.Test == "send_bw" {
			if err := t.hs(0); err != nil {
				return nil, err
			}
		}
		if err := t.s.verifyTargets(); err != nil {
			return nil, err
		}
		return out, t.pc.close(t.s.my[0])
	case "write_lat":
		if err := runSizes(); err != nil {
			return nil, err
		}
		// perftest's write_lat ends here: no closing handshake.
		return out, t.s.verifyTargets()
	default: // read_lat, atomic_lat
		if t.pc.client {
			if err := runSizes(); err != nil {
				return nil, err
			}
		}
		if err := t.pc.close(t.s.my[0]); err != nil {
			return nil, err
		}
		if !t.pc.client {
			// perftest's server prints nothing here; this side says it took part (and
			// carries its counters with --stats).
			out = append(out, t.decorate(Result{Size: c.Size, Passive: true}))
		}
		return out, t.s.verifyTargets()
	}
}

// decorate fills what every result of the session carries.
func (t *ptSession) decorate(r Result) Result {
	r.Test, r.Ordering, r.Perftest, r.CM = t.cfg.Test, verbs.OrderingOrdered.String(), true, t.cm != nil
	r.PeerVersion = t.pc.remVerStr
	r.MTU = t.s.params.MTU.Bytes()
	if r.Measured == "" && !r.Passive {
		r.Measured = "server"
		if t.pc.client {
			r.Measured = "client"
		}
	}
	r.Checked = t.cfg.Check && t.traffic == nil && !r.Passive
	if t.stats {
		k := countersSince(t.s.ctx.Counters(), t.base)
		if t.pc.client {
			r.Counters = &Stats{Client: k}
		} else {
			r.Counters = &Stats{Server: k}
		}
	}
	return r
}

// ptOwnMTU is the MTU this side offers: --mtu if given (perftest's -m, never above the
// port's), otherwise the port's active MTU.
func ptOwnMTU(c *Config, dev netip.Addr) verbs.MTU {
	active := verbs.ActiveMTUFor(dev)
	if c.MTU == 0 {
		return active
	}
	m, _ := verbs.MTUFromBytes(c.MTU)
	return min(m, active)
}

// PerftestClient runs c (perftest mode) against the server at ctlAddr, a perftest tool or
// rperf, and returns this side's results (one per size). The device binds to devAddr, or
// to the control connection's local address. With c.CM (perftest's -R) there is no TCP:
// ctlAddr's port is the server's rdma_cm port, the device (on c.RoCEPort, by default
// 4791) binds to devAddr or to the address this host reaches the server from.
func PerftestClient(c Config, ctlAddr string, devAddr netip.Addr, stats bool) ([]Result, error) {
	c.Perftest = true
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.CM {
		ta, err := net.ResolveTCPAddr("tcp", ctlAddr)
		if err != nil {
			return nil, err
		}
		remote := netip.AddrPortFrom(ta.AddrPort().Addr().Unmap(), ta.AddrPort().Port())
		if !devAddr.IsValid() {
			if devAddr, err = localAddrFor(remote.Addr()); err != nil {
				return nil, err
			}
		}
		dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: devAddr, Port: c.RoCEPort, Queues: c.Queues, Faults: c.Faults,
			Window: c.Window, BusyPoll: c.BusyPoll, Capture: c.Capture})
		if err != nil {
			return nil, err
		}
		c.publish(dev)
		defer dev.Close()
		defer shareHostAddr(remote.Addr())()
		return perftestDialCM(&c, dev, remote, stats, nil)
	}
	conn, err := net.DialTimeout("tcp", ctlAddr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	defer shareHost(conn.RemoteAddr())()
	if !devAddr.IsValid() {
		devAddr = conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	}
	return perftestConn(&c, conn, conn, true, nil, devAddr, stats)
}

// perftestConn runs a session on conn (reading through r), with the device at addr or
// ctx.
func perftestConn(c *Config, conn net.Conn, r io.Reader, client bool, ctx *verbs.Device, addr netip.Addr, stats bool) ([]Result, error) {
	t := &ptSession{cfg: c, pc: &ptConn{conn: conn, r: r, client: client}, stats: stats}
	if ctx != nil {
		addr = ctx.Addr().Addr()
		t.base = ctx.Counters()
	}
	t.ownMTU = ptOwnMTU(c, addr)
	t.open = func(p ptParams) (*ptSide, error) { return newPtSide(c, client, ctx, addr, p) }
	rs, err := t.run()
	if err != nil {
		role := "server"
		if client {
			role = "client"
		}
		return rs, fmt.Errorf("%s (perftest mode, %s): %w", c.Test, role, err)
	}
	return rs, nil
}

// PerftestLoopback runs c in perftest mode with both sides in this process: the server
// listens on a TCP port of 127.0.0.1 (with c.CM, perftest's -R: on rdma_cm port
// DefaultControlPort of its device), the devices are at addrs[0] (client) and addrs[1]
// (server), both on one UDP port (c.RoCEPort, or a free one). It returns both sides'
// results.
func PerftestLoopback(c Config, addrs [2]netip.Addr, stats bool) (client, server []Result, err error) {
	c.Perftest = true
	free := c.RoCEPort == 0
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	devs, err := pairDevices(&c, addrs, free)
	if err != nil {
		return nil, nil, err
	}
	defer devs[0].Close()
	defer devs[1].Close()
	type out struct {
		rs  []Result
		err error
	}
	sc := make(chan out, 1)
	if c.CM {
		l, err := cm.Listen(devs[1], DefaultControlPort)
		if err != nil {
			return nil, nil, err
		}
		defer l.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			req, err := l.Accept(ctx)
			if err != nil {
				sc <- out{nil, err}
				return
			}
			sconf := c
			rs, err := perftestAcceptCM(&sconf, devs[1], l, req, stats, nil)
			sc <- out{rs, err}
		}()
		cconf := c
		crs, cerr := perftestDialCM(&cconf, devs[0], netip.AddrPortFrom(addrs[1], DefaultControlPort), stats, nil)
		if cerr != nil {
			cancel()
			devs[0].Close() // the server may be waiting for the next message
		}
		so := <-sc
		return crs, so.rs, errors.Join(cerr, so.err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			sc <- out{nil, err}
			return
		}
		defer conn.Close()
		sconf := c
		rs, err := perftestConn(&sconf, conn, conn, false, devs[1], netip.Addr{}, stats)
		sc <- out{rs, err}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, nil, err
	}
	cconf := c
	crs, cerr := perftestConn(&cconf, conn, conn, true, devs[0], netip.Addr{}, stats)
	if cerr != nil {
		conn.Close() // the server may be waiting for the next step
	}
	so := <-sc
	conn.Close()
	return crs, so.rs, errors.Join(cerr, so.err)
}

// pairDevices opens the two loopback devices on one UDP port: c.RoCEPort, or with free a
// port the kernel picks for the first that is also free on the second address.
func pairDevices(c *Config, addrs [2]netip.Addr, free bool) ([2]*verbs.Device, error) {
	open := func(a netip.Addr, port int, capture *verbs.PacketCapture) (*verbs.Device, error) {
		dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: a, Port: port, Queues: c.Queues, Faults: c.Faults,
			Window: c.Window, BusyPoll: c.BusyPoll, Capture: capture})
		if err == nil {
			c.publish(dev)
		}
		return dev, err
	}
	var last error
	for range 20 {
		port := c.RoCEPort
		if free {
			port = verbs.AnyPort
		}
		srv, err := open(addrs[1], port, nil)
		if err != nil {
			return [2]*verbs.Device{}, err
		}
		p := int(srv.Addr().Port())
		cli, err := open(addrs[0], p, c.Capture)
		if err == nil {
			c.RoCEPort = p
			return [2]*verbs.Device{cli, srv}, nil
		}
		srv.Close()
		last = err
		if !free {
			break
		}
	}
	return [2]*verbs.Device{}, last
}
