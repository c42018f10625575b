package wire

import (
	"encoding/binary"
	"errors"
)

// Opcodes of softrnic's weakly-ordered mode, in the manufacturer-specific range (0xC0..0xFF)
// so a standard peer or dissector still reads a valid BTH. They are only sent after both
// sides agreed to the mode at connection setup.
//
// Every data packet describes itself, so it can be placed the moment it arrives: WRITE
// packets carry the remote address and key of their own payload (RETH), and all data
// packets and READ requests carry an out-of-order header (OOH) after the other headers:
// the message's sequence number (receive sequence for SENDs and WRITEs with immediate,
// read sequence for READ requests), the byte offset of the packet's payload in the message
// and the message's length. READ responses and atomics use the standard opcodes (a READ
// response's place follows from its PSN). The acknowledgement carries selective ranges.
const (
	OpWeakAck      Opcode = 0xC1 // BTH, AETH, SACK count, echoed TxSeq; payload: SACK ranges
	OpWeakSend     Opcode = 0xC2 // BTH, OOH, payload
	OpWeakSendImm  Opcode = 0xC3 // BTH, ImmDt, OOH, payload
	OpWeakWrite    Opcode = 0xC4 // BTH, RETH, OOH, payload
	OpWeakWriteImm Opcode = 0xC5 // BTH, RETH, ImmDt, OOH, payload
	OpWeakReadReq  Opcode = 0xC6 // BTH, RETH, OOH
	OpWeakCmpSwap  Opcode = 0xC7 // BTH, AtomicETH, OOH
	OpWeakFetchAdd Opcode = 0xC8 // BTH, AtomicETH, OOH
)

// OOHLen is the length of the out-of-order header.
const OOHLen = 20

// OOH is the out-of-order header of weakly-ordered data packets, READ requests and
// atomics.
type OOH struct {
	Seq    PSN    // 24-bit receive sequence number (SEND, WRITE with immediate) or read sequence number (READ, atomics)
	Offset uint32 // byte offset of this packet's payload in its message
	Length uint32 // the message's length in bytes
	Flags  uint8  // OOHRecv
	// TxSeq numbers the transmission: every packet sent, first time or again, gets the
	// next number, so an acknowledgement that echoes the highest number received says
	// exactly how far the receiver got in sending order (which PSNs alone cannot say once
	// a packet was sent twice).
	TxSeq uint32
}

// OOHRecv says the message consumes a receive WQE (SEND, WRITE with immediate): Seq is its
// receive sequence number. Every packet of the message carries it.
const OOHRecv = 1

// Put encodes the OOH into b[:20].
func (o *OOH) Put(b []byte) {
	_ = b[OOHLen-1]
	binary.BigEndian.PutUint32(b[0:4], uint32(o.Seq&PSNMask))
	binary.BigEndian.PutUint32(b[4:8], o.Offset)
	binary.BigEndian.PutUint32(b[8:12], o.Length)
	b[12], b[13], b[14], b[15] = o.Flags, 0, 0, 0
	binary.BigEndian.PutUint32(b[16:20], o.TxSeq)
}

// DecodeOOH decodes an OOH.
func DecodeOOH(b []byte) (OOH, error) {
	if len(b) < OOHLen {
		return OOH{}, ErrShort
	}
	seq := binary.BigEndian.Uint32(b[0:4])
	if seq > PSNMask || b[12]&^OOHRecv != 0 || b[13]|b[14]|b[15] != 0 {
		return OOH{}, ErrReserved
	}
	return OOH{Seq: PSN(seq), Offset: binary.BigEndian.Uint32(b[4:8]), Length: binary.BigEndian.Uint32(b[8:12]), Flags: b[12],
		TxSeq: binary.BigEndian.Uint32(b[16:20])}, nil
}

// MaxSACKRanges bounds the ranges one selective acknowledgement carries.
const MaxSACKRanges = 16

