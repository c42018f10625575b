package transport

import (
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
)

// FuzzWeakReceivePath feeds weak-mode requests (and anything else) to a weakly-ordered
// responder QP and checks, after every packet, both hole trackers' invariants and that a
// refused packet changed no memory; after every input, that nothing outside the
// registered region the QP may write and its receive buffers changed, that receive
// completions came once each in posting order, and that every packet the device sent
// decodes with a valid ICRC (SACKs well formed, READ responses carrying bytes of regions
// the QP may read); and that the device keeps working (a weak-mode RDMA WRITE every
// liveEvery inputs and at the end).
//
// Input header (then weak packet records, see buildWeakPacket; PSN base = the responder's
// expected PSN, the first one missing):
//
//	h0  bits 0-1 MTU (256, 512, 1024, 256); bit 2 no remote write, bit 3 no remote read,
//	    bit 4 no remote atomic on the QP; bit 5 stay in RTR; bits 6-7: 3 - number of
//	    receive WQEs
//	h1  bits 0-4: 16 - max_dest_rd_atomic (clamped); bit 5 the first receive WQE points at
//	    the read-only region (local protection error); bit 6 two SGEs per receive WQE;
//	    bit 7 use an SRQ
//	h2  bits 0-1 max hole (64, 128, 256, default)
//	RQ PSN (u24)
func FuzzWeakReceivePath(f *testing.F) {
	x := newResponderRig(f, Weak, func(p *wire.Packet) string {
		switch p.BTH.Opcode {
		case wire.OpWeakAck:
			return checkSACK(p)
		case wire.OpAcknowledge:
			return "a weak QP sent an ordered-mode ACK"
		}
		return ""
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		defer x.start(t, data).Stop()
		r := &fuzzReader{b: data}
		h0, h1, h2 := r.u8(), r.u8(), r.u8()
		c := x.newCase(t, h0, h1, r.u24(), Weak, weakMaxHole(h2), fuzzWeakReqOps)
		defer c.qp.Destroy()
		env := &weakEnv{pktEnv: c.env}
		x.feedInput(t, r, c.qp, qpFeeder{
			next: func(r *fuzzReader) ([]byte, bool, bool) {
				c.qp.mu.Lock()
				env.psnBase = c.qp.weak.resp.arrived.Base()
				c.qp.mu.Unlock()
				return buildWeakPacket(r, env)
			},
			feed:       weakFeed,
			consistent: weakConsistent,
		})
		// Receive WQEs of the QP's own queue complete in posting order. A message takes a
		// WQE of a shared receive queue when its first packet arrives (other QPs take
		// them too), so with an SRQ they complete in message order, each once, but not
		// necessarily in posting order.
		x.end(t, c.qp, c.cq, c.allowed, "responder", inputEnd{completions: "receive completions", inOrder: !c.srq, consistent: weakConsistent})
	})
}
