package transport

import (
	"net/netip"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// ordered is standard RC as IBTA specifies it: the responder places packets in PSN order
// and sequence-NAKs a gap; the requester goes back to the first unacknowledged PSN on a
// NAK, a timeout or the end of an RNR wait (go-back-N). Its state is the requester's,
// completer's and responder's own: the mode has none.
type ordered struct{}

func (ordered) weak() bool { return false }

// Responder.

func (ordered) accepts(f uint32) bool { return f&(wire.IsWeak|wire.IsUD) == 0 }
func (ordered) request(q *QP, p *wire.Packet) {
	q.established()
	q.resp.handleRequest(p)
}
func (ordered) directTarget(q *QP, p *wire.Packet) []byte   { return q.resp.directTarget(p) }
func (ordered) acceptsFrom(q *QP, from netip.AddrPort) bool { return rcFrom(q, from) }
func (ordered) checkPost(_ *QP, _ uint8, hasAH bool, _ uint32, _ uint64) error {
	return rcCheckPost(hasAH)
}
func (ordered) transmitted(*QP)                {}
func (ordered) flushTaken(*QP)                 {}
func (ordered) response(q *QP, p *wire.Packet) { q.comp.orderedResponse(p) }

func (ordered) ack(q *QP, b *netio.SendBatch, syn uint8, psn wire.PSN) {
	bth := wire.BTH{Opcode: wire.OpAcknowledge, PKey: wire.DefaultPKey, DestQP: q.attr.DestQPN, PSN: psn}
	hdr := b.Alloc(wire.BTHLen + wire.AETHLen)
	bth.Put(hdr)
	aeth := wire.AETH{Syndrome: syn, MSN: q.resp.msn}
	aeth.Put(hdr[wire.BTHLen:])
	q.emit(b, hdr, nil, 0)
}

// usage: the message in progress (an ordered responder has at most one).
func (ordered) usage(q *QP) (u [NumLimits]uint32) {
	if rs := &q.resp; rs.sending || rs.writing {
		u[LimitInOrderMsgs] = 1
		u[LimitInOrderSegs] = rs.msgPkts
	}
	return u
}

// Requester.

func (ordered) startRequester(*QP, wire.PSN) {}
func (ordered) window(q *QP) int32           { return q.req.openWindow() }
func (ordered) beforeFill(*QP, *netio.SendBatch) (int64, bool) {
	return 0, false
}
func (ordered) afterFill(*QP, int64)                                  {}
func (ordered) start(*QP, *sendWQE)                                   {}
func (ordered) admit(*QP, *sendWQE, wire.PSN, wire.PSN) bool          { return true }
func (ordered) readSlot(*QP, *sendWQE, wire.PSN) bool                 { return true }
func (ordered) sent(*QP, uint64, *sendWQE, wire.PSN, wire.PSN, int64) {}
func (ordered) rtoShift() uint8                                       { return 0 }
func (ordered) onTimer(*QP, int64) bool                               { return false }
func (ordered) probeDue(int64) bool                                   { return false }
func (ordered) holeCounts() (opened, closed uint64)                   { return 0, 0 }
func (ordered) holes() Holes                                          { return Holes{} }

// resend goes back to psn; after a local ACK timeout, with the window closed.
func (ordered) resend(q *QP, psn wire.PSN, timeout bool) {
	if timeout {
		q.req.closeWindow()
	}
	q.req.rewind(psn)
}

// format: FIRST/MIDDLE/LAST/ONLY opcodes; a WRITE's RETH is on its first packet only.
func (ordered) format(q *QP, w *sendWQE, idx uint32, last bool, _, _ uint64) (wire.Opcode, wire.OOH, bool, bool) {
	switch w.op {
	case WRRead:
		return wire.OpReadRequest, wire.OOH{}, false, false
	case WRAtomicCmpSwap:
		return wire.OpCompareSwap, wire.OOH{}, false, false
	case WRAtomicFetch:
		return wire.OpFetchAdd, wire.OOH{}, false, false
	}
	return requestOpcode(w.op, idx == 0, last), wire.OOH{}, false, false
}
