package transport

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// Requester-side buffer layout: a source region (SEND/WRITE data) and a destination region
// (READ and atomic results), with canaries around both.
const (
	txGap    = 256
	txSrcOff = txGap
	txSrcLen = 2048
	txDstOff = txSrcOff + txSrcLen + txGap
	txDstLen = 4096
	txTotal  = txDstOff + txDstLen + txGap
)

// Work request i of requesterWRs addresses remote memory [requesterRemoteBase+i*0x1000,
// +requesterRemoteLen[i]).
const requesterRemoteBase = 0x10000

var requesterRemoteLen = [...]uint64{0, 600, 8, 300, 8, 1000, 0, 0}

// requesterWRs returns the work requests FuzzRequesterResponses posts, selected by mask,
// and the destination spans they may write.
func requesterWRs(src, dst *tpt.Region, mask uint8, fence bool) ([]SendWR, []span) {
	if mask == 0 {
		mask = 0xFF
	}
	s := func(off, n int) SGE { return SGE{Addr: src.IOVA() + uint64(off), Length: uint32(n), LKey: src.Key()} }
	d := func(off, n int) SGE { return SGE{Addr: dst.IOVA() + uint64(off), Length: uint32(n), LKey: dst.Key()} }
	var ff uint8
	if fence {
		ff = FlagFence
	}
	all := []struct {
		wr    SendWR
		spans []span
	}{
		{SendWR{Opcode: WRSend, SG: []SGE{s(0, 100)}}, nil},
		{SendWR{Opcode: WRRead, SG: []SGE{d(64, 300), d(512, 300)}}, []span{{64, 300}, {512, 300}}},
		{SendWR{Opcode: WRAtomicFetch, CompareAdd: 3, SG: []SGE{d(1024, 8)}}, []span{{1024, 8}}},
		{SendWR{Opcode: WRWrite, SG: []SGE{s(100, 300)}}, nil},
		{SendWR{Opcode: WRAtomicCmpSwap, Flags: ff, CompareAdd: 0, Swap: 9, SG: []SGE{d(1040, 8)}}, []span{{1040, 8}}},
		{SendWR{Opcode: WRRead, Flags: ff, SG: []SGE{d(1100, 1000)}}, []span{{1100, 1000}}},
		{SendWR{Opcode: WRRead}, nil}, // zero-length READ
		{SendWR{Opcode: WRWriteImm, Imm: 5}, nil},
	}
	var wrs []SendWR
	var spans []span
	for i, w := range all {
		if mask&(1<<i) == 0 {
			continue
		}
		w.wr.WRID = uint64(i)
		w.wr.Flags |= FlagSignaled
		w.wr.RemoteAddr, w.wr.RKey = requesterRemoteBase+uint64(i)*0x1000, 0x123456
		wrs = append(wrs, w.wr)
		for _, sp := range w.spans {
			spans = append(spans, span{txDstOff + sp.off, sp.n})
		}
	}
	return wrs, spans
}

// FuzzRequesterResponses feeds ACKs, NAKs, READ responses and atomic ACKs (and anything
// else) to a requester QP with outstanding work requests, and checks that local memory
// outside the READ and atomic destination buffers never changes, that the send queue's
// indices and the outstanding READ/atomic count stay consistent, and that the device keeps
// working.
//
// Input header (then packet records, see buildPacket; PSN base = the oldest unacknowledged
// PSN; opcode table = response opcodes):
//
//	h0  bits 0-1 MTU (256, 512, 1024, 256); bits 2-4: 7 - retry_cnt; bits 5-7: 7 - rnr_retry
//	h1  which work requests to post (bit i: requesterWRs entry i; 0 = all)
//	h2  bits 0-4: 16 - max_rd_atomic (clamped); bit 5 fence the CmpSwap and second READ
//	SQ PSN (u24)
func FuzzRequesterResponses(f *testing.F) {
	// Requests carry data of the source region and address the remote range of their work
	// request.
	x := newRequesterRig(f, Ordered, Config{ReadChunk: 2}, func(p *wire.Packet, src []byte) string {
		if len(p.Payload) > 0 && !bytes.Contains(src, p.Payload) {
			return fmt.Sprintf("%v payload of %d bytes is not from the source buffer", p.BTH.Opcode, len(p.Payload))
		}
		va, n := p.RETH.VA, uint64(p.RETH.DMALen)
		if p.Info.Has(wire.IsAtomic) {
			va, n = p.Atomic.VA, 8
		} else if !p.Info.Has(wire.HasRETH) {
			return ""
		}
		i, base, msg := requesterRemoteRange(p, va)
		if msg != "" {
			return msg
		}
		if va+n > base+requesterRemoteLen[i] || !p.Info.Has(wire.IsRead) && va != base {
			return fmt.Sprintf("%v [%#x, +%d) outside work request %d's remote range [%#x, +%d)", p.BTH.Opcode, va, n, i, base, requesterRemoteLen[i])
		}
		return ""
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		defer x.start(t, data).Stop()
		r := &fuzzReader{b: data}
		h0, h1, h2 := r.u8(), r.u8(), r.u8()
		c := x.newCase(t, h0, h1, h2, r.u24(), Ordered, 0, fuzzRespOps)
		defer c.qp.Destroy()
		env := &c.env
		x.feedInput(t, r, c.qp, qpFeeder{
			next: func(r *fuzzReader) ([]byte, bool, bool) {
				c.qp.mu.Lock()
				env.psnBase = c.qp.req.una
				c.qp.mu.Unlock()
				return buildPacket(r, env)
			},
			feed:       feed,
			consistent: requesterConsistent,
		})
		x.end(t, c.qp, c.cq, c.allowed, "requester", inputEnd{})
	})
}

