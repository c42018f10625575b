package transport

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// The role tests' rig: one QP, in the state and ordering mode a test asks for, on a device
// without sockets (Device.bare), facing a peer that exists only in the test. The test
// builds the peer's packets (rigPkt) and puts them into the device's receive path as a
// receive queue does after reading them from its socket (deliver); it reads what the QP
// emitted (sent: the packets it would have put on the wire, decoded), its completions
// (polled) and the device's asynchronous events (takeEvents). The device's clock stands
// still unless the test moves it, and its timers fire only when the test runs them
// (after). Nothing runs in another goroutine, so every test is a sequence of steps whose
// outcome depends on nothing but the steps.
//
// The rigs of the UDP tests (pktRig, fuzzRig) put the same engine on real sockets; they
// stay as integration tests.

// The rig's addresses: no socket is ever bound to them.
var (
	rigLocal = netip.MustParseAddrPort("192.0.2.1:4791")
	rigPeer  = netip.MustParseAddrPort("192.0.2.2:4791")
)

// rigPeerQPN is the QP number of the rig's imaginary peer.
const rigPeerQPN = 0xABCDE

// rigStart is the device time at which a rig's clock starts (not 0, which some deadlines
// take to mean "not armed").
const rigStart = int64(time.Second)

// rigConfig says what QP a rig builds. newRigConfig gives the defaults; tests change what
// they are about.
type rigConfig struct {
	Dev     Config  // the device (Local, Queues and RecvBatch are the rig's)
	Service Service // RC (default) or UD
	State   QPState // the state the QP is brought to (RESET..RTS)
	QP      QPConfig
	// The attributes of the transitions to INIT, RTR and RTS (RC: Peer and DestQPN are the
	// rig's peer; UD: QKey is the Q_Key).
	Attr Attr
}

// newRigConfig returns the defaults: an RC QP in RTS in ordering mode mode, path MTU
// 1024, PSNs 0x100 (sent) and 0x200 (expected), every remote access, 4 READ/atomic
// resources each way, ACK timeout 0 (none: a test that wants one sets it), 7 retries of
// each kind, the smallest RNR timer, no loss probe.
func newRigConfig(mode Ordering) rigConfig {
	return rigConfig{
		Dev:   Config{LossProbe: -1},
		State: StateRTS,
		QP:    QPConfig{PD: 1, MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInline: 64},
		Attr: Attr{
			PathMTU: wire.MTU1024, SQPSN: 0x100, RQPSN: 0x200, Ordering: mode,
			Access:      tpt.LocalWrite | tpt.RemoteWrite | tpt.RemoteRead | tpt.RemoteAtomic,
			MaxRdAtomic: 4, MaxDestRdAtomic: 4, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1, QKey: 0x11111111, Port: 1,
		},
	}
}

// rigMTUBytes is the path MTU of newRigConfig in bytes.
const rigMTUBytes = 1024

// qpRig is a QP under test on a device without sockets (see the top of this file).
type qpRig struct {
	t      testing.TB
	cfg    rigConfig
	d      *Device
	scq    *CQ // the QP's send CQ
	rcq    *CQ // its receive CQ
	qp     *QP
	out    []capturedPkt
	events []Event
}

// capturedPkt is a packet the device emitted, to where.
type capturedPkt struct {
	to  netip.AddrPort
	pkt []byte
}

// newQPRig builds the rig's device and QP as cfg says.
func newQPRig(t testing.TB, cfg rigConfig) *qpRig {
	t.Helper()
	rg := &qpRig{t: t, cfg: cfg}
	rg.d = newBareDevice(t, cfg.Dev, func(to netip.AddrPort, pkt []byte) {
		rg.out = append(rg.out, capturedPkt{to, pkt})
	})
	rg.d.OnEvent = func(e Event) { rg.events = append(rg.events, e) }
	rg.scq, rg.rcq = rg.d.NewCQ(256), rg.d.NewCQ(256)
	qc := cfg.QP
	qc.Service, qc.SendCQ, qc.RecvCQ = cfg.Service, rg.scq, rg.rcq
	qp, err := rg.d.CreateQP(qc)
	must(t, err)
	rg.qp = qp
	rg.bringUp(cfg.State)
	return rg
}

