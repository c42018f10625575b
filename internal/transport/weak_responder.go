package transport

import (
	"net/netip"

	"github.com/softrnic/softrnic/internal/holes"
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// The weakly-ordered responder: every request packet placed or executed on arrival,
// receive WQEs bound by receive sequence number, READ responses and atomics held until
// the holes before them close, and selective acknowledgements (SACKs).

// inProgress returns the messages in progress and their packets placed.
func (ws *weakState) inProgress() (uint32, uint32) { return ws.inMsgs, ws.inSegs }

// weakRequest runs the weakly-ordered responder for one request packet.
func (q *QP) weakRequest(p *wire.Packet) {
	ws, rs := q.weak, &q.resp
	f := p.Info.Flags
	ooh, err := wire.DecodeOOH(p.Ext)
	if err != nil {
		q.stats.Dropped++
		return
	}
	if int32(ooh.TxSeq-ws.highTx) > 0 {
		ws.highTx = ooh.TxSeq
	}
	switch {
	case f&wire.IsRead != 0:
		q.weakRead(p, &ooh)
	case f&wire.IsAtomic != 0:
		q.weakAtomicReq(p, &ooh)
	default:
		q.weakData(p, &ooh)
	}
	if q.state == StateErr {
		return
	}
	if p.BTH.AckReq || ws.arrived.NumHoles() > 0 {
		rs.ackPending = true
	}
	ws.items = ws.arrived.Advance(ws.items[:0])
	for _, it := range ws.items {
		q.weakDeliver(it)
		if q.state == StateErr {
			return // refused: nothing behind it is delivered into the flushed queues
		}
	}
	rs.epsn = ws.arrived.Base()
	q.resp.requestAck(p)
}

// weakMark records the arrival of [psn, psn+n); it returns false (after acknowledging a
// duplicate, or dropping a packet past the span) if the packet is not new.
func (q *QP) weakMark(psn wire.PSN, n uint32) bool {
	ws := q.weak
	if n > 0 && ws.arrived.HasRange(psn, n) {
		q.stats.Duplicates++
		q.resp.ackPending = true
		return false
	}
	// Anything not inside [base, base+span) — including PSNs so far ahead that the 24-bit
	// difference wraps negative — is beyond the span: dropped without touching memory.
	if d := psn.Diff(ws.arrived.Base()); d < 0 || int64(d)+int64(n) > int64(ws.span) {
		q.stats.BeyondSpan++
		return false
	}
	return true
}

// weakArrived records that [psn, psn+n), checked by weakMark, was placed or accepted.
func (q *QP) weakArrived(psn wire.PSN, n uint32) {
	ws := q.weak
	if psn != ws.arrived.Base() {
		q.stats.PlacedOutOfOrder++
	}
	ws.arrived.Mark(psn, n)
}

// weakData places a SEND or WRITE packet.
func (q *QP) weakData(p *wire.Packet, o *wire.OOH) {
	ws := q.weak
	f := p.Info.Flags
	psn := p.BTH.PSN
	l := uint64(len(p.Payload))
	// The PSN first: a packet outside the window (a duplicate, or beyond the span) is
	// acknowledged or dropped before any check that could end the connection.
	if !q.weakMark(psn, 1) {
		return
	}
	npk := packetsFor(o.Length, q.mtu)
	inside := o.Offset < o.Length || o.Length == 0 && o.Offset == 0
	if o.Length > MaxMessage || !inside || o.Offset%q.mtu != 0 || l != min(uint64(q.mtu), uint64(o.Length-o.Offset)) {
		q.resp.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorLength, "packet payload does not match its offset and message length")
		return
	}
	recv := f&wire.IsSend != 0 || o.Flags&wire.OOHRecv != 0
	first := psn.Add(^(o.Offset / q.mtu) + 1) // the message's first PSN, as this packet says
	if q.lq != nil {
		var add [NumLimits]uint32
		if recv {
			got := uint32(0) // packets of the message already here
			if m := &ws.msgs[uint32(o.Seq)&(ws.span-1)]; !m.valid || m.rsn != o.Seq {
				add[LimitInOrderMsgs] = 1
				if q.srq {
					add[LimitSRQHeld] = 1
				}
			} else {
				got = m.got
			}
			add[LimitInOrderSegs] = 1
			if got+1 == npk && psn != ws.arrived.Base() {
				// The packet completes its message behind a hole: one more message held
				// out of order until the hole closes.
				add[LimitOOOMsgs] = 1
			}
		}
		if psn != ws.arrived.Base() {
			add[LimitOOOSegs] = 1
		}
		if d := (psn.Add(1)).Diff(ws.arrived.High()); d > 0 {
			add[LimitHoleSpan] = uint32(d)
		}
		if !q.admit(psn, &add, recv) {
			return
		}
	}
	var msg *weakMsg
	if recv {
		msg = &ws.msgs[uint32(o.Seq)&(ws.span-1)]
		if !msg.valid || msg.rsn != o.Seq {
			// The first packet of this message to arrive binds its receive WQE: the one
			// at its receive sequence number, so WQEs complete in posting order.
			// On a shared receive queue other QPs take WQEs too: this message takes the
			// next one now (completions still come in sequence order).
			k := uint32(o.Seq.Diff(ws.rsnBase))
			bound := false
			switch {
			case !o.Seq.InWindow(ws.rsnBase, ws.span):
			case q.srq:
				if bound = q.rq.pop(&msg.wqe); bound {
					q.srqTaken++
				}
			default:
				bound = q.rq.peek(int(k), &msg.wqe)
			}
			if !bound {
				if ws.rnrQuiet && psn != ws.rnrPSN {
					q.stats.Dropped++ // refused quietly: see weakState.rnrQuiet
					return
				}
				ws.rnrQuiet, ws.rnrPSN = true, psn
				q.resp.sendRNR(psn)
				return
			}
			ws.rnrQuiet = false
			if msg.wqe.verr != 0 {
				q.resp.respFatal(wire.NakRemoteOpError, StatusLocProtErr, msg.wqe.verr, "receive WQE has an invalid local key")
				return
			}
			msg.valid, msg.rsn, msg.first, msg.npk, msg.got, msg.length = true, o.Seq, first, npk, 0, o.Length
			msg.hasImm, msg.se, msg.write = false, false, f&wire.IsWrite != 0
			ws.inMsgs++
		}
		if msg.length != o.Length || msg.first != first {
			q.stats.Dropped++ // its packets disagree about the message
			return
		}
		if f&wire.IsSend != 0 && uint64(o.Length) > msg.wqe.length {
			q.weakRecvFatal(msg, wire.NakInvalidRequest, StatusLocLenErr, VendorLength, "message longer than the receive buffer")
			return
		}
	}
	if f&wire.IsWrite != 0 {
		mem, _, ok := q.resp.remoteMem(tpt.RemoteWrite, p.RETH.RKey, p.RETH.VA, l, "RDMA WRITE")
		if !ok {
			return
		}
		copy(mem, p.Payload)
	} else {
		if msg.wqe.revoked() {
			q.weakRecvFatal(msg, wire.NakRemoteOpError, StatusLocProtErr, VendorRevoked, "receive buffer deregistered during the message")
			return
		}
		scatter(msg.wqe.segs, uint64(o.Offset), p.Payload)
	}
	q.weakArrived(psn, 1)
	if msg == nil {
		return
	}
	if f&wire.HasImmDt != 0 {
		msg.imm, msg.hasImm = p.Imm, true
	}
	if p.BTH.SE {
		msg.se = true
	}
	ws.inSegs++
	if msg.got++; msg.got == msg.npk {
		ws.inMsgs--
		ws.inSegs -= msg.npk
		ws.arrived.Hold(holes.Item{PSN: first.Add(npk - 1), Kind: kindRecv, Ref: uint32(msg.rsn)})
	}
}

