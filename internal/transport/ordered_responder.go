package transport

import (
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// orderedResponder is the ordered responder: requests are taken in PSN order only (a gap
// is NAKed once, a duplicate answered again), one message at a time, a multi-packet SEND
// or WRITE placed packet by packet as it continues.
type orderedResponder struct {
	q        *QP
	rs       *responder
	sending  bool        // inside a multi-packet SEND
	writing  bool        // inside a multi-packet WRITE
	msgPkts  uint32      // packets of the message in progress so far
	sendOff  uint64      // bytes of the SEND placed so far
	writeMem []byte      // what is left of the WRITE's target
	placed   bool        // the packet being handled was copied to writeMem as it was verified (QP.inputDirect)
	writeReg *tpt.Region // the region writeMem lies in
	writeLen uint32
}

// takes reports whether a request with opcode flags f is an ordered RC request.
func (*orderedResponder) takes(f uint32) bool { return f&(wire.IsWeak|wire.IsUD) == 0 }

// request runs the ordered responder for one request packet.
func (o *orderedResponder) request(p *wire.Packet) {
	q, rs := o.q, o.rs
	psn := p.BTH.PSN
	switch d := psn.Diff(rs.epsn); {
	case d > 0:
		q.stats.OutOfSequence++
		if !rs.nakSent {
			rs.nakSent = true
			rs.sendNak(wire.AETHNak|wire.NakPSNSeqError, rs.epsn)
		}
		return
	case d < 0:
		o.duplicate(p)
		return
	}
	rs.nakSent = false
	f := p.Info.Flags
	// Opcode sequence: a multi-packet SEND or WRITE continues until its LAST.
	if o.sending && !(f&wire.IsSend != 0 && f&wire.IsFirst == 0) ||
		o.writing && !(f&wire.IsWrite != 0 && f&wire.IsFirst == 0) ||
		!o.sending && f&wire.IsSend != 0 && f&wire.IsFirst == 0 ||
		!o.writing && f&wire.IsWrite != 0 && f&wire.IsFirst == 0 {
		rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorOpcodeOrder, "opcode out of sequence")
		return
	}
	// Payload length: FIRST and MIDDLE carry exactly one MTU, LAST 1..MTU, ONLY 0..MTU.
	if f&wire.HasPayload != 0 {
		l := uint32(len(p.Payload))
		bad := l > q.mtu
		if f&(wire.IsFirst|wire.IsLast) != wire.IsFirst|wire.IsLast {
			if f&wire.IsLast == 0 {
				bad = bad || l != q.mtu
			} else {
				bad = bad || l == 0
			}
		}
		if bad {
			rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorLength, "packet payload length invalid for its opcode")
			return
		}
	}
	if q.lq != nil && f&(wire.IsSend|wire.IsWrite) != 0 {
		var add [NumLimits]uint32
		add[LimitInOrderSegs] = 1
		if f&wire.IsFirst != 0 {
			add[LimitInOrderMsgs] = 1
		}
		if q.srq && (f&wire.IsSend != 0 && f&wire.IsFirst != 0 || f&wire.HasImmDt != 0 && f&wire.IsWrite != 0) {
			add[LimitSRQHeld] = 1
		}
		if !q.admit(psn, &add, f&wire.IsSend != 0 || f&(wire.IsWrite|wire.HasImmDt) == wire.IsWrite|wire.HasImmDt) {
			return
		}
	}
	if f&wire.IsFirst != 0 {
		o.msgPkts = 0
	}
	o.msgPkts++
	switch {
	case f&wire.IsSend != 0:
		o.recvSend(p)
	case f&wire.IsWrite != 0:
		o.recvWrite(p)
	case f&wire.IsRead != 0:
		o.recvRead(p)
	case f&wire.IsAtomic != 0:
		o.recvAtomic(p)
	}
}

// directTarget returns where the payload of request p goes if p is the next packet of the
// RDMA WRITE the responder is placing (a MIDDLE or LAST without immediate, at the
// expected PSN, of a valid length, its region still registered, no limit queue to
// admit it): the bytes recvWrite would copy it to. It changes nothing (its ICRC is not
// verified yet); nil for any other packet.
func (o *orderedResponder) directTarget(p *wire.Packet) []byte {
	q, rs := o.q, o.rs
	f := p.Info.Flags
	if !o.writing || q.lq != nil || p.BTH.PSN != rs.epsn ||
		f&wire.IsWrite == 0 || f&(wire.IsFirst|wire.HasImmDt) != 0 {
		return nil
	}
	n := len(p.Payload)
	switch {
	case n == 0 || n > len(o.writeMem) || uint32(n) > q.mtu, o.writeReg.Revoked():
		return nil
	case f&wire.IsLast == 0 && uint32(n) != q.mtu, f&wire.IsLast != 0 && n != len(o.writeMem):
		return nil
	}
	return o.writeMem[:n]
}