// newBareDevice makes a device without sockets whose packets go to capture (see bareIO).
// Its socket is a netio.Conn never opened: the engine takes addresses from it, and never
// sends or receives through it.
func newBareDevice(t testing.TB, cfg Config, capture func(to netip.AddrPort, pkt []byte)) *Device {
	t.Helper()
	cfg.Local, cfg.Queues, cfg.RecvBatch = rigLocal, 1, 1
	cfg, err := cfg.withDefaults()
	must(t, err)
	d := newDevice(cfg, []*netio.Conn{new(netio.Conn)}, &tap{local: rigLocal}, cfg.Window)
	d.bare = &bareIO{capture: capture, clock: rigStart}
	t.Cleanup(func() { d.Close() })
	return d
}

// bringUp moves the rig's QP from RESET through INIT, RTR and RTS up to state, with the
// rig's attributes.
func (rg *qpRig) bringUp(state QPState) {
	t, q, a := rg.t, rg.qp, rg.cfg.Attr
	t.Helper()
	step := func(s QPState, mask uint32) {
		t.Helper()
		a := a
		a.State = s
		must(t, q.Modify(&a, MaskState|mask, lim))
	}
	ud := rg.cfg.Service == ServiceUD
	if state >= StateInit {
		if ud {
			step(StateInit, MaskPKeyIndex|MaskPort|MaskQKey)
		} else {
			step(StateInit, MaskPKeyIndex|MaskPort|MaskAccessFlags)
		}
	}
	if state >= StateRTR {
		if ud {
			step(StateRTR, 0)
		} else {
			a.Peer, a.DestQPN = rigPeer, rigPeerQPN
			step(StateRTR, MaskAV|MaskPathMTU|MaskDestQPN|MaskRQPSN|MaskMaxDestRdAtomic|MaskMinRNRTimer|MaskOrdering)
		}
	}
	if state >= StateRTS {
		if ud {
			step(StateRTS, MaskSQPSN)
		} else {
			step(StateRTS, MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskSQPSN|MaskMaxQPRdAtomic)
		}
	}
}

// Memory.

// mem registers a buffer of n bytes (every access right) and returns it with its region.
func (rg *qpRig) mem(n int) ([]byte, *tpt.Region) {
	b := make([]byte, n)
	r, err := rg.d.MRs().Register(1, b, uint64(uintptr(unsafe.Pointer(&b[0]))), tpt.LocalWrite|tpt.RemoteWrite|tpt.RemoteRead|tpt.RemoteAtomic)
	must(rg.t, err)
	return b, r
}

// sge is the scatter/gather element of bytes [off, off+n) of r.
func sge(r *tpt.Region, off, n int) SGE {
	return SGE{Addr: r.IOVA() + uint64(off), Length: uint32(n), LKey: r.Key()}
}

// What the test does as the application.

// post posts send work requests, which the QP builds into packets at once (as PostSend
// does in the poster's goroutine).
func (rg *qpRig) post(wrs ...SendWR) {
	rg.t.Helper()
	_, err := rg.qp.PostSend(wrs)
	must(rg.t, err)
}

// postRecv posts a receive work request of one SGE per element of sg.
func (rg *qpRig) postRecv(wrid uint64, sg ...SGE) {
	rg.t.Helper()
	_, err := rg.qp.PostRecv([]RecvWR{{WRID: wrid, SG: sg}})
	must(rg.t, err)
}

// polled returns the completions waiting on cq.
func polled(cq *CQ) []CQE {
	var out []CQE
	buf := make([]CQE, 16)
	for n := cq.Poll(buf); n > 0; n = cq.Poll(buf) {
		out = append(out, buf[:n]...)
	}
	return out
}

