package transport

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/wire"
)

// The weakly-ordered requester's own tests (weak_requester.go): how its packets describe
// themselves, the window of packets in flight, what it sends again after a timeout and
// when the loss probe fires. Loss detection from SACKs is the completer's
// (weak_completer_test.go).

// TestWeakRequesterPacketization: every weak packet carries its OOH (receive sequence
// number for a SEND or WRITE with immediate, read sequence number for a READ request or
// atomic, offset and length in its message, transmission number), and every WRITE packet
// a RETH for its own payload.
func TestWeakRequesterPacketization(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Weak))
	_, ms := rg.mem(4096)
	const raddr, rkey = 0x10000, 7
	rg.post(SendWR{WRID: 1, Opcode: WRSend, SG: []SGE{sge(ms, 0, 2500)}},
		SendWR{WRID: 2, Opcode: WRWrite, RemoteAddr: raddr, RKey: rkey, SG: []SGE{sge(ms, 0, 1500)}},
		SendWR{WRID: 3, Opcode: WRSendImm, Imm: 3, SG: []SGE{sge(ms, 0, 10)}},
		SendWR{WRID: 4, Opcode: WRWriteImm, Imm: 4, RemoteAddr: raddr, RKey: rkey, SG: []SGE{sge(ms, 0, 5)}},
		SendWR{WRID: 5, Opcode: WRRead, RemoteAddr: raddr, RKey: rkey, SG: []SGE{sge(ms, 0, 3000)}},
		SendWR{WRID: 6, Opcode: WRAtomicCmpSwap, RemoteAddr: raddr, RKey: rkey, CompareAdd: 1, Swap: 2, SG: []SGE{sge(ms, 0, 8)}},
		SendWR{WRID: 7, Opcode: WRAtomicFetch, RemoteAddr: raddr, RKey: rkey, CompareAdd: 3, SG: []SGE{sge(ms, 8, 8)}})
	p := rg.sent()
	type want struct {
		op     wire.Opcode
		psn    wire.PSN
		seq    wire.PSN // OOH.Seq (not checked for a plain WRITE, which has none)
		off    uint32
		length uint32
		recv   bool
		va     uint64 // RETH.VA (WRITEs, READ)
	}
	wants := []want{
		{wire.OpWeakSend, 0x100, 0, 0, 2500, true, 0},
		{wire.OpWeakSend, 0x101, 0, 1024, 2500, true, 0},
		{wire.OpWeakSend, 0x102, 0, 2048, 2500, true, 0},
		{wire.OpWeakWrite, 0x103, 0, 0, 1500, false, raddr},
		{wire.OpWeakWrite, 0x104, 0, 1024, 1500, false, raddr + 1024},
		{wire.OpWeakSendImm, 0x105, 1, 0, 10, true, 0},
		{wire.OpWeakWriteImm, 0x106, 2, 0, 5, true, raddr},
		{wire.OpWeakReadReq, 0x107, 0, 0, 3000, false, raddr},
		{wire.OpWeakCmpSwap, 0x10A, 1, 0, 8, false, 0},
		{wire.OpWeakFetchAdd, 0x10B, 2, 0, 8, false, 0},
	}
	if len(p) != len(wants) {
		t.Fatalf("sent %v, want %d packets", p, len(wants))
	}
	for i, w := range wants {
		o := p[i].ooh
		plainWrite := w.op == wire.OpWeakWrite
		if p[i].BTH.Opcode != w.op || p[i].BTH.PSN != w.psn || !plainWrite && o.Seq != w.seq || o.Offset != w.off || o.Length != w.length ||
			(o.Flags&wire.OOHRecv != 0) != w.recv || o.TxSeq != uint32(i+1) {
			t.Fatalf("packet %d: %v OOH %+v, want %+v (transmission %d)", i, p[i], o, w, i+1)
		}
		if p[i].Info.Flags&wire.HasRETH != 0 && p[i].RETH.VA != w.va {
			t.Fatalf("packet %d: %v RETH %+v, want VA %#x", i, p[i], p[i].RETH, w.va)
		}
	}
	if p[3].RETH.DMALen != 1500 || p[7].RETH.DMALen != 3000 || p[8].Atomic.SwapAdd != 2 || p[8].Atomic.Compare != 1 || p[9].Atomic.SwapAdd != 3 {
		t.Fatalf("WRITE RETH %+v, READ RETH %+v, atomics %+v %+v", p[3].RETH, p[7].RETH, p[8].Atomic, p[9].Atomic)
	}
	if rg.qp.weak.req.inflight != 12 {
		t.Fatalf("%d PSNs in flight, want 12", rg.qp.weak.req.inflight)
	}
}

