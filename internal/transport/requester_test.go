package transport

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/wire"
)

// TestWindow checks a QP's window (requester.openWindow), in both modes: it starts at
// BaseWindow, opens to the device's most after loss-free stretches (AckReq spaced a
// quarter window apart), and goes back to the start at a loss.
func TestWindow(t *testing.T) {
	for _, mode := range []Ordering{Ordered, Weak} {
		t.Run(mode.String(), func(t *testing.T) { testWindow(t, mode) })
	}
}

func testWindow(t *testing.T, mode Ordering) {
	lossy := wire.OpWriteMiddle // the packet to drop: a WRITE's second or later
	if mode == Weak {
		lossy = wire.OpWeakWrite
	}
	var drop atomic.Int32 // drop the drop-th next packet of opcode lossy (0: none)
	// No loss probe: on a loaded machine a stall of a few milliseconds would send a packet
	// again as if lost, and close the window (only a lost packet or a timeout should here).
	a := openSide(t, "127.0.0.1", Config{LossProbe: -1, FaultFilter: func(pkt []byte) netio.Verdict {
		if len(pkt) >= wire.BTHLen && wire.Opcode(pkt[0]) == lossy && drop.Load() > 0 && drop.Add(-1) == 0 {
			return netio.Verdict{Action: netio.Drop}
		}
		return netio.Verdict{Action: netio.Pass}
	}})
	b := openSide(t, "127.0.0.2", Config{})
	connectMode(t, a, b, wire.MTU1024, 0x100, 0x900, mode)
	// The window the next packet would be sent in (the requester opens it when it sends).
	window := func() (win int32, ackEvery int) {
		a.qp.mu.Lock()
		defer a.qp.mu.Unlock()
		return a.qp.req.openWindow(), a.qp.req.ackEvery
	}
	if w, e := window(); w != BaseWindow || e != DefaultAckReqEvery {
		t.Fatalf("a new QP's window %d, AckReq every %d packets; want %d, %d", w, e, BaseWindow, DefaultAckReqEvery)
	}
	if a.d.winMax <= BaseWindow {
		t.Skipf("the socket's receive buffer holds no more than the base window (%d packets)", a.d.winMax)
	}

	// 8,192 packets a message: the window doubles after 2,048, 4,096 and 8,192 more, so
	// after two messages; more if a stall on a loaded machine reached the ACK timeout.
	const n = 8 << 20
	src, dst := make([]byte, n), make([]byte, n)
	ms, md := reg(t, a.d, src), reg(t, b.d, dst)
	write := func(wrid uint64, length uint32) {
		t.Helper()
		_, err := a.qp.PostSend([]SendWR{{WRID: wrid, Opcode: WRWrite, Flags: FlagSignaled, RemoteAddr: md.IOVA(), RKey: md.Key(),
			SG: []SGE{{Addr: ms.IOVA(), Length: length, LKey: ms.Key()}}}})
		must(t, err)
		if c := waitCQE(t, a.cq, 1)[0]; c.Status != StatusSuccess || c.WRID != wrid {
			t.Fatalf("completion %+v, want WRID %d successful", c, wrid)
		}
	}
	wrid := uint64(1)
	for ; wrid <= 16; wrid++ {
		write(wrid, n)
		if w, _ := window(); wrid >= 2 && w == a.d.winMax {
			break
		}
	}
	if w, e := window(); w != a.d.winMax || e != int(w)/4 {
		t.Fatalf("after %d messages of %d packets: window %d, AckReq every %d packets; want %d, %d (%+v)", min(wrid, 16), n/1024, w, e, a.d.winMax, a.d.winMax/4, a.qp.Stats())
	}

	// A lost packet (the third of the next message): go-back-N after a sequence NAK, or a
	// selective retransmission after a SACK, and the window back at its start (the 100
	// packets after it are too few to open it again).
	retransmits := a.qp.Stats().Retransmits
	drop.Store(3)
	write(wrid+1, 100<<10)
	if a.qp.Stats().Retransmits == retransmits {
		t.Fatal("no retransmission: the filter dropped nothing")
	}
	if w, e := window(); w != BaseWindow || e != DefaultAckReqEvery {
		t.Fatalf("after a loss: window %d, AckReq every %d packets; want %d, %d", w, e, BaseWindow, DefaultAckReqEvery)
	}
}