// takeEvents returns and forgets the asynchronous events raised so far.
func (rg *qpRig) takeEvents() []Event {
	e := rg.events
	rg.events = nil
	return e
}

// What the peer does.

// rigPkt is a packet of the peer to the rig's QP: its opcode and PSN, the headers its
// opcode has (the others are ignored), and its payload.
type rigPkt struct {
	Op         wire.Opcode
	PSN        wire.PSN
	AckReq, SE bool
	DestQP     uint32 // 0: the rig's QP
	DETH       wire.DETH
	RETH       wire.RETH
	AETH       wire.AETH
	Atomic     wire.AtomicETH
	AtomicAck  uint64
	Imm        uint32
	OOH        wire.OOH      // weakly-ordered requests
	SACK       [][2]wire.PSN // a weak ACK's ranges
	SACKCount  int           // the number of ranges its header announces (0: len(SACK))
	Echo       uint32        // a weak ACK's echoed transmission number
	Payload    []byte
}

// packet builds p as the peer sends it: headers, payload, pad and ICRC.
func (rg *qpRig) packet(p rigPkt) []byte {
	dst := p.DestQP
	if dst == 0 {
		dst = rg.qp.QPN()
	}
	info := p.Op.Info()
	payload := p.Payload
	if p.Op == wire.OpWeakAck {
		payload = make([]byte, len(p.SACK)*wire.SACKRangeLen)
		wire.PutSACKRanges(payload, p.SACK)
	}
	fl := wiretest.Flow(rigPeer, rigLocal)
	bth := wire.BTH{Opcode: p.Op, PKey: wire.DefaultPKey, DestQP: dst, PSN: p.PSN, AckReq: p.AckReq, SE: p.SE}
	return wiretest.Build(&fl, bth, func(hdr []byte) {
		off := wire.BTHLen
		f := info.Flags
		if f&wire.HasDETH != 0 {
			p.DETH.Put(hdr[off:])
			off += wire.DETHLen
		}
		if f&wire.HasRETH != 0 {
			p.RETH.Put(hdr[off:])
			off += wire.RETHLen
		}
		if f&wire.HasAETH != 0 {
			p.AETH.Put(hdr[off:])
			off += wire.AETHLen
		}
		if f&wire.HasAtomicETH != 0 {
			p.Atomic.Put(hdr[off:])
			off += wire.AtomicETHLen
		}
		if f&wire.HasAtomicAckETH != 0 {
			binary.BigEndian.PutUint64(hdr[off:], p.AtomicAck)
			off += wire.AtomicAckETHLen
		}
		if f&wire.HasImmDt != 0 {
			binary.BigEndian.PutUint32(hdr[off:], p.Imm)
		}
		switch {
		case p.Op == wire.OpWeakAck:
			n := p.SACKCount
			if n == 0 {
				n = len(p.SACK)
			}
			wire.PutSACKHeader(hdr[info.HdrLen-wire.SACKHeaderLen:], n, p.Echo)
		case f&wire.IsWeak != 0:
			wiretest.PutOOH(hdr, p.OOH)
		}
	}, payload)
}

// deliver puts the peer's packets into the device's receive path as one receive batch
// brings them (queue.processBatch): each is handled in turn, then the batch ends, which
// sends coalesced ACKs and pending responses and lets the requester send what the ACKs
// released.
func (rg *qpRig) deliver(pkts ...rigPkt) {
	raw := make([][]byte, len(pkts))
	for i, p := range pkts {
		raw[i] = rg.packet(p)
	}
	rg.deliverRaw(raw...)
}

// deliverRaw is deliver for packets already built.
func (rg *qpRig) deliverRaw(pkts ...[]byte) {
	u := rg.d.q0()
	u.rxMu.Lock()
	defer u.rxMu.Unlock()
	for _, p := range pkts {
		u.input(p, rigPeer)
		if u.flushNow {
			u.flushNow = false
			u.flushOut()
		}
	}
	u.finishBatch()
}

