package transport

import (
	"net/netip"

	"github.com/softrnic/softrnic/internal/holes"
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// Weakly-ordered mode (as IRN, Falcon's weakly-ordered RDMA and NVIDIA's out-of-order
// placement): every packet describes itself and is placed the moment it arrives; what it
// completes is held, counted on the hole in the PSN space it waits for, and released in
// order when that hole closes (package holes). Losses are found from selective
// acknowledgements with a reordering threshold, or by the retransmission timer with
// back-off, and only the lost packets are sent again.
//
// Responder, per hole: receive completions (SEND, WRITE with immediate) whose CQEs are
// posted when it closes; READ requests whose responses are prepared but held for the
// doorbell that rings when it closes; atomics, executed when it closes.
// Requester, per hole in the acknowledged/answered PSNs: READ work requests whose
// responses all arrived, SEND/WRITE work requests all acknowledged, atomics answered; they
// complete when it closes.
//
// Memory visibility: bytes of a message may land in any order. Only a completion (a CQE,
// or a later message's CQE) says a message's bytes are all there; polling the last byte
// of a buffer does not.

// Kinds of held items.
const (
	// Responder.
	kindRecv    holes.Kind = 0 // a receive completion (SEND, WRITE with immediate)
	kindReadReq holes.Kind = 1 // a READ request whose responses wait for the doorbell
	kindAtomic  holes.Kind = 2 // an atomic, executed when the hole closes
	// Requester.
	kindSendDone   holes.Kind = 0 // a SEND or WRITE work request, acknowledged
	kindReadDone   holes.Kind = 1 // a READ work request, all responses arrived
	kindAtomicDone holes.Kind = 2 // an atomic work request, answered
)

// weakState is a weakly-ordered QP's roles, each owning its state: made when the QP
// enters RTR in weak mode (QP.setState) and dropped at RESET. The requester and completer
// share what was sent and what came back through the pointers they hold to each other;
// all three work with the QP's own roles (requester, completer, responder) for what both
// modes do alike.
type weakState struct {
	req  weakRequester
	comp weakCompleter
	resp weakResponder
}

// newWeakState makes the state of a QP entering RTR in weak mode with a hole span of
// maxHole PSNs, expecting request PSN epsn.
func newWeakState(q *QP, maxHole uint32, epsn wire.PSN) *weakState {
	ws := &weakState{}
	ws.resp.init(q, epsn, maxHole)
	ws.req.init(q, &ws.comp, ws.resp.span)
	ws.comp.init(q, &ws.req, maxHole)
	return ws
}

// holes returns the open holes of both directions (none without weak state).
func (ws *weakState) holes() Holes {
	if ws == nil {
		return Holes{}
	}
	return Holes{Responder: ws.resp.arrived.Holes(nil), Requester: ws.comp.done.Holes(nil)}
}

// holeCounts returns the holes opened and closed so far in both directions (zero without
// weak state).
func (ws *weakState) holeCounts() (opened, closed uint64) {
	if ws == nil {
		return 0, 0
	}
	return ws.resp.arrived.Opened + ws.comp.done.Opened, ws.resp.arrived.Closed + ws.comp.done.Closed
}

// The mode seam (see mode.go).

func (*weakState) weak() bool { return true }
func (ws *weakState) acceptsFrom(q *QP, from netip.AddrPort) bool {
	return rcFrom(q, from)
}
func (ws *weakState) accepts(f uint32) bool { return ws.resp.takes(f) }
func (ws *weakState) request(q *QP, p *wire.Packet) {
	q.established()
	ws.resp.request(p)
}
func (*weakState) directTarget(*QP, *wire.Packet) []byte { return nil }
func (ws *weakState) ack(_ *QP, b *netio.SendBatch, syn uint8, psn wire.PSN) {
	ws.resp.ack(b, syn, psn)
}
func (ws *weakState) usage(*QP) [NumLimits]uint32    { return ws.resp.usage() }
func (ws *weakState) flushTaken(*QP)                 { ws.resp.flushTaken() }
func (ws *weakState) response(_ *QP, p *wire.Packet) { ws.comp.response(p) }
func (*weakState) checkPost(_ *QP, _ uint8, hasAH bool, _ uint32, _ uint64) error {
	return rcCheckPost(hasAH)
}
func (*weakState) transmitted(*QP)                       {}
func (ws *weakState) startRequester(_ *QP, psn wire.PSN) { ws.comp.done.Reset(psn) }
func (ws *weakState) window(*QP) int32                   { return ws.req.window() }
func (ws *weakState) beforeFill(q *QP, b *netio.SendBatch) (int64, bool) {
	now := q.dev.now()
	return now, ws.req.fillRetransmits(b, now)
}
func (ws *weakState) afterFill(_ *QP, now int64) { ws.req.armProbe(now) }
func (ws *weakState) start(_ *QP, w *sendWQE)    { ws.req.start(w) }
func (ws *weakState) admit(_ *QP, w *sendWQE, psn, end wire.PSN) bool {
	return ws.req.admit(w, psn, end)
}
func (ws *weakState) readSlot(_ *QP, w *sendWQE, psn wire.PSN) bool {
	return ws.req.readSlot(w, psn)
}
func (ws *weakState) format(_ *QP, w *sendWQE, idx uint32, last bool, off, n uint64) (wire.Opcode, wire.OOH, bool, bool) {
	return ws.req.format(w, idx, last, off, n)
}
func (ws *weakState) sent(_ *QP, idx uint64, w *sendWQE, psn, next wire.PSN, now int64) {
	ws.req.sent(idx, w, psn, next, now)
}
func (ws *weakState) rtoShift() uint8                          { return ws.req.backoff }
func (ws *weakState) onTimer(_ *QP, now int64) bool            { return ws.req.onTimer(now) }
func (ws *weakState) probeDue(now int64) bool                  { return ws.req.probeDue(now) }
func (ws *weakState) resend(_ *QP, psn wire.PSN, timeout bool) { ws.req.resend(psn, timeout) }
