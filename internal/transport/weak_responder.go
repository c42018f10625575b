package transport

import (
	"github.com/softrnic/softrnic/internal/holes"
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// weakResponder is the weakly-ordered responder: every request packet placed or executed
// on arrival, receive WQEs bound by receive sequence number, READ responses and atomics
// held until the holes before them close, and selective acknowledgements (SACKs). The
// QP's responder does the rest: its ACK and NAK timing, the READ and atomic resources,
// the connection's fatal errors.
type weakResponder struct {
	q    *QP
	rs   *responder
	span uint32

	arrived *holes.Tracker // request PSNs arrived; Base is the expected PSN
	highTx  uint32         // highest transmission number received (echoed in SACKs)
	msgs    []weakMsg      // by receive sequence number & (span-1)
	rsnBase wire.PSN       // receive sequence number of the next receive WQE to consume
	inMsgs  uint32         // messages with a receive WQE in progress (not all packets placed)
	inSegs  uint32         // their packets placed
	// rnrQuiet: an RNR NAK went out for rnrPSN and no message has bound a receive WQE
	// since; packets refused meanwhile get no NAK of their own (the requester resends after
	// the one wait; a NAK per packet, arriving after that wait, would each cost a retry).
	rnrQuiet bool
	rnrPSN   wire.PSN

	items  []holes.Item  // scratch
	ranges [][2]wire.PSN // scratch
}

// weakMsg is a message that consumes a receive WQE, while its packets arrive.
type weakMsg struct {
	valid  bool
	rsn    wire.PSN
	first  wire.PSN // the message's first PSN
	npk    uint32   // packets
	got    uint32   // packets placed
	length uint32
	imm    uint32
	hasImm bool
	se     bool
	write  bool // WRITE with immediate
	wqe    recvWQE
}

// init makes the responder's state for a span of maxHole PSNs from epsn (rounded up as
// the hole tracker rounds it).
func (wp *weakResponder) init(q *QP, epsn wire.PSN, maxHole uint32) {
	wp.q, wp.rs = q, &q.resp
	wp.arrived = holes.New(epsn, maxHole)
	wp.span = wp.arrived.Span()
	wp.msgs = make([]weakMsg, wp.span)
}

// takes reports whether a request with opcode flags f is weakly ordered.
func (*weakResponder) takes(f uint32) bool { return f&wire.IsWeak != 0 }

// request runs the weakly-ordered responder for one request packet.
func (wp *weakResponder) request(p *wire.Packet) {
	q, rs := wp.q, wp.rs
	f := p.Info.Flags
	ooh, err := wire.DecodeOOH(p.Ext)
	if err != nil {
		q.stats.Dropped++
		return
	}
	if int32(ooh.TxSeq-wp.highTx) > 0 {
		wp.highTx = ooh.TxSeq
	}
	switch {
	case f&wire.IsRead != 0:
		wp.read(p, &ooh)
	case f&wire.IsAtomic != 0:
		wp.atomic(p, &ooh)
	default:
		wp.data(p, &ooh)
	}
	if q.state == StateErr {
		return
	}
	if p.BTH.AckReq || wp.arrived.NumHoles() > 0 {
		rs.ackPending = true
	}
	wp.items = wp.arrived.Advance(wp.items[:0])
	for _, it := range wp.items {
		wp.deliver(it)
		if q.state == StateErr {
			return // refused: nothing behind it is delivered into the flushed queues
		}
	}
	rs.epsn = wp.arrived.Base()
	rs.requestAck(p)
}

// mark records the arrival of [psn, psn+n); it returns false (after acknowledging a
// duplicate, or dropping a packet past the span) if the packet is not new.
func (wp *weakResponder) mark(psn wire.PSN, n uint32) bool {
	q := wp.q
	if n > 0 && wp.arrived.HasRange(psn, n) {
		q.stats.Duplicates++
		wp.rs.ackPending = true
		return false
	}
	// Anything not inside [base, base+span) — including PSNs so far ahead that the 24-bit
	// difference wraps negative — is beyond the span: dropped without touching memory.
	if d := psn.Diff(wp.arrived.Base()); d < 0 || int64(d)+int64(n) > int64(wp.span) {
		q.stats.BeyondSpan++
		return false
	}
	return true
}

// accepted records that [psn, psn+n), checked by mark, was placed or accepted.
func (wp *weakResponder) accepted(psn wire.PSN, n uint32) {
	q := wp.q
	if psn != wp.arrived.Base() {
		q.stats.PlacedOutOfOrder++
	}
	wp.arrived.Mark(psn, n)
}

// data places a SEND or WRITE packet.
func (wp *weakResponder) data(p *wire.Packet, o *wire.OOH) {
	q := wp.q
	f := p.Info.Flags
	psn := p.BTH.PSN
	l := uint64(len(p.Payload))
	// The PSN first: a packet outside the window (a duplicate, or beyond the span) is
	// acknowledged or dropped before any check that could end the connection.
	if !wp.mark(psn, 1) {
		return
	}
	npk := packetsFor(o.Length, q.mtu)
	inside := o.Offset < o.Length || o.Length == 0 && o.Offset == 0
	if o.Length > MaxMessage || !inside || o.Offset%q.mtu != 0 || l != min(uint64(q.mtu), uint64(o.Length-o.Offset)) {
		wp.rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorLength, "packet payload does not match its offset and message length")
		return
	}
	recv := f&wire.IsSend != 0 || o.Flags&wire.OOHRecv != 0
	first := psn.Add(^(o.Offset / q.mtu) + 1) // the message's first PSN, as this packet says
	if q.lq != nil {
		var add [NumLimits]uint32
		if recv {
			got := uint32(0) // packets of the message already here
			if m := &wp.msgs[uint32(o.Seq)&(wp.span-1)]; !m.valid || m.rsn != o.Seq {
				add[LimitInOrderMsgs] = 1
				if q.srq {
					add[LimitSRQHeld] = 1
				}
			} else {
				got = m.got
			}
			add[LimitInOrderSegs] = 1
			if got+1 == npk && psn != wp.arrived.Base() {
				// The packet completes its message behind a hole: one more message held
				// out of order until the hole closes.
				add[LimitOOOMsgs] = 1
			}
		}
		if psn != wp.arrived.Base() {
			add[LimitOOOSegs] = 1
		}
		if d := (psn.Add(1)).Diff(wp.arrived.High()); d > 0 {
			add[LimitHoleSpan] = uint32(d)
		}
		if !q.admit(psn, &add, recv) {
			return
		}
	}
	var msg *weakMsg
	if recv {
		msg = &wp.msgs[uint32(o.Seq)&(wp.span-1)]
		if !msg.valid || msg.rsn != o.Seq {
			// The first packet of this message to arrive binds its receive WQE: the one
			// at its receive sequence number, so WQEs complete in posting order.
			// On a shared receive queue other QPs take WQEs too: this message takes the
			// next one now (completions still come in sequence order).
			k := uint32(o.Seq.Diff(wp.rsnBase))
			bound := false
			switch {
			case !o.Seq.InWindow(wp.rsnBase, wp.span):
			case q.srq:
				if bound = q.rq.pop(&msg.wqe); bound {
					q.srqTaken++
				}
			default:
				bound = q.rq.peek(int(k), &msg.wqe)
			}
			if !bound {
				if wp.rnrQuiet && psn != wp.rnrPSN {
					q.stats.Dropped++ // refused quietly: see weakResponder.rnrQuiet
					return
				}
				wp.rnrQuiet, wp.rnrPSN = true, psn
				wp.rs.sendRNR(psn)
				return
			}
			wp.rnrQuiet = false
			if msg.wqe.verr != 0 {
				wp.rs.respFatal(wire.NakRemoteOpError, StatusLocProtErr, msg.wqe.verr, "receive WQE has an invalid local key")
				return
			}
			msg.valid, msg.rsn, msg.first, msg.npk, msg.got, msg.length = true, o.Seq, first, npk, 0, o.Length
			msg.hasImm, msg.se, msg.write = false, false, f&wire.IsWrite != 0
			wp.inMsgs++
		}
		if msg.length != o.Length || msg.first != first {
			q.stats.Dropped++ // its packets disagree about the message
			return
		}
		if f&wire.IsSend != 0 && uint64(o.Length) > msg.wqe.length {
			wp.recvFatal(msg, wire.NakInvalidRequest, StatusLocLenErr, VendorLength, "message longer than the receive buffer")
			return
		}
	}
	if f&wire.IsWrite != 0 {
		mem, _, ok := wp.rs.remoteMem(tpt.RemoteWrite, p.RETH.RKey, p.RETH.VA, l, "RDMA WRITE")
		if !ok {
			return
		}
		copy(mem, p.Payload)
	} else {
		if msg.wqe.revoked() {
			wp.recvFatal(msg, wire.NakRemoteOpError, StatusLocProtErr, VendorRevoked, "receive buffer deregistered during the message")
			return
		}
		scatter(msg.wqe.segs, uint64(o.Offset), p.Payload)
	}
	wp.accepted(psn, 1)
	if msg == nil {
		return
	}
	if f&wire.HasImmDt != 0 {
		msg.imm, msg.hasImm = p.Imm, true
	}
	if p.BTH.SE {
		msg.se = true
	}
	wp.inSegs++
	if msg.got++; msg.got == msg.npk {
		wp.inMsgs--
		wp.inSegs -= msg.npk
		wp.arrived.Hold(holes.Item{PSN: first.Add(npk - 1), Kind: kindRecv, Ref: uint32(msg.rsn)})
	}
}

