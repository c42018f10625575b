package transport

import (
	"errors"
	"net/netip"

	"github.com/softrnic/softrnic/internal/holes"
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// mode is the seam between the roles and what differs between a QP's transport modes:
// ordered RC (go-back-N, in-order placement; ordered.go) and weakly-ordered RC (selective
// repeat, placement on arrival, completions held until the holes before them close;
// weak*.go). The requester, completer and responder ask the QP's mode instead of asking
// which mode it is in. The mode is chosen once, when the QP enters RTR (QP.setState), and
// goes back to ordered on RESET. Every method runs with q.mu held.
type mode interface {
	// Weak reports whether this is the weakly-ordered mode (for Query and limits only).
	weak() bool

	// Responder.

	// acceptsFrom reports whether a packet from this address may be for the QP (RC: only
	// from its peer; UD: from anyone).
	acceptsFrom(q *QP, from netip.AddrPort) bool
	// accepts reports whether a request with these opcode flags belongs to the mode; a
	// request of another mode is dropped and counted, whatever its PSN.
	accepts(f uint32) bool
	// request runs the responder for a request packet of the mode.
	request(q *QP, p *wire.Packet)
	// directTarget returns the memory the payload of request p, not yet verified, goes
	// to if the mode can tell before verifying it, changing nothing (see
	// QP.inputDirect); else nil.
	directTarget(q *QP, p *wire.Packet) []byte
	// ack adds an acknowledgement with syndrome syn (ACK, NAK or RNR NAK) for psn to b.
	ack(q *QP, b *netio.SendBatch, syn uint8, psn wire.PSN)
	// usage fills the responder's current use of the limit queue's dimensions that the
	// mode defines (messages and packets in progress, held out of order, hole span).
	usage(q *QP) [NumLimits]uint32
	// flushTaken completes with WR_FLUSH_ERR the receive WQEs that messages in progress
	// took from a shared receive queue (the QP is entering ERR).
	flushTaken(q *QP)

	// Completer.

	// response runs the completer for a response (ACK, NAK, READ response, atomic ACK)
	// whose PSN was sent.
	response(q *QP, p *wire.Packet)

	// Requester.

	// checkPost refuses a work request the service does not take (e.g. an RDMA READ on
	// a UD QP, an address handle on an RC QP), with the reason: its opcode, whether it has
	// an address handle, its remote QP number and its length. (Scalars, not the work
	// request: a pointer through an interface call would make the caller's work requests
	// escape to the heap.)
	checkPost(q *QP, op uint8, hasAH bool, remoteQPN uint32, length uint64) error
	// transmitted runs after a batch holding the QP's requests was handed to the socket
	// (UD completes its sends then: nothing acknowledges them).
	transmitted(q *QP)
	// startRequester is called when the QP enters RTS, with the first PSN it sends.
	startRequester(q *QP, psn wire.PSN)
	// window returns how many PSNs past una the requester may send.
	window(q *QP) int32
	// beforeFill runs before the requester adds new packets to b (weak mode sends the PSNs
	// found lost first); it returns the device time the fill works with and whether b is
	// already full.
	beforeFill(q *QP, b *netio.SendBatch) (now int64, full bool)
	// afterFill runs after the requester filled b (weak mode arms its loss probe).
	afterFill(q *QP, now int64)
	// start gives a WQE whose PSNs were just assigned the mode's sequence numbers.
	start(q *QP, w *sendWQE)
	// admit reports whether the packet covering PSNs psn..end of w may be sent now,
	// beyond the PSN window (weak mode bounds the PSNs in flight, not PSNs past una).
	admit(q *QP, w *sendWQE, psn, end wire.PSN) bool
	// readSlot reports whether the READ request or atomic of w starting at psn, sent for
	// the first time, may take a responder resource now (weak mode: see weakState.rdBase).
	readSlot(q *QP, w *sendWQE, psn wire.PSN) bool
	// format returns the opcode of w's packet at psn (its index idx in the WQE, last:
	// whether it ends the message; off and n: its payload, or what a READ request asks
	// for), the OOH if the mode's packets carry one, and whether a WRITE's RETH
	// addresses this packet's own payload (weak mode: every packet places itself).
	format(q *QP, w *sendWQE, idx uint32, last bool, off, n uint64) (op wire.Opcode, ooh wire.OOH, hasOOH, ownVA bool)
	// sent records the transmission of PSNs [psn, next) of the WQE at index idx at time now.
	sent(q *QP, idx uint64, w *sendWQE, psn, next wire.PSN, now int64)
	// rtoShift is how many times the local ACK timeout is doubled now.
	rtoShift() uint8
	// onTimer runs the mode's own timers (weak mode's loss probe) when the QP's timer
	// fires; it reports whether the requester has packets to send.
	onTimer(q *QP, now int64) bool
	// probeDue reports whether the mode's own loss timer is due at now (q.mu held).
	probeDue(now int64) bool
	// resend makes the requester send again from psn: after an RNR wait, and after a local
	// ACK timeout (with the retry already counted; timeout says which).
	resend(q *QP, psn wire.PSN, timeout bool)

	// holeCounts returns the holes opened and closed so far (zero in ordered mode).
	holeCounts() (opened, closed uint64)
	// holes reports the open holes (none in ordered mode).
	holes() Holes
}

// modeFor returns the mode a QP entering RTR with attributes a uses.
func (q *QP) modeFor(a *Attr) mode {
	switch {
	case q.service == ServiceUD:
		return ud{}
	case a.Ordering == Weak:
		return newWeakState(q, a.MaxHole, q.resp.epsn)
	}
	return ordered{}
}

// initialMode is the mode of a QP before RTR (and after RESET): what posting and
// receiving check against until the connection's mode is known.
func (q *QP) initialMode() mode {
	if q.service == ServiceUD {
		return ud{}
	}
	return ordered{}
}

// rcFrom is the RC modes' source check: the peer's address, and its UDP source port if
// the QP was told it (Attr.PeerSrcPort).
func rcFrom(q *QP, from netip.AddrPort) bool {
	return q.peer != nil && from.Addr() == q.peer.AP.Addr() && (q.attr.PeerSrcPort == 0 || from.Port() == q.attr.PeerSrcPort)
}

// rcCheckPost refuses what an RC QP does not take.
func rcCheckPost(hasAH bool) error {
	if hasAH {
		return errors.New("an RC QP sends to its connected peer: the work request has an address handle")
	}
	return nil
}

// established notes the first request on an RC connection: in RTR it raises the
// communication-established event (the QP may move to RTS).
func (q *QP) established() {
	if !q.commEst {
		q.commEst = true
		if q.state == StateRTR {
			q.dev.raise(Event{Type: EventCommEst, QP: q, Detail: "first packet received in RTR"})
		}
	}
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
	return q.mode.holes()
}