// TestWeakRequesterWindowCountsInFlight: weak mode's window bounds the packets in flight,
// not PSNs past the oldest unacknowledged one: PSNs a SACK acknowledges beyond a hole let
// as many new packets go while the hole stays open.
func TestWeakRequesterWindowCountsInFlight(t *testing.T) {
	cfg := newRigConfig(Weak)
	cfg.Dev.Window = 8
	rg := newQPRig(t, cfg)
	_, ms := rg.mem(64)
	for i := 0; i < 12; i++ {
		rg.post(SendWR{WRID: uint64(i), Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{sge(ms, 0, 8)}})
	}
	wantSent(t, rg.sent(), 0x100, repeat(wire.OpWeakSend, 8)...)
	rg.deliver(sack(0xFF, ackSyn, 6, [2]wire.PSN{0x102, 0x106}))
	wantSent(t, rg.sent(), 0x108, repeat(wire.OpWeakSend, 4)...)
	if c := polled(rg.scq); len(c) != 0 || rg.qp.req.una != 0x100 {
		t.Fatalf("completions %+v behind the hole at 0x100, una %#x", c, uint32(rg.qp.req.una))
	}
	rg.deliver(sack(0x10B, ackSyn, 12))
	if c := polled(rg.scq); len(c) != 12 || c[11].WRID != 11 {
		t.Fatalf("%d completions once everything was acknowledged", len(c))
	}
}

// TestWeakRequesterTimeout: at the local ACK timeout only the PSNs not yet acknowledged go
// again, each alone with AckReq; the timeout uses a retry and doubles itself until
// something new is acknowledged.
func TestWeakRequesterTimeout(t *testing.T) {
	cfg := newRigConfig(Weak)
	cfg.Attr.Timeout = 10
	rg := newQPRig(t, cfg)
	rto := wire.AckTimeout(10)
	_, ms := rg.mem(64)
	for i := 0; i < 4; i++ {
		rg.post(SendWR{WRID: uint64(i), Opcode: WRSend, SG: []SGE{sge(ms, 0, 8)}})
	}
	rg.sent()
	rg.deliver(sack(0xFF, ackSyn, 4, [2]wire.PSN{0x101, 0x102}, [2]wire.PSN{0x103, 0x104}))
	rg.after(rto)
	p := rg.sent()
	wantPSNs(t, p, 0x100, 0x102)
	for _, x := range p {
		if !x.BTH.AckReq || x.ooh.TxSeq <= 4 {
			t.Fatalf("retransmission %v: AckReq %v, transmission %d", x, x.BTH.AckReq, x.ooh.TxSeq)
		}
	}
	if s := rg.qp.Stats(); s.Timeouts != 1 || s.SelectiveRetransmits != 2 || rg.qp.comp.retryLeft != 6 {
		t.Fatalf("after the timeout: %+v, retries left %d", s, rg.qp.comp.retryLeft)
	}
	rg.after(2*rto - 1)
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("the timeout did not double: %v", p)
	}
	rg.after(1)
	wantPSNs(t, rg.sent(), 0x100, 0x102)
}

// wantPSNs fails the test unless pkts are at PSNs psns, in order.
func wantPSNs(t *testing.T, pkts []sentPkt, psns ...wire.PSN) {
	t.Helper()
	if len(pkts) != len(psns) {
		t.Fatalf("sent %v, want PSNs %x", pkts, psns)
	}
	for i := range psns {
		if pkts[i].BTH.PSN != psns[i] {
			t.Fatalf("sent %v, want PSNs %x", pkts, psns)
		}
	}
}

// TestWeakRequesterLossProbe: when nothing was acknowledged for a probe interval, the
// loss probe sends the first missing PSN again, using no retry; the next probe waits
// twice as long.
func TestWeakRequesterLossProbe(t *testing.T) {
	cfg := newRigConfig(Weak)
	cfg.Dev.LossProbe = 4 * time.Millisecond
	rg := newQPRig(t, cfg)
	_, ms := rg.mem(64)
	rg.post(SendWR{WRID: 1, Opcode: WRSend, SG: []SGE{sge(ms, 0, 8)}}, SendWR{WRID: 2, Opcode: WRSend, SG: []SGE{sge(ms, 0, 8)}})
	rg.sent()
	rg.after(4*time.Millisecond - 1)
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("probe before its interval: %v", p)
	}
	rg.after(1)
	wantPSNs(t, rg.sent(), 0x100)
	if s := rg.qp.Stats(); s.SelectiveRetransmits != 1 || s.Timeouts != 0 || rg.qp.comp.retryLeft != 7 {
		t.Fatalf("after the probe: %+v, retries left %d", s, rg.qp.comp.retryLeft)
	}
	rg.after(8*time.Millisecond - 1)
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("second probe before twice the interval: %v", p)
	}
	rg.after(1)
	wantPSNs(t, rg.sent(), 0x100)
}
