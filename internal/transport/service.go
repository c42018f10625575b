package transport

import (
	"errors"
	"net/netip"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// service is what differs between a QP's transport services: reliable connected (rc,
// below: the requester, completer and responder, talking to one peer in the ordering mode
// chosen at RTR, see mode.go) and unreliable datagram (udService, ud.go: single-packet
// messages to and from any QP, which nothing acknowledges). It is chosen once, when the QP
// is created. Every method runs with q.mu held.
type service interface {
	// checkPost refuses a work request the service does not take (e.g. an RDMA READ on
	// a UD QP, an address handle on an RC QP), with the reason: its opcode, whether it has
	// an address handle, its remote QP number and its length. (Scalars, not the work
	// request: a pointer through an interface call would make the caller's work requests
	// escape to the heap.)
	checkPost(op uint8, hasAH bool, remoteQPN uint32, length uint64) error
	// from reports whether a packet from this address may be for the QP.
	from(a netip.AddrPort) bool
	// request handles a request packet (the QP is in RTR, RTS or SQD).
	request(p *wire.Packet)
	// response handles a response packet (the QP is in RTS or SQD).
	response(p *wire.Packet)
	// begin runs when the QP enters RTS, with the first PSN it sends.
	begin(psn wire.PSN)
	// fill builds packets of the send queue into b; it returns true when it stopped
	// because b is full.
	fill(b *netio.SendBatch) bool
	// transmitted runs after a batch holding the QP's packets was handed to the socket.
	transmitted()
}

// rc is the reliable-connected service: its roles are the QP's requester, completer and
// responder, in the QP's ordering mode.
type rc struct{ q *QP }

// checkPost: an RC QP sends to its connected peer.
func (rc) checkPost(_ uint8, hasAH bool, _ uint32, _ uint64) error {
	if hasAH {
		return errors.New("an RC QP sends to its connected peer: the work request has an address handle")
	}
	return nil
}

// from: only the peer's address, and its UDP source port if the QP was told it
// (Attr.PeerSrcPort).
func (s rc) from(a netip.AddrPort) bool {
	q := s.q
	return q.peer != nil && a.Addr() == q.peer.AP.Addr() && (q.attr.PeerSrcPort == 0 || a.Port() == q.attr.PeerSrcPort)
}

func (s rc) request(p *wire.Packet) {
	q := s.q
	o := q.resp.order
	if !o.takes(p.Info.Flags) {
		// A request of the other ordering mode is dropped and counted, whatever its PSN,
		// as rxe drops opcodes of another transport type: it is a late packet of the QP's
		// previous connection, a misconfigured peer or a blind injection, and none of
		// them may end the connection.
		q.stats.WrongMode++
		return
	}
	s.established()
	o.request(p)
}

// established notes the first request on the connection: in RTR it raises the
// communication-established event (the QP may move to RTS).
func (s rc) established() {
	q := s.q
	if !q.commEst {
		q.commEst = true
		if q.state == StateRTR {
			q.dev.raise(Event{Type: EventCommEst, QP: q, Detail: "first packet received in RTR"})
		}
	}
}

func (s rc) response(p *wire.Packet) {
	q := s.q
	if !p.BTH.PSN.Before(q.req.highPSN) {
		q.stats.Dropped++ // a response can only be for a PSN that was sent
		return
	}
	q.comp.order.response(p)
}

func (s rc) begin(psn wire.PSN)           { s.q.req.order.begin(psn) }
func (s rc) fill(b *netio.SendBatch) bool { return s.q.req.fill(b) }

// transmitted: nothing; an RC send completes when the peer acknowledges it (completer).
func (rc) transmitted() {}

// input handles a packet for this QP (rxMu held): in RTR, RTS or SQD, from an address the
// service takes packets from, a request goes to the service's receiving side, a response
// (once the QP sends, in RTS or SQD) to its completing side.
func (q *QP) input(p *wire.Packet, from netip.AddrPort, n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return
	}
	switch q.state {
	case StateRTR, StateRTS, StateSQD:
	default:
		q.stats.Dropped++
		return
	}
	if !q.svc.from(from) {
		q.stats.WrongSource++
		return
	}
	q.stats.RxPackets++
	q.stats.RxBytes += uint64(n)
	if p.Info.Flags&wire.IsRequest != 0 {
		q.svc.request(p)
		return
	}
	if q.state == StateRTR {
		q.stats.Dropped++
		return
	}
	q.svc.response(p)
}

// inputDirect is input for p, decoded from pkt before its ICRC was verified (see
// queue.placeDirect), if the QP's responder can say where its payload goes: only the
// ordered responder placing a multi-packet RDMA WRITE can (orderedResponder.directTarget;
// in weak mode and UD it is never writing). The ICRC is verified as the payload is copied
// there, then p is handled as input handles it, without copying it again. It returns
// false, having changed nothing, if the responder cannot say; true if it handled p or
// dropped it for its ICRC (rxMu held).
func (q *QP) inputDirect(u *queue, flow *wire.Flow, pkt []byte, p *wire.Packet, from netip.AddrPort) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.destroyed, q.state != StateRTR && q.state != StateRTS && q.state != StateSQD, !q.svc.from(from):
		return false
	}
	dst := q.ord.resp.directTarget(p)
	if dst == nil {
		return false
	}
	// The payload is a part of pkt (wire.Packet.Decode): its offset there.
	if _, ok := u.ids.VerifyICRCCopy(flow, pkt, cap(pkt)-cap(p.Payload), dst); !ok {
		u.rx.icrc++
		return true
	}
	u.rx.direct++
	q.stats.RxPackets++
	q.stats.RxBytes += uint64(len(pkt))
	q.ord.resp.placed = true
	q.svc.request(p)
	q.ord.resp.placed = false
	return true
}
