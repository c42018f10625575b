package transport

import (
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// Opcode tables the packet records index into.
var (
	fuzzAllOps = []wire.Opcode{
		wire.OpSendFirst, wire.OpSendMiddle, wire.OpSendLast, wire.OpSendLastImm, wire.OpSendOnly,
		wire.OpSendOnlyImm, wire.OpWriteFirst, wire.OpWriteMiddle, wire.OpWriteLast, wire.OpWriteLastImm,
		wire.OpWriteOnly, wire.OpWriteOnlyImm, wire.OpReadRequest, wire.OpReadResponseFirst,
		wire.OpReadResponseMiddle, wire.OpReadResponseLast, wire.OpReadResponseOnly, wire.OpAcknowledge,
		wire.OpAtomicAcknowledge, wire.OpCompareSwap, wire.OpFetchAdd, wire.OpSendLastInvalidate,
		wire.OpSendOnlyInvalidate,
	}
	fuzzRespOps = []wire.Opcode{
		wire.OpAcknowledge, wire.OpAtomicAcknowledge, wire.OpReadResponseFirst,
		wire.OpReadResponseMiddle, wire.OpReadResponseLast, wire.OpReadResponseOnly,
	}
)

// fuzzRegion is a registered region as packet records can aim at it.
type fuzzRegion struct {
	key        uint32
	base, size uint64
}

func regionOf(r *tpt.Region) fuzzRegion {
	return fuzzRegion{key: r.Key(), base: r.IOVA(), size: uint64(r.Len())}
}

// pktEnv is what a packet record is built against.
type pktEnv struct {
	ops     []wire.Opcode
	psnBase wire.PSN // the QP's expected PSN (responder) or oldest unacknowledged PSN (requester)
	destQP  uint32
	mtu     int
	regions [4]fuzzRegion
	good    wire.Flow // from the QP's peer to the device
	bad     wire.Flow // from another address
}

// Packet record layout (every field one byte unless noted; see buildPacket):
//
//	ctl   bits 0-2 kind: 0-5 built packet, 6 raw bytes + ICRC, 7 raw bytes as they are
//	      bit 3 do not run finishBatch after this packet
//	      bit 4 corrupt the ICRC
//	      bit 5 DestQP from the record (3 bytes) instead of the QP's number
//	      bit 6 P_Key from the record (2 bytes) instead of the default
//	      bit 7 send from an address other than the QP's peer (ICRC computed for it)
//	raw:  n, n bytes
//	built:
//	op    < 0xF0: env.ops[op % len]; else the next byte is the opcode
//	fl    bit 0 SE, bit 1 no AckReq, bit 2 MigReq, bit 3 PadCnt from bits 4-5,
//	      bit 6 pad bytes non-zero, bit 7 TVer 1
//	psnd  < 0x80: PSN = base; else PSN = base + ((int8(psnd<<1)) >> 1), -64..63
//	[DestQP u24] [P_Key u16]
//	pm    bits 6-7: 0 payload pm&0x3F bytes, 1 one MTU, 2 MTU + pm&0x3F - 32, 3 u16 % 4200
//	[u16] fill  payload byte i is fill+i
//	then the extended headers the opcode has, in wire order:
//	RETH      va/key (see vaKey), lm: bits 6-7 0 DMALen = payload length, 1 u16,
//	          2 MTU*(1+lm&3) + (lm>>2)&15, 3 u32
//	AETH      s: < 0x80 ACK with no credits, else the next byte is the syndrome; msn
//	AtomicETH va/key, swap (bit 7: u64 follows, else swap&0x7F), compare (likewise)
//	AtomicAck v (0xFF: u64 follows)
//	ImmDt     v
//	IETH      k: < 0x80 key of region k&3, else u32 follows
func buildPacket(r *fuzzReader, env *pktEnv) (pkt []byte, fromBad, flush bool) {
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
			if ctl&0x20 == 0 {
				pkt[5], pkt[6], pkt[7] = byte(env.destQP>>16), byte(env.destQP>>8), byte(env.destQP)
			}
			if ctl&0x40 == 0 {
				pkt[2], pkt[3] = 0xFF, 0xFF
			}
			pkt = wiretest.AppendICRC(flow, pkt)
		}
		return pkt, fromBad, flush
	}
	var op wire.Opcode
	if o := r.u8(); o < 0xF0 {
		op = env.ops[int(o)%len(env.ops)]
	} else {
		op = wire.Opcode(r.u8())
	}
	fl := r.u8()
	psnd := r.u8()
	delta := int32(0)
	if psnd >= 0x80 {
		delta = int32(int8(psnd<<1)) >> 1
	}
	bth := wire.BTH{
		Opcode: op, SE: fl&1 != 0, AckReq: fl&2 == 0, MigReq: fl&4 != 0,
		PKey: wire.DefaultPKey, DestQP: env.destQP, PSN: env.psnBase.Add(uint32(delta) & wire.PSNMask),
	}
	if fl&0x80 != 0 {
		bth.TVer = 1
	}
	if ctl&0x20 != 0 {
		bth.DestQP = r.u24()
	}
	if ctl&0x40 != 0 {
		bth.PKey = r.u16()
	}
	pl := payloadLen(r, env.mtu)
	fill := r.u8()

	info := op.Info()
	hl := wire.BTHLen
	if info.Valid {
		hl = info.HdrLen
	}
	pad := wire.PadFor(pl)
	pkt = make([]byte, hl, hl+pl+pad+wire.ICRCLen)
	putExtHeaders(r, env, pkt, info.Flags, pl)
	bth.PadCnt = uint8(pad)
	if fl&0x08 != 0 {
		bth.PadCnt = fl >> 4 & 3
	}
	bth.Put(pkt)
	for i := 0; i < pl; i++ {
		pkt = append(pkt, fill+byte(i))
	}
	for i := 0; i < pad; i++ {
		if fl&0x40 != 0 {
			pkt = append(pkt, 0xAA)
		} else {
			pkt = append(pkt, 0)
		}
	}
	return wiretest.AppendICRC(flow, pkt), fromBad, flush
}