// ack is an ordered ACK (or NAK: syndrome syn) for psn, with MSN msn.
func ack(psn wire.PSN, syn uint8, msn uint32) rigPkt {
	return rigPkt{Op: wire.OpAcknowledge, PSN: psn, AETH: wire.AETH{Syndrome: syn, MSN: msn}}
}

// okAck is an ordered ACK of every PSN up to psn.
func okAck(psn wire.PSN) rigPkt { return ack(psn, wire.AETHAck|wire.NoCredits, 0) }

// nak is an ordered NAK with code code for psn.
func nak(psn wire.PSN, code uint8) rigPkt { return ack(psn, wire.AETHNak|code, 0) }

// rnrNak is an RNR NAK for psn asking for RNR timer code timer.
func rnrNak(psn wire.PSN, timer uint8) rigPkt { return ack(psn, wire.AETHRNR|timer, 0) }

// sack is a weakly-ordered acknowledgement (syndrome syn): every PSN up to cum, and the
// ranges beyond; echo is the highest transmission number it says arrived.
func sack(cum wire.PSN, syn uint8, echo uint32, ranges ...[2]wire.PSN) rigPkt {
	return rigPkt{Op: wire.OpWeakAck, PSN: cum, AETH: wire.AETH{Syndrome: syn}, SACK: ranges, Echo: echo}
}

// What the QP emitted.

// sentPkt is a packet the QP emitted, decoded.
type sentPkt struct {
	wire.Packet
	to   netip.AddrPort
	ooh  wire.OOH      // weakly-ordered requests
	sack [][2]wire.PSN // a weak ACK's ranges
}

func (p sentPkt) String() string {
	return fmt.Sprintf("%v PSN %#x", p.BTH.Opcode, uint32(p.BTH.PSN))
}

// sent returns and forgets the packets the QP emitted since the last call, decoded and
// checked: each must decode, carry the ICRC its flow gives it and go to the peer's QP
// (RC) or the address handle's (UD: any QP).
func (rg *qpRig) sent() []sentPkt {
	t := rg.t
	t.Helper()
	var out []sentPkt
	for _, c := range rg.out {
		var s sentPkt
		s.to = c.to
		if err := s.Decode(c.pkt); err != nil {
			t.Fatalf("the QP emitted an undecodable packet %x: %v", c.pkt, err)
		}
		fl := wiretest.Flow(rigLocal, c.to)
		if rg.cfg.Service == ServiceRC {
			fl = rg.qp.txFlow
			if c.to != rigPeer || s.BTH.DestQP != rigPeerQPN {
				t.Fatalf("%v went to %v QP %#x, not the peer", &s, c.to, s.BTH.DestQP)
			}
		}
		if !fl.VerifyICRC(c.pkt) {
			t.Fatalf("%v: wrong ICRC", &s)
		}
		switch {
		case s.BTH.Opcode == wire.OpWeakAck:
			r, err := wire.DecodeSACK(s.Ext, s.Payload, nil)
			if err != nil {
				t.Fatalf("%v: %v", &s, err)
			}
			s.sack = r
		case s.Info.Flags&wire.IsWeak != 0:
			o, err := wire.DecodeOOH(s.Ext)
			if err != nil {
				t.Fatalf("%v: %v", &s, err)
			}
			s.ooh = o
		}
		out = append(out, s)
	}
	rg.out = nil
	return out
}

// Time.

// after moves the device's clock d ahead and runs the timers then due, as the timer
// goroutine would on waking.
func (rg *qpRig) after(d time.Duration) {
	rg.d.bare.clock += int64(d)
	rg.d.q0().timers.expire()
}

// Checks.

