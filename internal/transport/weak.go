package transport

import (
	"github.com/softrnic/softrnic/internal/holes"
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
// enters RTR in weak mode (QP.setOrdering) and dropped at RESET. The requester and completer
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

// Holes reports a weakly-ordered QP's open holes: in the request PSNs it receives, with
// what completed beyond each, and in the PSNs of its own requests not yet acknowledged or
// answered. Both are empty in ordered mode.
type Holes struct {
	Responder []holes.Hole // counts by kind: 0 receive completions, 1 READ requests held, 2 atomics held
	Requester []holes.Hole // counts by kind: 0 SEND/WRITE acknowledged, 1 READ answered, 2 atomics answered
}

// Holes returns the QP's open holes.
func (q *QP) Holes() Holes {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.weak.holes()
}