// payloadLen reads a payload length field (pm, see buildPacket).
func payloadLen(r *fuzzReader, mtu int) int {
	switch pm := r.u8(); pm >> 6 {
	case 0:
		return int(pm & 0x3F)
	case 1:
		return mtu
	case 2:
		return max(0, mtu+int(pm&0x3F)-32)
	}
	return int(r.u16()) % 4200
}

// putExtHeaders reads the fields of the standard extended headers that flags f select
// (see buildPacket) and writes them, in wire order, after the BTH of pkt; pl is the
// payload length. It returns the offset where they end.
func putExtHeaders(r *fuzzReader, env *pktEnv, pkt []byte, f uint32, pl int) int {
	o := wire.BTHLen
	if f&wire.HasRETH != 0 {
		va, key := vaKey(r, env)
		reth := wire.RETH{VA: va, RKey: key}
		switch lm := r.u8(); lm >> 6 {
		case 0:
			reth.DMALen = uint32(pl)
		case 1:
			reth.DMALen = uint32(r.u16())
		case 2:
			reth.DMALen = uint32(env.mtu)*uint32(1+lm&3) + uint32(lm>>2&15)
		case 3:
			reth.DMALen = r.u32()
		}
		reth.Put(pkt[o:])
		o += wire.RETHLen
	}
	if f&wire.HasAETH != 0 {
		a := wire.AETH{Syndrome: wire.AETHAck | wire.NoCredits}
		if r.u8() >= 0x80 {
			a.Syndrome = r.u8()
		}
		a.MSN = uint32(r.u8())
		a.Put(pkt[o:])
		o += wire.AETHLen
	}
	if f&wire.HasAtomicETH != 0 {
		va, key := vaKey(r, env)
		at := wire.AtomicETH{VA: va, RKey: key}
		if v := r.u8(); v&0x80 != 0 {
			at.SwapAdd = r.u64()
		} else {
			at.SwapAdd = uint64(v)
		}
		if v := r.u8(); v&0x80 != 0 {
			at.Compare = r.u64()
		} else {
			at.Compare = uint64(v)
		}
		at.Put(pkt[o:])
		o += wire.AtomicETHLen
	}
	if f&wire.HasAtomicAckETH != 0 {
		v := uint64(r.u8())
		if v == 0xFF {
			v = r.u64()
		}
		putBE64(pkt[o:], v)
		o += wire.AtomicAckETHLen
	}
	if f&wire.HasImmDt != 0 {
		putBE32(pkt[o:], uint32(r.u8()))
		o += wire.ImmDtLen
	}
	if f&wire.HasIETH != 0 {
		k := r.u8()
		key := env.regions[k&3].key
		if k >= 0x80 {
			key = r.u32()
		}
		putBE32(pkt[o:], key)
		o += wire.IETHLen
	}
	return o
}

// vaKey reads an address and key: m bits 0-1 pick a region; bits 2-3: 0 base+int16,
// 1 end-u16, 2 base+8*u8, 3 u64; bits 4-5: 0-1 the region's key, 2 the next region's key,
// 3 u32; bit 6 adds 4 to the address (misaligned); bit 7 flips the key's low bit (a stale
// key of the same table slot).
func vaKey(r *fuzzReader, env *pktEnv) (va uint64, key uint32) {
	m := r.u8()
	reg := env.regions[m&3]
	switch m >> 2 & 3 {
	case 0:
		va = reg.base + uint64(int64(int16(r.u16())))
	case 1:
		va = reg.base + reg.size - uint64(r.u16())
	case 2:
		va = reg.base + 8*uint64(r.u8())
	case 3:
		va = r.u64()
	}
	if m&0x40 != 0 {
		va += 4
	}
	switch m >> 4 & 3 {
	case 0, 1:
		key = reg.key
	case 2:
		key = env.regions[(m+1)&3].key
	case 3:
		key = r.u32()
	}
	if m&0x80 != 0 {
		key ^= 1
	}
	return va, key
}

func putBE32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
}
func putBE64(b []byte, v uint64) { putBE32(b, uint32(v>>32)); putBE32(b[4:], uint32(v)) }