// recvFatal fails the QP because of a message that bound a receive WQE. The WQE
// completes with status if it is the next to complete; otherwise it is flushed with the
// rest (an asynchronous event reports the error).
func (wp *weakResponder) recvFatal(msg *weakMsg, nak, status uint8, verr uint32, why string) {
	q := wp.q
	rs := wp.rs
	switch {
	case q.srq: // taken from the SRQ already
		rs.rwqe.wrID, rs.haveRWQE = msg.wqe.wrID, true
	case msg.rsn == wp.rsnBase:
		rs.rwqe.segs = rs.rwqe.segs[:0]
		if q.rq.pop(&rs.rwqe) {
			rs.haveRWQE = true
		}
	}
	msg.valid = false
	rs.respFatal(nak, status, verr, why)
}

// read prepares a READ request: checked now, answered when every request before it
// has arrived (its doorbell rings when the hole before it closes).
func (wp *weakResponder) read(p *wire.Packet, o *wire.OOH) {
	q := wp.q
	rs := wp.rs
	psn := p.BTH.PSN
	reth := &p.RETH
	npk := packetsFor(reth.DMALen, q.mtu)
	if reth.DMALen > MaxMessage {
		// Checked after the PSN: a duplicate or a packet beyond the span is only that.
		if wp.mark(psn, 1) {
			rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorLength, "RDMA READ longer than 2^31 bytes")
		}
		return
	}
	// The PSN first: a duplicate is answered, a packet beyond the span dropped, before
	// any check that can end the connection.
	if wp.arrived.HasRange(psn, npk) {
		// A re-request of responses that were lost: answer it from the resource.
		q.stats.Duplicates++
		if len(rs.res) == 0 {
			return
		}
		slot := int(uint32(o.Seq) % uint32(len(rs.res)))
		r := &rs.res[slot]
		if r.kind == resRead && !r.held && !psn.Before(r.firstPSN) && !r.lastPSN.Before(psn.Add(npk-1)) {
			r.start, r.next, r.stop = psn, psn, psn.Add(npk-1)
			rs.queueResource(slot)
		}
		return
	}
	if !wp.mark(psn, npk) {
		return
	}
	slot, ok := wp.slot(o, "RDMA READ")
	if !ok {
		return
	}
	mem, reg, ok := rs.remoteMem(tpt.RemoteRead, reth.RKey, reth.VA, uint64(reth.DMALen), "RDMA READ")
	if !ok {
		return
	}
	last := psn.Add(npk - 1)
	rs.unqueueResource(slot)
	rs.res[slot] = respResource{kind: resRead, held: true, firstPSN: psn, lastPSN: last, start: psn, next: psn, stop: last, mem: mem, reg: reg}
	wp.accepted(psn, npk)
	wp.arrived.Hold(holes.Item{PSN: last, Kind: kindReadReq, Ref: uint32(slot)})
}