// requesterRemoteRange finds the work request whose remote range holds va (see
// requesterWRs): its index and base address, or a failure if none does.
func requesterRemoteRange(p *wire.Packet, va uint64) (i, base uint64, msg string) {
	i = (va - requesterRemoteBase) / 0x1000
	if va < requesterRemoteBase || i >= uint64(len(requesterRemoteLen)) {
		return 0, 0, fmt.Sprintf("%v to remote address %#x, no work request's", p.BTH.Opcode, va)
	}
	return i, requesterRemoteBase + i*0x1000, ""
}

// requesterRig is the requester targets' fixture: a fuzzRig whose device under test sends
// requests to the peer, with a source region (local read only: SEND and WRITE data) and a
// destination region (local write: READ and atomic results) of guarded memory registered.
type requesterRig struct {
	*fuzzRig
	src        []byte
	msrc, mdst *tpt.Region
}

// newRequesterRig sets up the fixture for QPs in mode on a device configured by cfg;
// every packet the device sends must pass check (src: the source region's bytes).
func newRequesterRig(f *testing.F, mode Ordering, cfg Config, check func(p *wire.Packet, src []byte) string) *requesterRig {
	g := newGuarded(txTotal)
	x := &requesterRig{src: g.fill(txSrcOff, txSrcLen, func(i int) byte { return byte(i*7 + 1) })}
	dst := g.fill(txDstOff, txDstLen, func(i int) byte { return 0xD0 ^ byte(i%53) })
	x.fuzzRig = newFuzzRig(f, g, mode, true, cfg, func(p *wire.Packet) string { return check(p, x.src) })
	var err error
	x.msrc, err = x.dut.d.MRs().Register(1, x.src, iova(x.src), 0) // local read only
	must(f, err)
	x.mdst, err = x.dut.d.MRs().Register(1, dst, iova(dst), tpt.LocalWrite)
	must(f, err)
	return x
}

// txCase is one execution's requester: its QP and CQ, what packets to it are built from,
// and the spans of guarded memory it may change.
type txCase struct {
	qp      *QP
	cq      *CQ
	env     pktEnv
	allowed []span
}

// newCase creates the requester QP an input's header describes (h0, h1, h2 and the SQ
// PSN: see FuzzRequesterResponses) in mode (maxHole: a weak QP's largest hole), posts its
// work requests, and describes it to the packet builder (ops: its opcode table). The
// caller destroys the QP.
func (x *requesterRig) newCase(t *testing.T, h0, h1, h2 byte, sqpsn uint32, mode Ordering, maxHole uint32, ops []wire.Opcode) *txCase {
	mtu := [4]uint8{wire.MTU256, wire.MTU512, wire.MTU1024, wire.MTU256}[h0&3]
	maxRd := 16 - min(int(h2&0x1F), 16)

	d, peer := x.dut.d, x.peer
	cq := d.NewCQ(128)
	qp, err := d.CreateQP(QPConfig{PD: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 4, MaxSendSGE: 2, MaxRecvSGE: 2})
	must(t, err)
	must(t, qp.Modify(&Attr{State: StateInit, Port: 1, Access: tpt.LocalWrite | tpt.RemoteWrite | tpt.RemoteRead | tpt.RemoteAtomic},
		MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags, lim))
	rtr := Attr{State: StateRTR, PathMTU: mtu, DestQPN: peer.qp.QPN(), RQPSN: 0, MaxDestRdAtomic: 4, MinRNRTimer: 1, Peer: peer.d.LocalAddr()}
	mask := MaskState | MaskAV | MaskPathMTU | MaskDestQPN | MaskRQPSN | MaskMaxDestRdAtomic | MaskMinRNRTimer
	if mode == Weak {
		rtr.Ordering, rtr.MaxHole = Weak, maxHole
		mask |= MaskOrdering
	}
	must(t, qp.Modify(&rtr, mask, lim))
	// Timeout 0: no local ACK timer, so nothing is retransmitted behind the fuzzer's back.
	must(t, qp.Modify(&Attr{State: StateRTS, SQPSN: wire.PSN(sqpsn), Timeout: 0, RetryCnt: 7 - h0>>2&7, RNRRetry: 7 - h0>>5, MaxRdAtomic: uint8(maxRd)},
		MaskState|MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskSQPSN|MaskMaxQPRdAtomic, lim))
	wrs, allowed := requesterWRs(x.msrc, x.mdst, h1, h2&0x20 != 0)
	if _, err := qp.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	good, bad := x.flows()
	return &txCase{qp: qp, cq: cq, allowed: allowed, env: pktEnv{
		ops:     ops,
		destQP:  qp.QPN(),
		mtu:     wire.MTUBytes(mtu),
		regions: [4]fuzzRegion{regionOf(x.mdst), regionOf(x.msrc), regionOf(x.mdst), regionOf(x.msrc)},
		good:    good,
		bad:     bad,
	}}
}