// wantSent fails the test unless pkts are, in order, of opcodes ops at consecutive PSNs
// from first.
func wantSent(t testing.TB, pkts []sentPkt, first wire.PSN, ops ...wire.Opcode) {
	t.Helper()
	if len(pkts) != len(ops) {
		t.Fatalf("sent %v, want %d packets %v from PSN %#x", pkts, len(ops), ops, uint32(first))
	}
	for i, p := range pkts {
		if p.BTH.Opcode != ops[i] || p.BTH.PSN != first.Add(uint32(i)) {
			t.Fatalf("packet %d is %v, want %v PSN %#x (sent %v)", i, &p, ops[i], uint32(first.Add(uint32(i))), pkts)
		}
	}
}

// wantAck fails the test unless pkts are one ordered acknowledgement, syndrome syn, PSN psn.
func wantAck(t testing.TB, pkts []sentPkt, syn uint8, psn wire.PSN) *sentPkt {
	t.Helper()
	if len(pkts) != 1 || pkts[0].BTH.Opcode != wire.OpAcknowledge || pkts[0].AETH.Syndrome != syn || pkts[0].BTH.PSN != psn {
		t.Fatalf("sent %v (syndromes %v), want one acknowledgement %#x for PSN %#x", pkts, syndromes(pkts), syn, uint32(psn))
	}
	return &pkts[0]
}

func syndromes(pkts []sentPkt) []string {
	var s []string
	for _, p := range pkts {
		if p.Info.Flags&wire.HasAETH != 0 {
			s = append(s, fmt.Sprintf("%#x", p.AETH.Syndrome))
		}
	}
	return s
}

// wantCQE fails the test unless cqes is one completion of work request wrid with status
// st and opcode op.
func wantCQE(t testing.TB, cqes []CQE, wrid uint64, st uint8, op uint8) CQE {
	t.Helper()
	if len(cqes) != 1 || cqes[0].WRID != wrid || cqes[0].Status != st || cqes[0].Opcode != op {
		t.Fatalf("completions %+v, want one of WR %d, status %d, opcode %d", cqes, wrid, st, op)
	}
	return cqes[0]
}

// wantEvent fails the test unless evs is one event of type typ.
func wantEvent(t testing.TB, evs []Event, typ EventType) {
	t.Helper()
	if len(evs) != 1 || evs[0].Type != typ {
		t.Fatalf("events %+v, want one of type %d", evs, typ)
	}
}

// TestRigNoSockets checks the rig itself: its device has no socket to send through or read
// (a bare device never calls them), its QP's packets arrive whole in the capture with a
// valid ICRC, and its clock moves only when the test moves it.
func TestRigNoSockets(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	if n, err := rg.d.q0().poll(); n != 0 || err != nil {
		t.Fatalf("a bare device's queue received %d, %v", n, err)
	}
	src, ms := rg.mem(100)
	copy(src, "hello")
	rg.post(SendWR{WRID: 1, Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{sge(ms, 0, 5)}})
	p := rg.sent()
	wantSent(t, p, 0x100, wire.OpSendOnly)
	if string(p[0].Payload) != "hello" || !p[0].BTH.AckReq {
		t.Fatalf("SEND_ONLY %q AckReq %v", p[0].Payload, p[0].BTH.AckReq)
	}
	if now := rg.d.now(); now != rigStart {
		t.Fatalf("the clock moved by itself: %d", now)
	}
	rg.after(time.Millisecond)
	if now := rg.d.now(); now != rigStart+int64(time.Millisecond) {
		t.Fatalf("the clock at %d after a millisecond", now)
	}
}

// deliverPolling is deliver while a consumer polls the queue (processBatch with
// queue.polling): ACKs are held back to ride along with the consumer's next send.
func (rg *qpRig) deliverPolling(pkts ...rigPkt) {
	u := rg.d.q0()
	u.rxMu.Lock()
	u.polling = true
	u.rxMu.Unlock()
	rg.deliver(pkts...)
	u.rxMu.Lock()
	u.polling = false
	u.rxMu.Unlock()
}