// weakRecvFatal fails the QP because of a message that bound a receive WQE. The WQE
// completes with status if it is the next to complete; otherwise it is flushed with the
// rest (an asynchronous event reports the error).
func (q *QP) weakRecvFatal(msg *weakMsg, nak, status uint8, verr uint32, why string) {
	rs := &q.resp
	switch {
	case q.srq: // taken from the SRQ already
		rs.rwqe.wrID, rs.haveRWQE = msg.wqe.wrID, true
	case msg.rsn == q.weak.rsnBase:
		rs.rwqe.segs = rs.rwqe.segs[:0]
		if q.rq.pop(&rs.rwqe) {
			rs.haveRWQE = true
		}
	}
	msg.valid = false
	q.resp.respFatal(nak, status, verr, why)
}

// weakRead prepares a READ request: checked now, answered when every request before it
// has arrived (its doorbell rings when the hole before it closes).
func (q *QP) weakRead(p *wire.Packet, o *wire.OOH) {
	ws, rs := q.weak, &q.resp
	psn := p.BTH.PSN
	reth := &p.RETH
	npk := packetsFor(reth.DMALen, q.mtu)
	if reth.DMALen > MaxMessage {
		// Checked after the PSN: a duplicate or a packet beyond the span is only that.
		if q.weakMark(psn, 1) {
			q.resp.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorLength, "RDMA READ longer than 2^31 bytes")
		}
		return
	}
	// The PSN first: a duplicate is answered, a packet beyond the span dropped, before
	// any check that can end the connection.
	if ws.arrived.HasRange(psn, npk) {
		// A re-request of responses that were lost: answer it from the resource.
		q.stats.Duplicates++
		if len(rs.res) == 0 {
			return
		}
		slot := int(uint32(o.Seq) % uint32(len(rs.res)))
		r := &rs.res[slot]
		if r.kind == resRead && !r.held && !psn.Before(r.firstPSN) && !r.lastPSN.Before(psn.Add(npk-1)) {
			r.start, r.next, r.stop = psn, psn, psn.Add(npk-1)
			q.resp.queueResource(slot)
		}
		return
	}
	if !q.weakMark(psn, npk) {
		return
	}
	slot, ok := q.weakSlot(o, "RDMA READ")
	if !ok {
		return
	}
	mem, reg, ok := q.resp.remoteMem(tpt.RemoteRead, reth.RKey, reth.VA, uint64(reth.DMALen), "RDMA READ")
	if !ok {
		return
	}
	last := psn.Add(npk - 1)
	q.resp.unqueueResource(slot)
	rs.res[slot] = respResource{kind: resRead, held: true, firstPSN: psn, lastPSN: last, start: psn, next: psn, stop: last, mem: mem, reg: reg}
	q.weakArrived(psn, npk)
	ws.arrived.Hold(holes.Item{PSN: last, Kind: kindReadReq, Ref: uint32(slot)})
}

