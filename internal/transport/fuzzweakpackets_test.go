package transport

import (
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// Opcode tables the weak-mode packet records index into: the weak-mode requests (for a
// responder) and what a weak responder sends back (for a requester; SACKs twice as often).
var (
	fuzzWeakReqOps = []wire.Opcode{
		wire.OpWeakSend, wire.OpWeakSendImm, wire.OpWeakWrite, wire.OpWeakWriteImm, wire.OpWeakReadReq,
		wire.OpWeakCmpSwap, wire.OpWeakFetchAdd,
	}
	fuzzWeakRespOps = []wire.Opcode{
		wire.OpWeakAck, wire.OpReadResponseFirst, wire.OpReadResponseMiddle, wire.OpReadResponseLast,
		wire.OpReadResponseOnly, wire.OpAtomicAcknowledge, wire.OpWeakAck,
	}
)

// weakEnv is what a weak-mode packet record is built against.
type weakEnv struct {
	pktEnv
	txSeq uint32 // the requester's transmissions so far (a SACK's echo is relative to it)
}

// Weak-mode packet record layout (see buildWeakPacket; fields one byte unless noted):
//
//	ctl   bits 0-2 kind: 0-5 built packet, 6 raw bytes + ICRC, 7 raw bytes as they are
//	      bit 3 do not run finishBatch after this packet
//	      bit 4 corrupt the ICRC
//	      bit 5 the opcode is the next byte (any opcode), not an index into env.ops
//	      bit 6 no AckReq
//	      bit 7 send from an address other than the QP's peer (ICRC computed for it)
//	raw:  n, n bytes
//	built:
//	op    env.ops[op % len] (with ctl bit 5: the opcode)
//	psnd  0x80: PSN = the u24 that follows; else PSN = base + int8(psnd)
//	pm [u16] fill   if the opcode carries a payload other than SACK ranges (as buildPacket)
//	then the standard extended headers the opcode has, as buildPacket reads them, then:
//	OOH   sq: < 0x80 Seq = sq, else the u24 that follows
//	      om: bits 0-2 k; bits 3-4 Offset: 0 k*MTU, 1 k*MTU+4, 2 the u32 that follows,
//	          3 2^32-1-k; bits 5-6 Length: 0 Offset+payload (the message's last packet),
//	          1 Offset+payload+1+u8 (more packets follow), 2 the u32 that follows, 3 k*MTU;
//	          bit 7 Flags is the byte that follows (else OOHRecv for SENDs and WRITEs with
//	          immediate, as softrnic sends them)
//	      tx: TxSeq = tx (0xFF: the u32 that follows)
//	SACK  sn: bits 0-4 number of ranges (more than 16 is malformed); bit 5 the count word
//	          is the u32 that follows; bit 6 the payload is one byte short; bit 7 the echo
//	          is the u32 that follows, else the byte e that follows: env.txSeq + int8(e)
//	      per range: a: start = base + int8(a) (0x80: the u24 that follows); l: end = start + l
func buildWeakPacket(r *fuzzReader, env *weakEnv) (pkt []byte, fromBad, flush bool) {
	ctl := r.u8()
	flush = ctl&0x08 == 0
	fromBad = ctl&0x80 != 0
	flow := &env.good
	if fromBad {
		flow = &env.bad
	}
	defer func() {
		if ctl&0x10 != 0 && len(pkt) > 0 {
			pkt[len(pkt)-1] ^= 0x01
		}
	}()
	if kind := ctl & 7; kind >= 6 {
		pkt = append([]byte(nil), r.take(int(r.u8()))...)
		if kind == 6 && len(pkt) >= wire.BTHLen {
			pkt[2], pkt[3] = 0xFF, 0xFF
			pkt[5], pkt[6], pkt[7] = byte(env.destQP>>16), byte(env.destQP>>8), byte(env.destQP)
			pkt = wiretest.AppendICRC(flow, pkt)
		}
		return pkt, fromBad, flush
	}
	var op wire.Opcode
	if ctl&0x20 != 0 {
		op = wire.Opcode(r.u8())
	} else {
		op = env.ops[int(r.u8())%len(env.ops)]
	}
	var psn wire.PSN
	if d := r.u8(); d != 0x80 {
		psn = wire.PSN(uint32(env.psnBase.Add(uint32(int32(int8(d))) & wire.PSNMask)))
	} else {
		psn = wire.PSN(r.u24())
	}
	info := op.Info()
	f := info.Flags
	sack := op == wire.OpWeakAck
	var pl int
	var fill byte
	if f&wire.HasPayload != 0 && !sack {
		pl = payloadLen(r, env.mtu)
		fill = r.u8()
	}
	hl := wire.BTHLen
	if info.Valid {
		hl = info.HdrLen
	}
	hdr := make([]byte, hl)
	o := putExtHeaders(r, &env.pktEnv, hdr, f, pl)
	var pay []byte
	switch {
	case sack && hl-o == wire.SACKHeaderLen:
		pay = weakSACKFields(r, env, hdr[o:])
	case f&wire.IsWeak != 0 && hl-o == wire.OOHLen:
		weakOOHFields(r, env, hdr[o:], op, pl)
	}
	for i := 0; i < pl; i++ {
		pay = append(pay, fill+byte(i))
	}
	pad := wire.PadFor(len(pay))
	bth := wire.BTH{Opcode: op, AckReq: ctl&0x40 == 0, PKey: wire.DefaultPKey, DestQP: env.destQP, PSN: wire.PSN(psn), PadCnt: uint8(pad)}
	bth.Put(hdr)
	pkt = append(append(hdr, pay...), make([]byte, pad)...)
	return wiretest.AppendICRC(flow, pkt), fromBad, flush
}

// weakOOHFields reads an OOH record (see buildWeakPacket) into b.
func weakOOHFields(r *fuzzReader, env *weakEnv, b []byte, op wire.Opcode, pl int) {
	var o wire.OOH
	if sq := r.u8(); sq < 0x80 {
		o.Seq = wire.PSN(uint32(sq))
	} else {
		o.Seq = wire.PSN(r.u24())
	}
	om := r.u8()
	k := uint32(om & 7)
	mtu := uint32(env.mtu)
	switch om >> 3 & 3 {
	case 0:
		o.Offset = k * mtu
	case 1:
		o.Offset = k*mtu + 4
	case 2:
		o.Offset = r.u32()
	case 3:
		o.Offset = ^uint32(0) - k
	}
	switch om >> 5 & 3 {
	case 0:
		o.Length = o.Offset + uint32(pl)
	case 1:
		o.Length = o.Offset + uint32(pl) + 1 + uint32(r.u8())
	case 2:
		o.Length = r.u32()
	case 3:
		o.Length = k * mtu
	}
	if om&0x80 != 0 {
		o.Flags = r.u8()
	} else if op == wire.OpWeakSend || op == wire.OpWeakSendImm || op == wire.OpWeakWriteImm {
		o.Flags = wire.OOHRecv
	}
	if tx := r.u8(); tx != 0xFF {
		o.TxSeq = uint32(tx)
	} else {
		o.TxSeq = r.u32()
	}
	o.Put(b)
}

// weakSACKFields reads a SACK record (see buildWeakPacket): it writes the SACK header into
// hdr and returns the ranges' bytes.
func weakSACKFields(r *fuzzReader, env *weakEnv, hdr []byte) []byte {
	sn := r.u8()
	n := int(sn & 0x1F)
	count := uint32(n)
	if sn&0x20 != 0 {
		count = r.u32()
	}
	var echo uint32
	if sn&0x80 != 0 {
		echo = r.u32()
	} else {
		echo = env.txSeq + uint32(int32(int8(r.u8())))
	}
	wire.PutSACKHeader(hdr, 0, echo)
	putBE32(hdr, count)
	pay := make([]byte, 0, n*wire.SACKRangeLen)
	for i := 0; i < n; i++ {
		var a wire.PSN
		if d := r.u8(); d != 0x80 {
			a = env.psnBase.Add(uint32(int32(int8(d))) & wire.PSNMask)
		} else {
			a = wire.PSN(r.u24())
		}
		e := a.Add(uint32(r.u8()))
		pay = append(pay, 0, 0, 0, 0, 0, 0, 0, 0)
		putBE32(pay[len(pay)-8:], uint32(a))
		putBE32(pay[len(pay)-4:], uint32(e))
	}
	if sn&0x40 != 0 && len(pay) > 0 {
		pay = pay[:len(pay)-1]
	}
	return pay
}

// weakMaxHole maps two header bits to a max hole (0: the default).
func weakMaxHole(b byte) uint32 { return [4]uint32{64, 128, 256, 0}[b&3] }