// TestRequesterPacketization checks how the ordered requester turns each kind of work
// request into packets: SEND and WRITE cut at the path MTU into FIRST/MIDDLE/LAST (ONLY
// for one packet), the payload gathered across SGEs, the RETH on a WRITE's first packet,
// the immediate and the solicited bit on the last, AckReq on the last; a READ as one
// request that takes a PSN per response; atomics with their operands; PSNs assigned in
// posting order, across the 24-bit wrap.
func TestRequesterPacketization(t *testing.T) {
	cfg := newRigConfig(Ordered)
	cfg.Attr.SQPSN = 0xFFFFFE // the first SEND crosses the wrap
	rg := newQPRig(t, cfg)
	src, ms := rg.mem(8192)
	copy(src, testutil.Pattern(8192, 1))
	const raddr, rkey = 0x10000, 0x4242
	psn := wire.PSN(0xFFFFFE)
	next := func(n uint32) wire.PSN { p := psn; psn = psn.Add(n); return p }

	// SEND of 2560 bytes from two SGEs (1000 + 1560): 1024 + 1024 + 512.
	rg.post(SendWR{WRID: 1, Opcode: WRSend, Flags: FlagSolicited, SG: []SGE{sge(ms, 0, 1000), sge(ms, 4000, 1560)}})
	p := rg.sent()
	wantSent(t, p, next(3), wire.OpSendFirst, wire.OpSendMiddle, wire.OpSendLast)
	want := append(append([]byte{}, src[:1000]...), src[4000:5560]...)
	for i, n := range []int{1024, 1024, 512} {
		if !bytes.Equal(p[i].Payload, want[i*1024:i*1024+n]) {
			t.Fatalf("SEND packet %d: payload of %d bytes, not bytes %d.. of the message", i, len(p[i].Payload), i*1024)
		}
		if last := i == 2; p[i].BTH.AckReq != last || p[i].BTH.SE != last {
			t.Fatalf("SEND packet %d: AckReq %v SE %v", i, p[i].BTH.AckReq, p[i].BTH.SE)
		}
	}
	if p[0].BTH.PSN != 0xFFFFFE || p[2].BTH.PSN != 0 {
		t.Fatalf("PSNs across the wrap: %v", p)
	}

	// SEND with immediate of 101 bytes (3 bytes of pad), and an empty SEND.
	rg.post(SendWR{WRID: 2, Opcode: WRSendImm, Imm: 0xC0FFEE, SG: []SGE{sge(ms, 0, 101)}},
		SendWR{WRID: 3, Opcode: WRSend})
	p = rg.sent()
	wantSent(t, p, next(2), wire.OpSendOnlyImm, wire.OpSendOnly)
	if p[0].Imm != 0xC0FFEE || !bytes.Equal(p[0].Payload, src[:101]) || p[0].BTH.PadCnt != 3 || len(p[1].Payload) != 0 {
		t.Fatalf("SEND_ONLY_IMM imm %#x payload %d pad %d; empty SEND payload %d", p[0].Imm, len(p[0].Payload), p[0].BTH.PadCnt, len(p[1].Payload))
	}

	// WRITE of 2049 bytes: the RETH (whole message) on the first packet only; WRITE with
	// immediate in one packet.
	rg.post(SendWR{WRID: 4, Opcode: WRWrite, RemoteAddr: raddr, RKey: rkey, SG: []SGE{sge(ms, 0, 2049)}},
		SendWR{WRID: 5, Opcode: WRWriteImm, Imm: 7, RemoteAddr: raddr + 8192, RKey: rkey, SG: []SGE{sge(ms, 0, 10)}})
	p = rg.sent()
	wantSent(t, p, next(4), wire.OpWriteFirst, wire.OpWriteMiddle, wire.OpWriteLast, wire.OpWriteOnlyImm)
	if p[0].RETH != (wire.RETH{VA: raddr, RKey: rkey, DMALen: 2049}) || len(p[2].Payload) != 1 || p[2].Payload[0] != src[2048] {
		t.Fatalf("WRITE: RETH %+v, last payload %x", p[0].RETH, p[2].Payload)
	}
	if p[3].RETH != (wire.RETH{VA: raddr + 8192, RKey: rkey, DMALen: 10}) || p[3].Imm != 7 {
		t.Fatalf("WRITE_ONLY_IMM: RETH %+v imm %d", p[3].RETH, p[3].Imm)
	}

	// READ of 3000 bytes: one request, three PSNs; then the atomics, one PSN each.
	rg.post(SendWR{WRID: 6, Opcode: WRRead, RemoteAddr: raddr, RKey: rkey, SG: []SGE{sge(ms, 0, 3000)}},
		SendWR{WRID: 7, Opcode: WRAtomicCmpSwap, RemoteAddr: raddr + 8, RKey: rkey, CompareAdd: 5, Swap: 9, SG: []SGE{sge(ms, 0, 8)}},
		SendWR{WRID: 8, Opcode: WRAtomicFetch, RemoteAddr: raddr + 16, RKey: rkey, CompareAdd: 3, SG: []SGE{sge(ms, 8, 8)}})
	p = rg.sent()
	if len(p) != 3 || p[0].BTH.Opcode != wire.OpReadRequest || p[0].BTH.PSN != next(3) ||
		p[1].BTH.Opcode != wire.OpCompareSwap || p[1].BTH.PSN != next(1) || p[2].BTH.Opcode != wire.OpFetchAdd || p[2].BTH.PSN != next(1) {
		t.Fatalf("READ and atomics: %v", p)
	}
	if p[0].RETH != (wire.RETH{VA: raddr, RKey: rkey, DMALen: 3000}) || p[0].BTH.AckReq {
		t.Fatalf("READ request RETH %+v AckReq %v", p[0].RETH, p[0].BTH.AckReq)
	}
	if p[1].Atomic != (wire.AtomicETH{VA: raddr + 8, RKey: rkey, SwapAdd: 9, Compare: 5}) ||
		p[2].Atomic != (wire.AtomicETH{VA: raddr + 16, RKey: rkey, SwapAdd: 3}) {
		t.Fatalf("atomics %+v %+v", p[1].Atomic, p[2].Atomic)
	}
	if s := rg.qp.Stats(); s.TxPackets != 12 || s.Retransmits != 0 {
		t.Fatalf("counters %+v", s)
	}
}