// weakSlot returns the responder resource slot of a new READ or atomic request (its read
// sequence number modulo max_dest_rd_atomic), or ends the connection if the request is
// one the QP cannot hold.
func (q *QP) weakSlot(o *wire.OOH, what string) (int, bool) {
	rs := &q.resp
	if len(rs.res) == 0 {
		q.resp.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorNone, what+" with max_dest_rd_atomic 0")
		return 0, false
	}
	slot := int(uint32(o.Seq) % uint32(len(rs.res)))
	if rs.res[slot].held {
		q.resp.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorNone, "more RDMA READ and atomic requests outstanding than max_dest_rd_atomic")
		return 0, false
	}
	return slot, true
}

// weakAtomicReq checks an atomic now and executes it when every request before it has
// arrived.
func (q *QP) weakAtomicReq(p *wire.Packet, o *wire.OOH) {
	ws, rs := q.weak, &q.resp
	psn := p.BTH.PSN
	if ws.arrived.Has(psn) { // the PSN first, as for READ
		q.stats.Duplicates++
		if len(rs.res) == 0 {
			return
		}
		slot := int(uint32(o.Seq) % uint32(len(rs.res)))
		r := &rs.res[slot]
		if r.kind == resAtomic && !r.held && r.firstPSN == psn {
			r.start, r.next, r.stop = psn, psn, psn
			q.resp.queueResource(slot) // the recorded result again; never executed twice
		}
		return
	}
	if !q.weakMark(psn, 1) {
		return
	}
	slot, ok := q.weakSlot(o, "atomic")
	if !ok {
		return
	}
	at := &p.Atomic
	mem, reg, ok := q.resp.remoteMem(tpt.RemoteAtomic, at.RKey, at.VA, 8, "atomics")
	if !ok {
		return
	}
	if at.VA%8 != 0 {
		q.resp.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorBounds, "atomic target not 8-byte aligned")
		return
	}
	q.resp.unqueueResource(slot)
	rs.res[slot] = respResource{kind: resAtomic, held: true, firstPSN: psn, lastPSN: psn, start: psn, next: psn, stop: psn,
		mem: mem, reg: reg, swapAdd: at.SwapAdd, compare: at.Compare, fetchAdd: p.BTH.Opcode == wire.OpWeakFetchAdd}
	q.weakArrived(psn, 1)
	ws.arrived.Hold(holes.Item{PSN: psn, Kind: kindAtomic, Ref: uint32(slot)})
}