func (o *orderedResponder) recvSend(p *wire.Packet) {
	q, rs := o.q, o.rs
	f := p.Info.Flags
	if f&wire.HasIETH != 0 {
		// SEND with Invalidate needs memory windows or fast-registered regions, which
		// softrnic does not have.
		rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorOpcodeOrder, "SEND with invalidate is not supported")
		return
	}
	if f&wire.IsFirst != 0 {
		if !q.rq.pop(&rs.rwqe) {
			rs.sendRNR(rs.epsn)
			return
		}
		if q.srq {
			q.srqTaken++
		}
		rs.haveRWQE = true
		o.sendOff = 0
		if rs.rwqe.verr != 0 {
			rs.respFatal(wire.NakRemoteOpError, StatusLocProtErr, rs.rwqe.verr, "receive WQE has an invalid local key")
			return
		}
	}
	if o.sendOff+uint64(len(p.Payload)) > rs.rwqe.length {
		rs.respFatal(wire.NakInvalidRequest, StatusLocLenErr, VendorLength, "message longer than the receive buffer")
		return
	}
	if rs.rwqe.revoked() {
		rs.respFatal(wire.NakRemoteOpError, StatusLocProtErr, VendorRevoked, "receive buffer deregistered during the message")
		return
	}
	scatter(rs.rwqe.segs, o.sendOff, p.Payload)
	o.sendOff += uint64(len(p.Payload))
	rs.epsn = rs.epsn.Add(1)
	if f&wire.IsLast != 0 {
		e := CQE{WRID: rs.rwqe.wrID, QPN: q.qpn, SrcQP: q.attr.DestQPN, ByteLen: uint32(o.sendOff),
			Opcode: WCRecv, solicited: p.BTH.SE, srq: q.srq}
		if f&wire.HasImmDt != 0 {
			e.Imm, e.Flags = p.Imm, WCFlagWithImm
		}
		rs.haveRWQE, o.sending = false, false
		clear(rs.rwqe.segs)
		clear(rs.rwqe.regs)
		rs.msn = (rs.msn + 1) & wire.PSNMask
		q.recvCQ.push(&e)
	} else {
		o.sending = true
	}
	rs.requestAck(p)
}

func (o *orderedResponder) recvWrite(p *wire.Packet) {
	q, rs := o.q, o.rs
	f := p.Info.Flags
	if f&wire.IsFirst != 0 {
		reth := &p.RETH
		if reth.DMALen > MaxMessage {
			rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorLength, "RDMA WRITE longer than 2^31 bytes")
			return
		}
		mem, reg, ok := rs.remoteMem(tpt.RemoteWrite, reth.RKey, reth.VA, uint64(reth.DMALen), "RDMA WRITE")
		if !ok {
			return
		}
		// ONLY carries the whole message; FIRST one MTU of a longer one.
		if f&wire.IsLast != 0 && uint32(len(p.Payload)) != reth.DMALen ||
			f&wire.IsLast == 0 && reth.DMALen <= q.mtu {
			rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorLength, "RDMA WRITE length does not match its DMA length")
			return
		}
		o.writeMem, o.writeReg, o.writeLen = mem, reg, reth.DMALen
	} else if o.writeReg.Revoked() {
		rs.revoked(rs.epsn, "RDMA WRITE target deregistered during the message")
		return
	}
	if len(p.Payload) > len(o.writeMem) || f&wire.IsLast != 0 && len(p.Payload) != len(o.writeMem) {
		rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorLength, "RDMA WRITE payload does not match its DMA length")
		return
	}
	if f&wire.HasImmDt != 0 && !rs.haveRWQE {
		// The immediate consumes a receive WQE; without one, nothing of this packet is placed.
		if !q.rq.pop(&rs.rwqe) {
			rs.sendRNR(rs.epsn)
			return
		}
		if q.srq {
			q.srqTaken++
		}
		rs.haveRWQE = true
	}
	if !o.placed { // else inputDirect copied it as it verified the ICRC
		copy(o.writeMem, p.Payload)
	}
	o.writeMem = o.writeMem[len(p.Payload):]
	rs.epsn = rs.epsn.Add(1)
	if f&wire.IsLast != 0 {
		o.writing = false
		o.writeMem, o.writeReg = nil, nil
		rs.msn = (rs.msn + 1) & wire.PSNMask
		if f&wire.HasImmDt != 0 {
			e := CQE{WRID: rs.rwqe.wrID, QPN: q.qpn, SrcQP: q.attr.DestQPN, ByteLen: o.writeLen,
				Opcode: WCRecvRDMAImm, Imm: p.Imm, Flags: WCFlagWithImm, solicited: p.BTH.SE, srq: q.srq}
			rs.haveRWQE = false
			clear(rs.rwqe.segs)
			clear(rs.rwqe.regs)
			q.recvCQ.push(&e)
		}
	} else {
		o.writing = true
	}
	rs.requestAck(p)
}