// TestRequesterReadChunks: a READ longer than ReadChunk responses is asked for in several
// requests, each for its own part of the source and its own PSNs.
func TestRequesterReadChunks(t *testing.T) {
	cfg := newRigConfig(Ordered)
	cfg.Dev.ReadChunk = 2
	rg := newQPRig(t, cfg)
	_, ms := rg.mem(8192)
	rg.post(SendWR{WRID: 1, Opcode: WRRead, RemoteAddr: 0x10000, RKey: 1, SG: []SGE{sge(ms, 0, 5*rigMTUBytes-100)}})
	p := rg.sent()
	if len(p) != 3 {
		t.Fatalf("sent %v, want three READ requests", p)
	}
	for i, w := range []wire.RETH{{VA: 0x10000, RKey: 1, DMALen: 2048}, {VA: 0x10800, RKey: 1, DMALen: 2048}, {VA: 0x11000, RKey: 1, DMALen: 924}} {
		if p[i].BTH.Opcode != wire.OpReadRequest || p[i].BTH.PSN != wire.PSN(0x100+2*i) || p[i].RETH != w {
			t.Fatalf("request %d: %v %+v, want PSN %#x %+v", i, &p[i], p[i].RETH, 0x100+2*i, w)
		}
	}
}

// TestRequesterWindowStalls: the ordered requester sends no PSN a window or more past the
// oldest unacknowledged one; an acknowledgement moves the window, and the requester sends
// what it now admits at the end of the receive batch.
func TestRequesterWindowStalls(t *testing.T) {
	cfg := newRigConfig(Ordered)
	cfg.Dev.Window = 8
	rg := newQPRig(t, cfg)
	_, ms := rg.mem(64)
	for i := 0; i < 12; i++ {
		rg.post(SendWR{WRID: uint64(i), Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{sge(ms, 0, 8)}})
	}
	p := rg.sent()
	wantSent(t, p, 0x100, repeat(wire.OpSendOnly, 8)...)
	rg.deliver(okAck(0x102))
	if c := polled(rg.scq); len(c) != 3 || c[2].WRID != 2 || c[2].Status != StatusSuccess {
		t.Fatalf("completions %+v, want WRs 0..2", c)
	}
	wantSent(t, rg.sent(), 0x108, repeat(wire.OpSendOnly, 3)...)
	rg.deliver(okAck(0x10A))
	wantSent(t, rg.sent(), 0x10B, wire.OpSendOnly)
	rg.deliver(okAck(0x10B))
	if c := polled(rg.scq); len(c) != 9 || !rg.qp.sq.empty() {
		t.Fatalf("%d more completions, send queue empty %v", len(c), rg.qp.sq.empty())
	}
}

