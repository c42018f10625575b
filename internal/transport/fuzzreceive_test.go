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

// Responder-side buffer layout: canaries around and between four regions.
const (
	rxGap   = 256
	rxRWOff = rxGap
	rxRWLen = 2048
	rxROOff = rxRWOff + rxRWLen + rxGap
	rxROLen = 512
	rxPDOff = rxROOff + rxROLen + rxGap
	rxPDLen = 512
	rxRQOff = rxPDOff + rxPDLen + rxGap
	rxRQLen = 2048
	rxTotal = rxRQOff + rxRQLen + rxGap
)

// FuzzReceivePath feeds built and raw packets to a responder QP and checks that nothing
// outside the registered region the QP may write changes, that READ responses only carry
// bytes of regions the QP may read, and that the device keeps working.
//
// Input header (then packet records, see buildPacket; PSN base = the responder's ePSN):
//
//	h0  bits 0-1 MTU (256, 512, 1024, 256); bit 2 no remote write, bit 3 no remote read,
//	    bit 4 no remote atomic on the QP; bit 5 stay in RTR; bits 6-7: 3 - number of
//	    receive WQEs
//	h1  bits 0-4: 16 - max_dest_rd_atomic (clamped); bit 5 the first receive WQE points at
//	    the read-only region (local protection error); bit 6 two SGEs per receive WQE;
//	    bit 7 use an SRQ
//	RQ PSN (u24)
func FuzzReceivePath(f *testing.F) {
	g := newGuarded(rxTotal)
	rw := g.fill(rxRWOff, rxRWLen, func(int) byte { return 0 })
	ro := g.fill(rxROOff, rxROLen, func(i int) byte { return 0x40 + byte(i%61) })
	other := g.fill(rxPDOff, rxPDLen, func(i int) byte { return 0xC0 ^ byte(i%59) })
	rq := g.fill(rxRQOff, rxRQLen, func(i int) byte { return 0x80 | byte(i%37) })

	// READ responses must carry bytes of the regions the QP can read; everything goes to
	// the peer QP.
	var peerQPN atomic.Uint32
	mon := &txMonitor{check: func(p *wire.Packet) string {
		if p.BTH.DestQP != peerQPN.Load() {
			return fmt.Sprintf("to QP %#x, not the peer QP %#x", p.BTH.DestQP, peerQPN.Load())
		}
		if p.Info.Has(wire.IsResponse|wire.IsRead) && len(p.Payload) > 0 && !bytes.Contains(rw, p.Payload) && !bytes.Contains(ro, p.Payload) {
			return fmt.Sprintf("%v PSN %#x carries %d bytes found in no readable region: %x",
				p.BTH.Opcode, p.BTH.PSN, len(p.Payload), p.Payload[:min(64, len(p.Payload))])
		}
		return ""
	}}
	a := openSide(f, "127.0.0.1", Config{})
	b := openSide(f, "127.0.0.2", Config{FaultFilter: mon.filter})
	peerQPN.Store(a.qp.QPN())
	mon.flow.Store(&wire.Flow{Src: b.d.LocalAddr().Addr(), Dst: a.d.LocalAddr().Addr(), SrcPort: b.d.LocalAddr().Port(), DstPort: a.d.LocalAddr().Port(), DF: true})
	mrw := reg(f, b.d, rw)
	mro, err := b.d.MRs().Register(1, ro, iova(ro), tpt.RemoteRead)
	must(f, err)
	mpd, err := b.d.MRs().Register(2, other, iova(other), tpt.LocalWrite|tpt.RemoteWrite|tpt.RemoteRead|tpt.RemoteAtomic)
	must(f, err)
	mrq, err := b.d.MRs().Register(1, rq, iova(rq), tpt.LocalWrite)
	must(f, err)
	live := newLiveness(f, mon, a.d, b.d, Ordered)
	aAddr, bAddr := a.d.LocalAddr(), b.d.LocalAddr()
	badAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), aAddr.Port())

	f.Fuzz(func(t *testing.T, data []byte) {
		defer watchdog(data).Stop()
		live.tick(t)
		g.reset()
		_ = mon.take()

		r := &fuzzReader{b: data}
		h0, h1 := r.u8(), r.u8()
		rqpsn := r.u24()
		mtu := [4]uint8{wire.MTU256, wire.MTU512, wire.MTU1024, wire.MTU256}[h0&3]
		access := tpt.LocalWrite | tpt.RemoteWrite | tpt.RemoteRead | tpt.RemoteAtomic
		if h0&0x04 != 0 {
			access &^= tpt.RemoteWrite
		}
		if h0&0x08 != 0 {
			access &^= tpt.RemoteRead
		}
		if h0&0x10 != 0 {
			access &^= tpt.RemoteAtomic
		}
		nrecv := 3 - int(h0>>6)
		maxDest := 16 - min(int(h1&0x1F), 16)

		cq := b.d.NewCQ(128)
		cfg := QPConfig{PD: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2}
		if h1&0x80 != 0 {
			cfg.SRQ = b.d.NewRecvQueue(1, 8, 2, true)
		}
		qp, err := b.d.CreateQP(cfg)
		must(t, err)
		defer qp.Destroy()
		must(t, qp.Modify(&Attr{State: StateInit, Port: 1, Access: access}, MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags, lim))
		must(t, qp.Modify(&Attr{State: StateRTR, PathMTU: mtu, DestQPN: a.qp.QPN(), RQPSN: wire.PSN(rqpsn), MaxDestRdAtomic: uint8(maxDest),
			MinRNRTimer: 1, Peer: aAddr}, MaskState|MaskAV|MaskPathMTU|MaskDestQPN|MaskRQPSN|MaskMaxDestRdAtomic|MaskMinRNRTimer, lim))
		if h0&0x20 == 0 {
			must(t, qp.Modify(&Attr{State: StateRTS, SQPSN: 0, Timeout: 0, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
				MaskState|MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskSQPSN|MaskMaxQPRdAtomic, lim))
		}
		// Receive WQEs: 512-byte slots of the receive region, one or two SGEs each.
		allowed := []span{{rxRWOff, rxRWLen}}
		for i := 0; i < nrecv; i++ {
			base := mrq.IOVA() + uint64(i*512)
			sg := []SGE{{Addr: base, Length: 400, LKey: mrq.Key()}}
			if h1&0x40 != 0 {
				sg = []SGE{{Addr: base, Length: 200, LKey: mrq.Key()}, {Addr: base + 256, Length: 200, LKey: mrq.Key()}}
			}
			if i == 0 && h1&0x20 != 0 {
				sg[0] = SGE{Addr: mro.IOVA(), Length: 100, LKey: mro.Key()} // no local write: protection error
			}
			for _, s := range sg {
				if s.LKey == mrq.Key() {
					allowed = append(allowed, span{rxRQOff + int(s.Addr-mrq.IOVA()), int(s.Length)})
				}
			}
			wr := []RecvWR{{WRID: uint64(i), SG: sg}}
			if cfg.SRQ != nil {
				must(t, cfg.SRQ.post(&wr[0]))
			} else {
				_, err := qp.PostRecv(wr)
				must(t, err)
			}
		}

		env := &pktEnv{
			ops:     fuzzAllOps,
			destQP:  qp.QPN(),
			mtu:     wire.MTUBytes(mtu),
			regions: [4]fuzzRegion{regionOf(mrw), regionOf(mro), regionOf(mpd), regionOf(mrq)},
			good:    wire.Flow{Src: aAddr.Addr(), Dst: bAddr.Addr(), SrcPort: aAddr.Port(), DstPort: bAddr.Port(), DF: true},
			bad:     wire.Flow{Src: badAddr.Addr(), Dst: bAddr.Addr(), SrcPort: badAddr.Port(), DstPort: bAddr.Port(), DF: true},
		}
		for n := 0; n < maxFuzzPackets && !r.empty(); n++ {
			qp.mu.Lock()
			env.psnBase = qp.resp.epsn
			qp.mu.Unlock()
			pkt, fromBad, flush := buildPacket(r, env)
			from := aAddr
			if fromBad {
				from = badAddr
			}
			g.snapshot()
			if feed(b.d, qp, pkt, from, flush) {
				if err := g.changedSince(); err != nil {
					t.Fatalf("packet %d (%x) was refused but changed memory: %v", n, pkt, err)
				}
			}
		}
		finish(b.d)
		if testing.Verbose() {
			logOutcome(t, qp, cq)
		}

		if err := g.check(allowed); err != nil {
			t.Fatalf("responder memory: %v", err)
		}
		if e := mon.take(); e != "" {
			t.Fatalf("responder: %s", e)
		}
	})
}