func (o *orderedResponder) recvRead(p *wire.Packet) {
	q, rs := o.q, o.rs
	reth := &p.RETH
	if reth.DMALen > MaxMessage {
		rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorLength, "RDMA READ longer than 2^31 bytes")
		return
	}
	mem, reg, ok := rs.remoteMem(tpt.RemoteRead, reth.RKey, reth.VA, uint64(reth.DMALen), "RDMA READ")
	if !ok {
		return
	}
	if len(rs.res) == 0 {
		rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorNone, "RDMA READ with max_dest_rd_atomic 0")
		return
	}
	npkts := packetsFor(reth.DMALen, q.mtu)
	psn := p.BTH.PSN
	last := psn.Add(npkts - 1)
	rs.addResource(respResource{kind: resRead, firstPSN: psn, lastPSN: last, start: psn, next: psn, stop: last, mem: mem, reg: reg}, npkts)
}

func (o *orderedResponder) recvAtomic(p *wire.Packet) {
	q, rs := o.q, o.rs
	at := &p.Atomic
	mem, _, ok := rs.remoteMem(tpt.RemoteAtomic, at.RKey, at.VA, 8, "atomics")
	if !ok {
		return
	}
	if len(rs.res) == 0 {
		rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorNone, "atomic with max_dest_rd_atomic 0")
		return
	}
	if at.VA%8 != 0 {
		rs.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorBounds, "atomic target not 8-byte aligned")
		return
	}
	orig := q.dev.executeAtomic(mem, p.BTH.Opcode == wire.OpFetchAdd, at.SwapAdd, at.Compare)
	psn := p.BTH.PSN
	rs.addResource(respResource{kind: resAtomic, firstPSN: psn, lastPSN: psn, start: psn, next: psn, stop: psn, orig: orig}, 1)
}

// duplicate answers a request the responder already executed: SEND and WRITE get the
// latest ACK again (asked for or not), READ and atomics are answered from the resource ring (atomics are
// never executed twice).
func (o *orderedResponder) duplicate(p *wire.Packet) {
	q, rs := o.q, o.rs
	q.stats.Duplicates++
	psn := p.BTH.PSN
	switch p.BTH.Opcode {
	case wire.OpReadRequest, wire.OpCompareSwap, wire.OpFetchAdd:
		kind := resRead
		if p.BTH.Opcode != wire.OpReadRequest {
			kind = resAtomic
		}
		for i := range rs.res {
			r := &rs.res[i]
			if r.kind != kind || psn.Before(r.firstPSN) || r.lastPSN.Before(psn) {
				continue
			}
			if kind == resAtomic && psn != r.firstPSN {
				continue
			}
			r.start, r.next, r.stop, r.replay = psn, psn, r.lastPSN, true
			rs.queueResource(i)
			return
		}
		// Not remembered any more (the requester exceeded max_dest_rd_atomic): drop.
	default:
		// Acknowledged again whether it asks or not (as Linux's rxe does): the requester
		// resends it because it lost the ACK.
		rs.ackPending = true
		rs.requestAck(p)
	}
}

// ack adds a standard ACK (or NAK) for psn, with the MSN, to b.
func (o *orderedResponder) ack(b *netio.SendBatch, syn uint8, psn wire.PSN) {
	q := o.q
	bth := wire.BTH{Opcode: wire.OpAcknowledge, PKey: wire.DefaultPKey, DestQP: q.attr.DestQPN, PSN: psn}
	hdr := b.Alloc(wire.BTHLen + wire.AETHLen)
	bth.Put(hdr)
	aeth := wire.AETH{Syndrome: syn, MSN: o.rs.msn}
	aeth.Put(hdr[wire.BTHLen:])
	q.emit(b, hdr, nil, 0)
}

// usage: the message in progress (an ordered responder has at most one).
func (o *orderedResponder) usage() (u [NumLimits]uint32) {
	if o.sending || o.writing {
		u[LimitInOrderMsgs] = 1
		u[LimitInOrderSegs] = o.msgPkts
	}
	return u
}

// abort: the message in progress ends (the responder flushes the WQE it took).
func (o *orderedResponder) abort() { o.sending, o.writing = false, false }