func repeat(op wire.Opcode, n int) []wire.Opcode {
	ops := make([]wire.Opcode, n)
	for i := range ops {
		ops[i] = op
	}
	return ops
}

// TestRequesterReadAtomicLimits: no more READ requests and atomics outstanding than
// max_rd_atomic, and a fenced request waits until those before it are answered.
func TestRequesterReadAtomicLimits(t *testing.T) {
	cfg := newRigConfig(Ordered)
	cfg.Attr.MaxRdAtomic = 2
	rg := newQPRig(t, cfg)
	_, ms := rg.mem(64)
	read := func(wrid uint64, flags uint8) SendWR {
		return SendWR{WRID: wrid, Opcode: WRRead, Flags: flags | FlagSignaled, RemoteAddr: 0x1000, RKey: 1, SG: []SGE{sge(ms, 0, 8)}}
	}
	rg.post(read(1, 0), read(2, 0), read(3, 0))
	wantSent(t, rg.sent(), 0x100, wire.OpReadRequest, wire.OpReadRequest)
	rg.deliver(rigPkt{Op: wire.OpReadResponseOnly, PSN: 0x100, Payload: make([]byte, 8)})
	wantCQE(t, polled(rg.scq), 1, StatusSuccess, WCRead)
	wantSent(t, rg.sent(), 0x102, wire.OpReadRequest)

	// A fenced SEND after the READs: it goes once both are answered.
	rg.post(SendWR{WRID: 4, Opcode: WRSend, Flags: FlagFence, SG: []SGE{sge(ms, 0, 8)}})
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("a fenced SEND went with READs outstanding: %v", p)
	}
	rg.deliver(rigPkt{Op: wire.OpReadResponseOnly, PSN: 0x101, Payload: make([]byte, 8)})
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("a fenced SEND went with a READ outstanding: %v", p)
	}
	rg.deliver(rigPkt{Op: wire.OpReadResponseOnly, PSN: 0x102, Payload: make([]byte, 8)})
	wantSent(t, rg.sent(), 0x103, wire.OpSendOnly)
}

// TestRequesterGoBackAfterTimeout: when the local ACK timeout fires, the ordered requester
// sends again from the oldest unacknowledged PSN (inside a message: from that packet on),
// counting a retry and each packet sent again.
func TestRequesterGoBackAfterTimeout(t *testing.T) {
	cfg := newRigConfig(Ordered)
	cfg.Attr.Timeout = 10 // 4.2 ms
	rg := newQPRig(t, cfg)
	_, ms := rg.mem(4096)
	rg.post(SendWR{WRID: 1, Opcode: WRSend, SG: []SGE{sge(ms, 0, 3000)}}, SendWR{WRID: 2, Opcode: WRSend, SG: []SGE{sge(ms, 0, 10)}})
	wantSent(t, rg.sent(), 0x100, wire.OpSendFirst, wire.OpSendMiddle, wire.OpSendLast, wire.OpSendOnly)
	rg.deliver(okAck(0x100))
	rto := wire.AckTimeout(10)
	rg.after(rto - 1)
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("sent before the timeout: %v", p)
	}
	rg.after(1)
	p := rg.sent()
	wantSent(t, p, 0x101, wire.OpSendMiddle, wire.OpSendLast, wire.OpSendOnly)
	if !p[1].BTH.AckReq || !p[2].BTH.AckReq {
		t.Fatal("no AckReq on the messages' last packets sent again")
	}
	if s := rg.qp.Stats(); s.Timeouts != 1 || s.Retransmits != 3 || rg.qp.comp.retryLeft != 6 {
		t.Fatalf("after the timeout: %+v, retries left %d", s, rg.qp.comp.retryLeft)
	}
	if rg.qp.req.win != rg.d.winBase {
		t.Fatalf("window %d after a timeout, want %d", rg.qp.req.win, rg.d.winBase)
	}
}

