package transport

import (
	"bytes"
	"fmt"
	"testing"

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
	x := newRequesterRig(f, Weak, Config{ReadChunk: 2, LossProbe: -1, ReorderThreshold: 3}, func(p *wire.Packet, src []byte) string {
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
		i, base, msg := requesterRemoteRange(p, va)
		if msg != "" {
			return msg
		}
		if va+n > base+requesterRemoteLen[i] {
			return fmt.Sprintf("%v [%#x, +%d) outside work request %d's remote range [%#x, +%d)", p.BTH.Opcode, va, n, i, base, requesterRemoteLen[i])
		}
		if p.Info.Has(wire.IsWrite) && (va-base != uint64(o.Offset) || p.RETH.DMALen != uint32(requesterRemoteLen[i]) || o.Length != p.RETH.DMALen) {
			return fmt.Sprintf("%v at remote offset %d: OOH offset %d, length %d, DMA length %d; work request %d is %d bytes",
				p.BTH.Opcode, va-base, o.Offset, o.Length, p.RETH.DMALen, i, requesterRemoteLen[i])
		}
		return ""
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		defer x.start(t, data).Stop()
		r := &fuzzReader{b: data}
		h0, h1, h2 := r.u8(), r.u8(), r.u8()
		c := x.newCase(t, h0, h1, h2, r.u24(), Weak, weakMaxHole(h2>>6), fuzzWeakRespOps)
		defer c.qp.Destroy()
		if err := weakConsistent(c.qp); err != nil {
			t.Fatalf("after posting: %v", err)
		}
		env := &weakEnv{pktEnv: c.env}
		x.feedInput(t, r, c.qp, qpFeeder{
			next: func(r *fuzzReader) ([]byte, bool, bool) {
				c.qp.mu.Lock()
				env.psnBase = c.qp.req.una
				if c.qp.weak != nil {
					env.txSeq = c.qp.weak.req.txSeq
				}
				c.qp.mu.Unlock()
				return buildWeakPacket(r, env)
			},
			feed:       feed,
			consistent: weakConsistent,
		})
		x.end(t, c.qp, c.cq, c.allowed, "requester", inputEnd{completions: "send completions", inOrder: true, consistent: weakConsistent})
	})
}
