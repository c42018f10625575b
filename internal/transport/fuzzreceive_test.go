package transport

import (
	"bytes"
	"fmt"
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
	x := newResponderRig(f, Ordered, nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		defer x.start(t, data).Stop()
		r := &fuzzReader{b: data}
		h0, h1 := r.u8(), r.u8()
		c := x.newCase(t, h0, h1, r.u24(), Ordered, 0, fuzzAllOps)
		defer c.qp.Destroy()
		env := &c.env
		x.feedInput(t, r, c.qp, qpFeeder{
			next: func(r *fuzzReader) ([]byte, bool, bool) {
				c.qp.mu.Lock()
				env.psnBase = c.qp.resp.epsn
				c.qp.mu.Unlock()
				return buildPacket(r, env)
			},
			feed: feed,
		})
		x.end(t, c.qp, c.cq, c.allowed, "responder", inputEnd{})
	})
}

// responderRig is the receive-path targets' fixture: a fuzzRig whose device under test
// answers the peer's requests, with four regions of guarded memory registered: rw (any
// access), ro (remote read only), other (another protection domain's) and rq (the receive
// buffers, local write only).
type responderRig struct {
	*fuzzRig
	rw, ro             []byte
	mrw, mro, mpd, mrq *tpt.Region
}

// newResponderRig sets up the fixture for QPs in mode. Every packet the device sends must
// pass extra (if set), and READ responses must carry bytes of the regions the QP can read.
func newResponderRig(f *testing.F, mode Ordering, extra func(p *wire.Packet) string) *responderRig {
	g := newGuarded(rxTotal)
	x := &responderRig{
		rw: g.fill(rxRWOff, rxRWLen, func(int) byte { return 0 }),
		ro: g.fill(rxROOff, rxROLen, func(i int) byte { return 0x40 + byte(i%61) }),
	}
	other := g.fill(rxPDOff, rxPDLen, func(i int) byte { return 0xC0 ^ byte(i%59) })
	rq := g.fill(rxRQOff, rxRQLen, func(i int) byte { return 0x80 | byte(i%37) })
	x.fuzzRig = newFuzzRig(f, g, mode, false, Config{}, func(p *wire.Packet) string {
		if extra != nil {
			if msg := extra(p); msg != "" {
				return msg
			}
		}
		if p.Info.Has(wire.IsResponse|wire.IsRead) && len(p.Payload) > 0 && !bytes.Contains(x.rw, p.Payload) && !bytes.Contains(x.ro, p.Payload) {
			return fmt.Sprintf("%v PSN %#x carries %d bytes found in no readable region: %x",
				p.BTH.Opcode, p.BTH.PSN, len(p.Payload), p.Payload[:min(64, len(p.Payload))])
		}
		return ""
	})
	d := x.dut.d
	x.mrw = reg(f, d, x.rw)
	var err error
	x.mro, err = d.MRs().Register(1, x.ro, iova(x.ro), tpt.RemoteRead)
	must(f, err)
	x.mpd, err = d.MRs().Register(2, other, iova(other), tpt.LocalWrite|tpt.RemoteWrite|tpt.RemoteRead|tpt.RemoteAtomic)
	must(f, err)
	x.mrq, err = d.MRs().Register(1, rq, iova(rq), tpt.LocalWrite)
	must(f, err)
	return x
}

// rxCase is one execution's responder: its QP and CQ, whether its receive WQEs come from
// an SRQ, what packets to it are built from, and the spans of guarded memory it may change.
type rxCase struct {
	qp      *QP
	cq      *CQ
	srq     bool
	env     pktEnv
	allowed []span
}

// newCase creates the responder QP an input's header describes (h0, h1 and the RQ PSN: see
// FuzzReceivePath) in mode (maxHole: a weak QP's largest hole), posts its receive WQEs,
// and describes it to the packet builder (ops: its opcode table). The caller destroys the QP.
func (x *responderRig) newCase(t *testing.T, h0, h1 byte, rqpsn uint32, mode Ordering, maxHole uint32, ops []wire.Opcode) *rxCase {
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

	d, peer := x.dut.d, x.peer
	cq := d.NewCQ(128)
	cfg := QPConfig{PD: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2}
	if h1&0x80 != 0 {
		cfg.SRQ = d.NewRecvQueue(1, 8, 2, true)
	}
	qp, err := d.CreateQP(cfg)
	must(t, err)
	must(t, qp.Modify(&Attr{State: StateInit, Port: 1, Access: access}, MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags, lim))
	rtr := Attr{State: StateRTR, PathMTU: mtu, DestQPN: peer.qp.QPN(), RQPSN: wire.PSN(rqpsn), MaxDestRdAtomic: uint8(maxDest),
		MinRNRTimer: 1, Peer: peer.d.LocalAddr()}
	mask := MaskState | MaskAV | MaskPathMTU | MaskDestQPN | MaskRQPSN | MaskMaxDestRdAtomic | MaskMinRNRTimer
	if mode == Weak {
		rtr.Ordering, rtr.MaxHole = Weak, maxHole
		mask |= MaskOrdering
	}
	must(t, qp.Modify(&rtr, mask, lim))
	if h0&0x20 == 0 {
		must(t, qp.Modify(&Attr{State: StateRTS, SQPSN: 0, Timeout: 0, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
			MaskState|MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskSQPSN|MaskMaxQPRdAtomic, lim))
	}
	// Receive WQEs: 512-byte slots of the receive region, one or two SGEs each.
	mrq, mro := x.mrq, x.mro
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
	good, bad := x.flows()
	return &rxCase{qp: qp, cq: cq, srq: cfg.SRQ != nil, allowed: allowed, env: pktEnv{
		ops:     ops,
		destQP:  qp.QPN(),
		mtu:     wire.MTUBytes(mtu),
		regions: [4]fuzzRegion{regionOf(x.mrw), regionOf(mro), regionOf(x.mpd), regionOf(mrq)},
		good:    good,
		bad:     bad,
	}}
}