// SACKRangeLen is the wire size of one range: start and end PSN (end exclusive), 4 bytes
// each with the top byte zero.
const SACKRangeLen = 8

// Errors of the weakly-ordered decoders.
var (
	ErrReserved = errors.New("wire: reserved bits set")
	ErrSACK     = errors.New("wire: malformed SACK ranges")
)

// SACKHeaderLen is the fixed part of a selective acknowledgement after the AETH: the
// number of ranges and the highest transmission number (OOH.TxSeq) received.
const SACKHeaderLen = 8

// PutSACKHeader writes the SACK header (after the AETH).
func PutSACKHeader(b []byte, n int, echo uint32) {
	binary.BigEndian.PutUint32(b[:4], uint32(n))
	binary.BigEndian.PutUint32(b[4:8], echo)
}

// SACKEcho returns the transmission number a SACK header echoes.
func SACKEcho(hdr []byte) uint32 {
	if len(hdr) < SACKHeaderLen {
		return 0
	}
	return binary.BigEndian.Uint32(hdr[4:8])
}

// PutSACKRanges encodes ranges into b (len(ranges)*8 bytes).
func PutSACKRanges(b []byte, ranges [][2]PSN) {
	for i, r := range ranges {
		binary.BigEndian.PutUint32(b[i*8:], uint32(r[0]&PSNMask))
		binary.BigEndian.PutUint32(b[i*8+4:], uint32(r[1]&PSNMask))
	}
}

// DecodeSACK decodes the SACK count word and the ranges in payload into dst. Every range
// must be non-empty and shorter than half the PSN space.
func DecodeSACK(count []byte, payload []byte, dst [][2]PSN) ([][2]PSN, error) {
	if len(count) < 4 {
		return dst, ErrShort
	}
	n := binary.BigEndian.Uint32(count)
	if n > MaxSACKRanges || uint32(len(payload)) != n*SACKRangeLen {
		return dst, ErrSACK
	}
	for i := uint32(0); i < n; i++ {
		a := binary.BigEndian.Uint32(payload[i*8:])
		e := binary.BigEndian.Uint32(payload[i*8+4:])
		if a > PSNMask || e > PSNMask || PSN(e).Diff(PSN(a)) <= 0 {
			return dst, ErrSACK
		}
		dst = append(dst, [2]PSN{PSN(a), PSN(e)})
	}
	return dst, nil
}

func init() {
	RegisterOpcode(OpWeakAck, "SOFTRNIC_WEAK_ACK", IsWeak|IsResponse|IsFirst|IsLast|HasAETH|HasPayload, SACKHeaderLen)
	const data = IsWeak | IsRequest | HasPayload
	RegisterOpcode(OpWeakSend, "SOFTRNIC_WEAK_SEND", data|IsSend, OOHLen)
	RegisterOpcode(OpWeakSendImm, "SOFTRNIC_WEAK_SEND_WITH_IMMEDIATE", data|IsSend|HasImmDt, OOHLen)
	RegisterOpcode(OpWeakWrite, "SOFTRNIC_WEAK_RDMA_WRITE", data|IsWrite|HasRETH, OOHLen)
	RegisterOpcode(OpWeakWriteImm, "SOFTRNIC_WEAK_RDMA_WRITE_WITH_IMMEDIATE", data|IsWrite|HasRETH|HasImmDt, OOHLen)
	RegisterOpcode(OpWeakReadReq, "SOFTRNIC_WEAK_RDMA_READ_REQUEST", IsWeak|IsRequest|IsRead|HasRETH, OOHLen)
	RegisterOpcode(OpWeakCmpSwap, "SOFTRNIC_WEAK_COMPARE_SWAP", IsWeak|IsRequest|IsAtomic|HasAtomicETH, OOHLen)
	RegisterOpcode(OpWeakFetchAdd, "SOFTRNIC_WEAK_FETCH_ADD", IsWeak|IsRequest|IsAtomic|HasAtomicETH, OOHLen)
}