// slot returns the responder resource slot of a new READ or atomic request (its read
// sequence number modulo max_dest_rd_atomic), or ends the connection if the request is
// one the QP cannot hold.
func (wp *weakResponder) slot(o *wire.OOH, what string) (int, bool) {
	rs := wp.rs
	if len(rs.res) == 0 {
		rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorNone, what+" with max_dest_rd_atomic 0")
		return 0, false
	}
	slot := int(uint32(o.Seq) % uint32(len(rs.res)))
	if rs.res[slot].held {
		rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorNone, "more RDMA READ and atomic requests outstanding than max_dest_rd_atomic")
		return 0, false
	}
	return slot, true
}

// atomic checks an atomic now and executes it when every request before it has
// arrived.
func (wp *weakResponder) atomic(p *wire.Packet, o *wire.OOH) {
	q := wp.q
	rs := wp.rs
	psn := p.BTH.PSN
	if wp.arrived.Has(psn) { // the PSN first, as for READ
		q.stats.Duplicates++
		if len(rs.res) == 0 {
			return
		}
		slot := int(uint32(o.Seq) % uint32(len(rs.res)))
		r := &rs.res[slot]
		if r.kind == resAtomic && !r.held && r.firstPSN == psn {
			r.start, r.next, r.stop = psn, psn, psn
			rs.queueResource(slot) // the recorded result again; never executed twice
		}
		return
	}
	if !wp.mark(psn, 1) {
		return
	}
	slot, ok := wp.slot(o, "atomic")
	if !ok {
		return
	}
	at := &p.Atomic
	mem, reg, ok := rs.remoteMem(tpt.RemoteAtomic, at.RKey, at.VA, 8, "atomics")
	if !ok {
		return
	}
	if at.VA%8 != 0 {
		rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorBounds, "atomic target not 8-byte aligned")
		return
	}
	rs.unqueueResource(slot)
	rs.res[slot] = respResource{kind: resAtomic, held: true, firstPSN: psn, lastPSN: psn, start: psn, next: psn, stop: psn,
		mem: mem, reg: reg, swapAdd: at.SwapAdd, compare: at.Compare, fetchAdd: p.BTH.Opcode == wire.OpWeakFetchAdd}
	wp.accepted(psn, 1)
	wp.arrived.Hold(holes.Item{PSN: psn, Kind: kindAtomic, Ref: uint32(slot)})
}