// weakDeliver acts on an item whose hole closed: a receive completion is posted, a READ's
// doorbell rings, an atomic is executed.
func (q *QP) weakDeliver(it holes.Item) {
	ws, rs := q.weak, &q.resp
	switch it.Kind {
	case kindRecv:
		msg := &ws.msgs[it.Ref&(ws.span-1)]
		if msg.rsn != ws.rsnBase {
			// Messages that consume receive WQEs must number them in PSN order.
			q.resp.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorOpcodeOrder, "receive sequence numbers out of order")
			return
		}
		if !q.srq {
			var w recvWQE
			w.segs, w.regs = msg.wqe.segs[:0], msg.wqe.regs[:0]
			q.rq.pop(&w) // the WQE msg bound: receive WQEs complete in sequence order
		}
		e := CQE{WRID: msg.wqe.wrID, QPN: q.qpn, SrcQP: q.attr.DestQPN, ByteLen: msg.length, Opcode: WCRecv, solicited: msg.se, srq: q.srq}
		if msg.write {
			e.Opcode = WCRecvRDMAImm
		}
		if msg.hasImm {
			e.Imm, e.Flags = msg.imm, WCFlagWithImm
		}
		msg.valid = false
		ws.rsnBase = ws.rsnBase.Add(1)
		rs.msn = (rs.msn + 1) & wire.PSNMask
		q.recvCQ.push(&e)
	case kindReadReq:
		rs.msn = (rs.msn + 1) & wire.PSNMask
		rs.res[it.Ref].held, rs.res[it.Ref].msn = false, rs.msn
		q.resp.queueResource(int(it.Ref))
	case kindAtomic:
		r := &rs.res[it.Ref]
		if r.kind != resAtomic || len(r.mem) < 8 {
			// Cannot happen while held slots are never reused; never run an atomic on
			// anything but its own 8 bytes.
			q.resp.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorNone, "atomic resource lost")
			return
		}
		if r.reg.Revoked() {
			q.resp.revoked(r.firstPSN, "atomic target deregistered before the atomic executed")
			return
		}
		orig := q.dev.executeAtomic(r.mem, r.fetchAdd, r.swapAdd, r.compare)
		rs.msn = (rs.msn + 1) & wire.PSNMask
		r.orig, r.held, r.mem, r.reg, r.msn = orig, false, nil, nil, rs.msn
		q.resp.queueResource(int(it.Ref))
	}
}

// sendSACK builds the selective acknowledgement: every PSN before the first hole, and the
// runs received beyond.
func (q *QP) sendSACK(b *netio.SendBatch, syn uint8, psn wire.PSN) {
	ws := q.weak
	ws.ranges = ws.arrived.Received(ws.ranges[:0], wire.MaxSACKRanges)
	hdr := b.Alloc(wire.BTHLen + wire.AETHLen + wire.SACKHeaderLen)
	bth := wire.BTH{Opcode: wire.OpWeakAck, PKey: wire.DefaultPKey, DestQP: q.attr.DestQPN, PSN: psn}
	bth.Put(hdr)
	aeth := wire.AETH{Syndrome: syn, MSN: q.resp.msn}
	aeth.Put(hdr[wire.BTHLen:])
	wire.PutSACKHeader(hdr[wire.BTHLen+wire.AETHLen:], len(ws.ranges), ws.highTx)
	pay := b.Alloc(len(ws.ranges) * wire.SACKRangeLen)
	wire.PutSACKRanges(pay, ws.ranges)
	q.emit(b, hdr, [][]byte{pay}, len(pay))
	q.stats.SACKsSent++
}

// flushTaken completes, with WR_FLUSH_ERR, receive WQEs that messages in progress took
// from a shared receive queue (the QP is entering ERR).
func (q *QP) flushTaken() {
	ws := q.weak
	for i := range ws.msgs {
		if m := &ws.msgs[i]; m.valid {
			q.recvCQ.push(&CQE{WRID: m.wqe.wrID, QPN: q.qpn, Status: StatusWRFlushErr, Opcode: WCRecv, srq: true})
			m.valid = false
		}
	}
}

func (*weakState) accepts(f uint32) bool { return f&wire.IsWeak != 0 }

// directTarget: weak mode places each packet at the address it carries; it takes the
// usual path, verified first.
func (*weakState) directTarget(*QP, *wire.Packet) []byte { return nil }

func (*weakState) request(q *QP, p *wire.Packet) {
	q.established()
	q.weakRequest(p)
}
func (*weakState) acceptsFrom(q *QP, from netip.AddrPort) bool { return rcFrom(q, from) }

func (*weakState) flushTaken(q *QP) { q.flushTaken() }

// ack: weak mode acknowledges selectively, everything before the first hole and the runs
// beyond it; NAKs and RNR NAKs travel the same way.
func (ws *weakState) ack(q *QP, b *netio.SendBatch, syn uint8, _ wire.PSN) {
	q.sendSACK(b, syn, ws.arrived.Base().Add(wire.PSNMask))
}

// usage: messages in progress, what is held out of order, and how far past the first
// hole packets arrived.
func (ws *weakState) usage(*QP) (u [NumLimits]uint32) {
	u[LimitOOOMsgs] = uint32(ws.arrived.Held())
	u[LimitOOOSegs] = ws.arrived.Ahead()
	u[LimitHoleSpan] = uint32(ws.arrived.High().Diff(ws.arrived.Base()))
	u[LimitInOrderMsgs], u[LimitInOrderSegs] = ws.inProgress()
	return u
}
