package transport

import (
	"bytes"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// FuzzWeakRequesterResponses feeds SACKs (with fuzzed ranges, syndromes and echoed
// transmission numbers), READ responses and atomic ACKs (and anything else) to a
// weakly-ordered requester QP with outstanding work requests, and checks after every
// packet both hole trackers' invariants, the requester's counts (PSNs in flight,
// 0 <= READ/atomic requests outstanding <= max_rd_atomic, send queue indices) and that a
// refused packet changed no memory; after every input, that local memory outside the
// READ and atomic destination buffers never changed, that work requests completed once
// each in posting order, and that every packet the requester sent (first transmissions
// and selective retransmissions) is a weak-mode request carrying source data for its
// work request's remote range; and that the device keeps working.
//
// Input header (then weak packet records, see buildWeakPacket; PSN base = the oldest
// unacknowledged PSN; opcode table = what a weak responder sends):
//
//	h0  bits 0-1 MTU (256, 512, 1024, 256); bits 2-4: 7 - retry_cnt; bits 5-7: 7 - rnr_retry
//	h1  which work requests to post (bit i: requesterWRs entry i; 0 = all)
//	h2  bits 0-4: 16 - max_rd_atomic (clamped); bit 5 fence the CmpSwap and second READ;
//	    bits 6-7 max hole (64, 128, 256, default)
//	SQ PSN (u24)
//
// The requester's device has no loss probe and the QP no ACK timeout, so that nothing is
// retransmitted behind the fuzzer's back; its reordering threshold is 3 transmissions, so
// that SACK echoes reach selective retransmission.
func FuzzWeakRequesterResponses(f *testing.F) {
	g := newGuarded(txTotal)
	src := g.fill(txSrcOff, txSrcLen, func(i int) byte { return byte(i*7 + 1) })
	dst := g.fill(txDstOff, txDstLen, func(i int) byte { return 0xD0 ^ byte(i%53) })

	var peerQPN atomic.Uint32
	mon := &txMonitor{check: func(p *wire.Packet) string {
		if p.BTH.DestQP != peerQPN.Load() {
			return fmt.Sprintf("to QP %#x, not the peer QP %#x", p.BTH.DestQP, peerQPN.Load())
		}
		if p.Info.Has(wire.IsRequest) && !p.Info.Has(wire.IsWeak) {
			return fmt.Sprintf("a weak requester sent an ordered-mode %v", p.BTH.Opcode)
		}
		if p.BTH.Opcode == wire.OpWeakAck {
			return checkSACK(p)
		}
		if !p.Info.Has(wire.IsRequest) {
			return ""
		}
		o, err := wire.DecodeOOH(p.Ext)
		if err != nil {
			return fmt.Sprintf("%v with a bad OOH: %v", p.BTH.Opcode, err)
		}
		if len(p.Payload) > 0 && !bytes.Contains(src, p.Payload) {
			return fmt.Sprintf("%v payload of %d bytes is not from the source buffer", p.BTH.Opcode, len(p.Payload))
		}
		va, n := p.RETH.VA, uint64(p.RETH.DMALen)
		switch {
		case p.Info.Has(wire.IsAtomic):
			va, n = p.Atomic.VA, 8
		case p.Info.Has(wire.IsWrite):
			n = uint64(len(p.Payload)) // every weak WRITE packet addresses its own payload
		case !p.Info.Has(wire.HasRETH):
			return ""
		}
		i := (va - requesterRemoteBase) / 0x1000
		if va < requesterRemoteBase || i >= uint64(len(requesterRemoteLen)) {
			return fmt.Sprintf("%v to remote address %#x, no work request's", p.BTH.Opcode, va)
		}
		base := requesterRemoteBase + i*0x1000
		if va+n > base+requesterRemoteLen[i] {
			return fmt.Sprintf("%v [%#x, +%d) outside work request %d's remote range [%#x, +%d)", p.BTH.Opcode, va, n, i, base, requesterRemoteLen[i])
		}
		if p.Info.Has(wire.IsWrite) && (va-base != uint64(o.Offset) || p.RETH.DMALen != uint32(requesterRemoteLen[i]) || o.Length != p.RETH.DMALen) {
			return fmt.Sprintf("%v at remote offset %d: OOH offset %d, length %d, DMA length %d; work request %d is %d bytes",
				p.BTH.Opcode, va-base, o.Offset, o.Length, p.RETH.DMALen, i, requesterRemoteLen[i])
		}
		return ""
	}}
	a := openSide(f, "127.0.0.1", Config{FaultFilter: mon.filter, ReadChunk: 2, LossProbe: -1, ReorderThreshold: 3})
	b := openSide(f, "127.0.0.2", Config{})
	peerQPN.Store(b.qp.QPN())
	mon.flow.Store(&wire.Flow{Src: a.d.LocalAddr().Addr(), Dst: b.d.LocalAddr().Addr(), SrcPort: a.d.LocalAddr().Port(), DstPort: b.d.LocalAddr().Port(), DF: true})
	msrc, err := a.d.MRs().Register(1, src, iova(src), 0) // local read only
	must(f, err)
	mdst, err := a.d.MRs().Register(1, dst, iova(dst), tpt.LocalWrite)
	must(f, err)
	live := newLiveness(f, mon, a.d, b.d, Weak)
	aAddr, bAddr := a.d.LocalAddr(), b.d.LocalAddr()
	badAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), bAddr.Port())

	f.Fuzz(func(t *testing.T, data []byte) {
		defer watchdog(data).Stop()
		live.tick(t)
		g.reset()
		_ = mon.take()

		r := &fuzzReader{b: data}
		h0, h1, h2 := r.u8(), r.u8(), r.u8()
		sqpsn := r.u24()
		mtu := [4]uint8{wire.MTU256, wire.MTU512, wire.MTU1024, wire.MTU256}[h0&3]
		maxRd := 16 - min(int(h2&0x1F), 16)

		cq := a.d.NewCQ(128)
		qp, err := a.d.CreateQP(QPConfig{PD: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 4, MaxSendSGE: 2, MaxRecvSGE: 2})
		must(t, err)
		defer qp.Destroy()
		must(t, qp.Modify(&Attr{State: StateInit, Port: 1, Access: tpt.LocalWrite | tpt.RemoteWrite | tpt.RemoteRead | tpt.RemoteAtomic},
			MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags, lim))
		must(t, qp.Modify(&Attr{State: StateRTR, PathMTU: mtu, DestQPN: b.qp.QPN(), RQPSN: 0, MaxDestRdAtomic: 4, MinRNRTimer: 1,
			Peer: bAddr, Ordering: Weak, MaxHole: weakMaxHole(h2 >> 6)},
			MaskState|MaskAV|MaskPathMTU|MaskDestQPN|MaskRQPSN|MaskMaxDestRdAtomic|MaskMinRNRTimer|MaskOrdering, lim))
		must(t, qp.Modify(&Attr{State: StateRTS, SQPSN: wire.PSN(sqpsn), Timeout: 0, RetryCnt: 7 - h0>>2&7, RNRRetry: 7 - h0>>5, MaxRdAtomic: uint8(maxRd)},
			MaskState|MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskSQPSN|MaskMaxQPRdAtomic, lim))
		wrs, allowed := requesterWRs(msrc, mdst, h1, h2&0x20 != 0)
		if _, err := qp.PostSend(wrs); err != nil {
			t.Fatal(err)
		}
		if err := weakConsistent(qp); err != nil {
			t.Fatalf("after posting: %v", err)
		}

		env := &weakEnv{pktEnv: pktEnv{
			ops:     fuzzWeakRespOps,
			destQP:  qp.QPN(),
			mtu:     wire.MTUBytes(mtu),
			regions: [4]fuzzRegion{regionOf(mdst), regionOf(msrc), regionOf(mdst), regionOf(msrc)},
			good:    wire.Flow{Src: bAddr.Addr(), Dst: aAddr.Addr(), SrcPort: bAddr.Port(), DstPort: aAddr.Port(), DF: true},
			bad:     wire.Flow{Src: badAddr.Addr(), Dst: aAddr.Addr(), SrcPort: badAddr.Port(), DstPort: aAddr.Port(), DF: true},
		}}
		for n := 0; n < maxFuzzPackets && !r.empty(); n++ {
			qp.mu.Lock()
			env.psnBase = qp.req.una
			if qp.weak != nil {
				env.txSeq = qp.weak.txSeq
			}
			qp.mu.Unlock()
			pkt, fromBad, flush := buildWeakPacket(r, env)
			from := bAddr
			if fromBad {
				from = badAddr
			}
			g.snapshot()
			if feed(a.d, qp, pkt, from, flush) {
				if err := g.changedSince(); err != nil {
					t.Fatalf("packet %d (%x) was refused but changed memory: %v", n, pkt, err)
				}
			}
			if err := weakConsistent(qp); err != nil {
				t.Fatalf("after packet %d (%x): %v", n, pkt, err)
			}
		}
		finish(a.d)
		if err := cqInOrder(t, cq, true); err != nil {
			t.Fatalf("send completions: %v", err)
		}
		if testing.Verbose() {
			logOutcome(t, qp, cq)
		}
		if err := weakConsistent(qp); err != nil {
			t.Fatalf("after the last packet: %v", err)
		}
		if err := g.check(allowed); err != nil {
			t.Fatalf("requester memory: %v", err)
		}
		if e := mon.take(); e != "" {
			t.Fatalf("requester: %s", e)
		}
	})
}
