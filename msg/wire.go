package msg

import (
	"encoding/binary"
	"hash/crc32"
)

// What goes between two ranks over their RC connection.
//
// Eager data and control messages are RDMA WRITEs with immediate data into a slot of the
// receiver's ring; the immediate says which slot, and carries credits for the other
// direction, so that completion (not polling memory, which weakly-ordered mode would make
// unsafe) tells the receiver a slot is full. Credits alone go as zero-length WRITEs with
// immediate (no slot). The enlargement acknowledgement, framed by head and tail flags, is
// one RDMA WRITE with immediate into a slot of the sender's acknowledgement area: the
// immediate, which names the slot, is the notification that it was written.

// Immediate data: kind (4 bits), ring generation (2 bits), credits (10 bits), slot (16 bits).
const (
	immSlot      = 1 // a slot of the receiver's ring was written
	immCredit    = 2 // credits only
	immAckNotify = 3 // the enlargement acknowledgement was written
	immAckResend = 4 // the sender asks for the acknowledgement again
	maxCredits   = 1<<10 - 1
)

func imm(kind, gen, credits, slot int) uint32 {
	return uint32(kind)<<28 | uint32(gen&3)<<26 | uint32(min(credits, maxCredits))<<16 | uint32(slot&0xFFFF)
}

func immParts(v uint32) (kind, gen, credits, slot int) {
	return int(v >> 28), int(v >> 26 & 3), int(v >> 16 & maxCredits), int(v & 0xFFFF)
}

// Slot header (hdrLen bytes at the start of every slot).
const hdrLen = 48

// Slot message kinds.
const (
	kindData    = 1 // eager message: the payload follows the header
	kindRTS     = 2 // rendezvous: message ID of Total bytes is ready to send
	kindFIN     = 3 // rendezvous: message ID was written
	kindCTS     = 5 // rendezvous: write message ID (Total bytes) at Addr with RKey
	kindEnlarge = 4 // provision ring phase Phase and acknowledge with Nonce
)

// header is a slot's header.
type header struct {
	Len   uint32 // payload bytes in this slot
	Kind  uint8
	Ctx   uint8 // 0: point-to-point, 1: collectives
	Phase uint8 // kindEnlarge: the phase asked for
	Tag   int32
	Src   uint32
	Total uint64 // the message's length (kindData: Len; kindRTS: its length; kindCTS: what to write)
	ID    uint64 // kindRTS, kindCTS, kindFIN: the sender's message ID; kindEnlarge: the nonce
	Addr  uint64 // kindCTS: the receive buffer; kindEnlarge: the acknowledgement slot
	RKey  uint32 // kindCTS
}

func (h *header) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], h.Len)
	b[4], b[5], b[6], b[7] = h.Kind, h.Ctx, h.Phase, 0
	le.PutUint32(b[8:], uint32(h.Tag))
	le.PutUint32(b[12:], h.Src)
	le.PutUint64(b[16:], h.Total)
	le.PutUint64(b[24:], h.ID)
	le.PutUint64(b[32:], h.Addr)
	le.PutUint32(b[40:], h.RKey)
	le.PutUint32(b[44:], 0)
}

func (h *header) get(b []byte) {
	le := binary.LittleEndian
	h.Len = le.Uint32(b[0:])
	h.Kind, h.Ctx, h.Phase = b[4], b[5], b[6]
	h.Tag = int32(le.Uint32(b[8:]))
	h.Src = le.Uint32(b[12:])
	h.Total = le.Uint64(b[16:])
	h.ID = le.Uint64(b[24:])
	h.Addr = le.Uint64(b[32:])
	h.RKey = le.Uint32(b[40:])
}

// The enlargement acknowledgement (ackLen bytes): head flag, the new ring (address,
// rkey, slots, slot size, phase), a CRC-32 of those, tail flag. The flags carry the nonce
// of the request: the sender takes the acknowledgement only when head and tail both
// carry it and the CRC matches, so a partial, stale or corrupt one leaves it waiting.
const ackLen = 40

type ack struct {
	Nonce    uint32
	Addr     uint64
	RKey     uint32
	Slots    uint32
	SlotSize uint32
	Phase    uint32
}

func (a *ack) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], a.Nonce) // head
	le.PutUint64(b[4:], a.Addr)
	le.PutUint32(b[12:], a.RKey)
	le.PutUint32(b[16:], a.Slots)
	le.PutUint32(b[20:], a.SlotSize)
	le.PutUint32(b[24:], a.Phase)
	le.PutUint32(b[28:], crc32.ChecksumIEEE(b[4:28]))
	le.PutUint32(b[32:], 0)
	le.PutUint32(b[36:], a.Nonce) // tail
}

// ackState is what the sender sees in its acknowledgement area.
type ackState int

const (
	ackNone     ackState = iota // no head flag of this request yet
	ackPartial                  // the head flag, not (yet) the tail or a matching CRC
	ackComplete                 // the whole acknowledgement
)

// readAck reads the acknowledgement area for the request with nonce.
func readAck(b []byte, nonce uint32) (ack, ackState) {
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != nonce {
		return ack{}, ackNone
	}
	if le.Uint32(b[36:]) != nonce || le.Uint32(b[28:]) != crc32.ChecksumIEEE(b[4:28]) {
		return ack{}, ackPartial
	}
	return ack{Nonce: nonce, Addr: le.Uint64(b[4:]), RKey: le.Uint32(b[12:]), Slots: le.Uint32(b[16:]),
		SlotSize: le.Uint32(b[20:]), Phase: le.Uint32(b[24:])}, ackComplete
}

// hello is the connection's private data, both ways: who this is and its first ring.
const helloLen = 44

type hello struct {
	Job      uint64
	Rank     uint32
	RingAddr uint64
	RingKey  uint32
	Slots    uint32
	SlotSize uint32
	AckAddr  uint64
	AckKey   uint32
}

func (h *hello) put() []byte {
	b := make([]byte, helloLen)
	le := binary.LittleEndian
	le.PutUint64(b[0:], h.Job)
	le.PutUint32(b[8:], h.Rank)
	le.PutUint64(b[12:], h.RingAddr)
	le.PutUint32(b[20:], h.RingKey)
	le.PutUint32(b[24:], h.Slots)
	le.PutUint32(b[28:], h.SlotSize)
	le.PutUint64(b[32:], h.AckAddr)
	le.PutUint32(b[40:], h.AckKey)
	return b
}

func getHello(b []byte) (hello, bool) {
	if len(b) < helloLen {
		return hello{}, false
	}
	le := binary.LittleEndian
	return hello{Job: le.Uint64(b[0:]), Rank: le.Uint32(b[8:]), RingAddr: le.Uint64(b[12:]), RingKey: le.Uint32(b[20:]),
		Slots: le.Uint32(b[24:]), SlotSize: le.Uint32(b[28:]), AckAddr: le.Uint64(b[32:]), AckKey: le.Uint32(b[40:])}, true
}