// TestRequesterPiggybacksAck: an ACK the responder held back (a consumer was polling)
// rides along after the next request the QP sends.
func TestRequesterPiggybacksAck(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	dst, md := rg.mem(64)
	rg.deliverPolling(rigPkt{Op: wire.OpWriteOnly, PSN: 0x200, AckReq: true, RETH: wire.RETH{VA: md.IOVA(), RKey: md.Key(), DMALen: 4}, Payload: []byte("data")})
	if p := rg.sent(); len(p) != 0 || string(dst[:4]) != "data" {
		t.Fatalf("sent %v while a consumer polls; placed %q", p, dst[:4])
	}
	rg.post(SendWR{WRID: 1, Opcode: WRSend, SG: []SGE{sge(md, 0, 4)}})
	p := rg.sent()
	if len(p) != 2 || p[0].BTH.Opcode != wire.OpSendOnly || p[1].BTH.Opcode != wire.OpAcknowledge || p[1].BTH.PSN != 0x200 {
		t.Fatalf("sent %v, want the SEND and the held-back ACK of PSN 0x200", p)
	}
	if rg.qp.resp.ackDeferred || rg.qp.resp.ackPending {
		t.Fatal("the ACK is still held back after it went")
	}
}

// TestRequesterLocalErrors: a work request whose local memory failed its check at post
// time fails the QP when it is reached, once those before it completed; so does a READ
// on a QP with max_rd_atomic 0.
func TestRequesterLocalErrors(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	_, ms := rg.mem(64)
	rg.post(SendWR{WRID: 1, Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{sge(ms, 0, 8)}},
		SendWR{WRID: 2, Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{{Addr: ms.IOVA(), Length: 8, LKey: ms.Key() ^ 0x100}}})
	wantSent(t, rg.sent(), 0x100, wire.OpSendOnly)
	rg.deliver(okAck(0x100))
	c := polled(rg.scq)
	if len(c) != 2 || c[0].Status != StatusSuccess || c[1].WRID != 2 || c[1].Status != StatusLocProtErr || c[1].VendorErr != VendorBadLKey {
		t.Fatalf("completions %+v", c)
	}
	if rg.qp.State() != StateErr {
		t.Fatalf("state %v", rg.qp.State())
	}

	cfg := newRigConfig(Ordered)
	cfg.Attr.MaxRdAtomic = 0
	rg = newQPRig(t, cfg)
	_, ms = rg.mem(64)
	rg.post(SendWR{WRID: 3, Opcode: WRRead, RemoteAddr: 0x1000, RKey: 1, SG: []SGE{sge(ms, 0, 8)}})
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("a READ went with max_rd_atomic 0: %v", p)
	}
	wantCQE(t, polled(rg.scq), 3, StatusLocQPOpErr, WCRead)
}

// TestRequesterSQD: in SQD the requester starts no new work request; the send queue
// drains (SQ_DRAINED once nothing is outstanding), and back in RTS what waited goes.
func TestRequesterSQD(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	_, ms := rg.mem(64)
	rg.post(SendWR{WRID: 1, Opcode: WRSend, SG: []SGE{sge(ms, 0, 8)}})
	wantSent(t, rg.sent(), 0x100, wire.OpSendOnly)
	must(t, rg.qp.Modify(&Attr{State: StateSQD, SQDNotify: true}, MaskState|MaskEnSQDAsyncNotif, lim))
	rg.post(SendWR{WRID: 2, Opcode: WRSend, SG: []SGE{sge(ms, 0, 8)}})
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("sent in SQD: %v", p)
	}
	if e := rg.takeEvents(); len(e) != 0 {
		t.Fatalf("drained with a SEND outstanding: %+v", e)
	}
	rg.deliver(okAck(0x100))
	wantEvent(t, rg.takeEvents(), EventSQDrained)
	must(t, rg.qp.Modify(&Attr{State: StateRTS}, MaskState, lim))
	wantSent(t, rg.sent(), 0x101, wire.OpSendOnly)
}
