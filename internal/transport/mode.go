package transport

import (
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// An RC QP's ordering mode is ordered (standard RC: in-order placement, go-back-N;
// ordered*.go) or weakly ordered (selective repeat, placement on arrival, completions held
// until the holes before them close; weak*.go). Each mode has its own requester,
// completer and responder types holding what only that mode keeps; the QP's requester,
// completer and responder do what both modes do alike and ask their mode, through the
// small interfaces below, only what differs. The mode is chosen when the QP enters RTR
// (setOrdering) and goes back to ordered at RESET. (A UD QP stays ordered; its datagrams
// never reach the roles: UD is a service of its own, see service.go.) Every method runs
// with q.mu held.

// sendOrder is what the requester asks its mode as it sends.
type sendOrder interface {
	// begin sets the first PSN the requester sends (the QP enters RTS).
	begin(psn wire.PSN)
	// fill adds the mode's packets to b: new ones (requester.fillNew), and in weak mode
	// those found lost first. It returns true when it stopped because b is full.
	fill(b *netio.SendBatch) bool
	// window returns how many PSNs past una the requester may assign to new WQEs.
	window() int32
	// start gives a WQE whose PSNs were just assigned the mode's sequence numbers.
	start(w *sendWQE)
	// admit reports whether the packet covering PSNs psn..end of w may be sent now: it
	// lies within the window (ordered mode bounds PSNs past una, weak mode the packets in
	// flight).
	admit(w *sendWQE, psn, end wire.PSN) bool
	// readSlot reports whether the READ request or atomic of w starting at psn, sent for
	// the first time, may take one of the peer's responder resources now.
	readSlot(w *sendWQE, psn wire.PSN) bool
	// format returns the opcode of w's packet at psn (its index idx in the WQE, last:
	// whether it ends the message; off and n: its payload, or what a READ request asks
	// for), the OOH if the mode's packets carry one, and whether a WRITE's RETH
	// addresses this packet's own payload (weak mode: every packet places itself).
	format(w *sendWQE, idx uint32, last bool, off, n uint64) (op wire.Opcode, ooh wire.OOH, hasOOH, ownVA bool)
	// sent records the transmission of PSNs [psn, next) of the WQE at index idx at time now.
	sent(idx uint64, w *sendWQE, psn, next wire.PSN, now int64)
}

// recovery is how the requester's mode sends again what was not acknowledged.
type recovery interface {
	// resend makes the requester send again from psn: after an RNR wait, and after a
	// local ACK timeout (with the retry already counted; timeout says which).
	resend(psn wire.PSN, timeout bool)
	// probe runs the loss probe, due at now (requester.probeAt; weak mode's only); it
	// reports whether the requester has packets to send.
	probe(now int64) bool
}

// responseOrder is the completer's mode: what it makes of a response (ACK, NAK, READ
// response, atomic ACK) whose PSN was sent.
type responseOrder interface {
	response(p *wire.Packet)
}

// requestOrder is the responder's mode: how requests are placed and acknowledged.
type requestOrder interface {
	// takes reports whether a request with these opcode flags belongs to the mode; a
	// request of another mode is dropped and counted, whatever its PSN.
	takes(f uint32) bool
	// request runs the responder for a request packet of the mode.
	request(p *wire.Packet)
	// ack adds an acknowledgement with syndrome syn (ACK, NAK or RNR NAK) for psn to b.
	ack(b *netio.SendBatch, syn uint8, psn wire.PSN)
	// usage fills the responder's current use of the limit queue's dimensions that the
	// mode defines (messages and packets in progress, held out of order, hole span).
	usage() [NumLimits]uint32
	// abort drops the messages in progress (the QP is entering ERR); receive WQEs they
	// took from a shared receive queue complete with WR_FLUSH_ERR.
	abort()
}

// setOrdering makes the QP's roles work in ordering mode o (in weak mode with a hole span
// of maxHole PSNs): at RTR, and ordered again at creation and RESET. The mode's state
// starts afresh.
func (q *QP) setOrdering(o Ordering, maxHole uint32) {
	if o == Weak {
		ws := newWeakState(q, maxHole, q.resp.epsn)
		q.weak = ws
		q.req.order, q.req.recover = &ws.req, &ws.req
		q.comp.order = &ws.comp
		q.resp.order = &ws.resp
		return
	}
	q.weak = nil
	q.ord.init(q)
	q.req.order, q.req.recover = &q.ord.req, &q.ord.req
	q.comp.order = &q.ord.comp
	q.resp.order = &q.ord.resp
}