// deliver acts on an item whose hole closed: a receive completion is posted, a READ's
// doorbell rings, an atomic is executed.
func (wp *weakResponder) deliver(it holes.Item) {
	q := wp.q
	rs := wp.rs
	switch it.Kind {
	case kindRecv:
		msg := &wp.msgs[it.Ref&(wp.span-1)]
		if msg.rsn != wp.rsnBase {
			// Messages that consume receive WQEs must number them in PSN order.
			rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorOpcodeOrder, "receive sequence numbers out of order")
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
		wp.rsnBase = wp.rsnBase.Add(1)
		rs.msn = (rs.msn + 1) & wire.PSNMask
		q.recvCQ.push(&e)
	case kindReadReq:
		rs.msn = (rs.msn + 1) & wire.PSNMask
		rs.res[it.Ref].held, rs.res[it.Ref].msn = false, rs.msn
		rs.queueResource(int(it.Ref))
	case kindAtomic:
		r := &rs.res[it.Ref]
		if r.kind != resAtomic || len(r.mem) < 8 {
			// Cannot happen while held slots are never reused; never run an atomic on
			// anything but its own 8 bytes.
			rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorNone, "atomic resource lost")
			return
		}
		if r.reg.Revoked() {
			rs.revoked(r.firstPSN, "atomic target deregistered before the atomic executed")
			return
		}
		orig := q.dev.executeAtomic(r.mem, r.fetchAdd, r.swapAdd, r.compare)
		rs.msn = (rs.msn + 1) & wire.PSNMask
		r.orig, r.held, r.mem, r.reg, r.msn = orig, false, nil, nil, rs.msn
		rs.queueResource(int(it.Ref))
	}
}

// ack sends the selective acknowledgement, the form ACKs, NAKs and RNR NAKs (syndrome syn)
// all take in weak mode: every PSN before the first hole (its PSN is the last of them, not
// psn) and the runs received beyond.
func (wp *weakResponder) ack(b *netio.SendBatch, syn uint8, _ wire.PSN) {
	q := wp.q
	wp.ranges = wp.arrived.Received(wp.ranges[:0], wire.MaxSACKRanges)
	hdr := b.Alloc(wire.BTHLen + wire.AETHLen + wire.SACKHeaderLen)
	bth := wire.BTH{Opcode: wire.OpWeakAck, PKey: wire.DefaultPKey, DestQP: q.attr.DestQPN, PSN: wp.arrived.Base().Add(wire.PSNMask)}
	bth.Put(hdr)
	aeth := wire.AETH{Syndrome: syn, MSN: wp.rs.msn}
	aeth.Put(hdr[wire.BTHLen:])
	wire.PutSACKHeader(hdr[wire.BTHLen+wire.AETHLen:], len(wp.ranges), wp.highTx)
	pay := b.Alloc(len(wp.ranges) * wire.SACKRangeLen)
	wire.PutSACKRanges(pay, wp.ranges)
	q.emit(b, hdr, [][]byte{pay}, len(pay))
	q.stats.SACKsSent++
}

// usage: messages in progress, what is held out of order, and how far past the first
// hole packets arrived.
func (wp *weakResponder) usage() (u [NumLimits]uint32) {
	u[LimitOOOMsgs] = uint32(wp.arrived.Held())
	u[LimitOOOSegs] = wp.arrived.Ahead()
	u[LimitHoleSpan] = uint32(wp.arrived.High().Diff(wp.arrived.Base()))
	u[LimitInOrderMsgs], u[LimitInOrderSegs] = wp.inMsgs, wp.inSegs
	return u
}

// abort: receive WQEs that messages in progress took from a shared receive queue
// complete with WR_FLUSH_ERR (those of the QP's own queue are still in it, and the QP
// flushes it whole).
func (wp *weakResponder) abort() {
	q := wp.q
	if !q.srq {
		return
	}
	for i := range wp.msgs {
		if m := &wp.msgs[i]; m.valid {
			q.recvCQ.push(&CQE{WRID: m.wqe.wrID, QPN: q.qpn, Status: StatusWRFlushErr, Opcode: WCRecv, srq: true})
			m.valid = false
		}
	}
}
