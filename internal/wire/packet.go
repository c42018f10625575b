package wire

import (
	"encoding/binary"
	"errors"
)

// DefaultPKey is the default partition key; RoCE peers use it unless configured otherwise.
const DefaultPKey = 0xFFFF

// BTH is the Base Transport Header.
type BTH struct {
	Opcode  Opcode
	SE      bool  // solicited event
	MigReq  bool  // path migration state: set (Migrated) on every packet softrnic sends; see SetMigReq
	PadCnt  uint8 // 0..3 pad bytes after the payload
	TVer    uint8 // transport header version, 0
	PKey    uint16
	FECN    bool
	BECN    bool
	DestQP  uint32 // 24 bits
	AckReq  bool
	PSN     PSN   // 24 bits
	Reserve uint8 // the 6 reserved bits after FECN/BECN (kept for round trips)
}

// DETH is the Datagram Extended Transport Header of UD packets: the Q_Key the receiving
// QP checks and the sending QP's number.
type DETH struct {
	QKey  uint32
	SrcQP uint32 // 24 bits
}

// Put encodes the DETH into b[:8] (the reserved byte zero).
func (d *DETH) Put(b []byte) {
	_ = b[DETHLen-1]
	binary.BigEndian.PutUint32(b[0:4], d.QKey)
	b[4] = 0
	b[5], b[6], b[7] = byte(d.SrcQP>>16), byte(d.SrcQP>>8), byte(d.SrcQP)
}

// DecodeDETH decodes a DETH (the reserved byte is ignored, as receivers must).
func DecodeDETH(b []byte) (DETH, error) {
	if len(b) < DETHLen {
		return DETH{}, ErrShort
	}
	return DETH{QKey: binary.BigEndian.Uint32(b[0:4]), SrcQP: uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])}, nil
}

// RETH is the RDMA Extended Transport Header (WRITE First/Only, READ Request).
type RETH struct {
	VA     uint64
	RKey   uint32
	DMALen uint32
}

// AETH is the ACK Extended Transport Header: a syndrome and the 24-bit MSN.
type AETH struct {
	Syndrome uint8
	MSN      uint32
}

// AtomicETH is the Atomic Extended Transport Header (CmpSwap, FetchAdd).
type AtomicETH struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64
	Compare uint64
}

// Packet is a decoded RoCEv2 packet (from the BTH to the end of the payload). Payload
// aliases the buffer that was decoded.
type Packet struct {
	BTH       BTH
	DETH      DETH
	RETH      RETH
	AETH      AETH
	Atomic    AtomicETH
	AtomicAck uint64 // original remote data (AtomicAckETH)
	Imm       uint32 // ImmDt, in host order; the wire carries it big-endian
	IETH      uint32 // rkey to invalidate
	Ext       []byte // manufacturer-specific extension header bytes, if the opcode has any
	Payload   []byte
	Info      *OpInfo
}

// Decode errors.
var (
	ErrShort      = errors.New("wire: packet shorter than its headers")
	ErrOpcode     = errors.New("wire: unknown opcode")
	ErrPad        = errors.New("wire: pad count larger than payload")
	ErrTVer       = errors.New("wire: unsupported transport header version")
	ErrNoPayload  = errors.New("wire: payload on an opcode that carries none")
	ErrBadICRC    = errors.New("wire: ICRC mismatch")
	ErrPacketSize = errors.New("wire: packet too large")
)

// DecodeBTH decodes the 12-byte BTH at the start of b.
func DecodeBTH(b []byte) (BTH, error) {
	if len(b) < BTHLen {
		return BTH{}, ErrShort
	}
	return BTH{
		Opcode:  Opcode(b[0]),
		SE:      b[1]&0x80 != 0,
		MigReq:  b[1]&0x40 != 0,
		PadCnt:  (b[1] >> 4) & 3,
		TVer:    b[1] & 0x0F,
		PKey:    binary.BigEndian.Uint16(b[2:4]),
		FECN:    b[4]&0x80 != 0,
		BECN:    b[4]&0x40 != 0,
		Reserve: b[4] & 0x3F,
		DestQP:  uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7]),
		AckReq:  b[8]&0x80 != 0,
		PSN:     PSN(b[9])<<16 | PSN(b[10])<<8 | PSN(b[11]),
	}, nil
}

// Put encodes the BTH into the first 12 bytes of b.
func (h *BTH) Put(b []byte) {
	_ = b[BTHLen-1]
	b[0] = byte(h.Opcode)
	var f byte
	if h.SE {
		f |= 0x80
	}
	if h.MigReq {
		f |= 0x40
	}
	b[1] = f | (h.PadCnt&3)<<4 | h.TVer&0x0F
	binary.BigEndian.PutUint16(b[2:4], h.PKey)
	f = h.Reserve & 0x3F
	if h.FECN {
		f |= 0x80
	}
	if h.BECN {
		f |= 0x40
	}
	b[4] = f
	b[5], b[6], b[7] = byte(h.DestQP>>16), byte(h.DestQP>>8), byte(h.DestQP)
	if h.AckReq {
		b[8] = 0x80
	} else {
		b[8] = 0
	}
	b[9], b[10], b[11] = byte(h.PSN>>16), byte(h.PSN>>8), byte(h.PSN)
}

// Put encodes the RETH into b[:16].
func (r *RETH) Put(b []byte) {
	_ = b[RETHLen-1]
	binary.BigEndian.PutUint64(b[0:8], r.VA)
	binary.BigEndian.PutUint32(b[8:12], r.RKey)
	binary.BigEndian.PutUint32(b[12:16], r.DMALen)
}

// DecodeRETH decodes a RETH from b.
func DecodeRETH(b []byte) (RETH, error) {
	if len(b) < RETHLen {
		return RETH{}, ErrShort
	}
	return RETH{VA: binary.BigEndian.Uint64(b[0:8]), RKey: binary.BigEndian.Uint32(b[8:12]), DMALen: binary.BigEndian.Uint32(b[12:16])}, nil
}

// Put encodes the AETH into b[:4].
func (a *AETH) Put(b []byte) {
	_ = b[AETHLen-1]
	b[0] = a.Syndrome
	b[1], b[2], b[3] = byte(a.MSN>>16), byte(a.MSN>>8), byte(a.MSN)
}

// DecodeAETH decodes an AETH from b.
func DecodeAETH(b []byte) (AETH, error) {
	if len(b) < AETHLen {
		return AETH{}, ErrShort
	}
	return AETH{Syndrome: b[0], MSN: uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])}, nil
}

// Put encodes the AtomicETH into b[:28].
func (a *AtomicETH) Put(b []byte) {
	_ = b[AtomicETHLen-1]
	binary.BigEndian.PutUint64(b[0:8], a.VA)
	binary.BigEndian.PutUint32(b[8:12], a.RKey)
	binary.BigEndian.PutUint64(b[12:20], a.SwapAdd)
	binary.BigEndian.PutUint64(b[20:28], a.Compare)
}

// DecodeAtomicETH decodes an AtomicETH from b.
func DecodeAtomicETH(b []byte) (AtomicETH, error) {
	if len(b) < AtomicETHLen {
		return AtomicETH{}, ErrShort
	}
	return AtomicETH{
		VA:      binary.BigEndian.Uint64(b[0:8]),
		RKey:    binary.BigEndian.Uint32(b[8:12]),
		SwapAdd: binary.BigEndian.Uint64(b[12:20]),
		Compare: binary.BigEndian.Uint64(b[20:28]),
	}, nil
}

// Decode parses b, which runs from the BTH to the end of the packet including the ICRC
// (the ICRC itself is not checked here; see ICRC). The payload excludes pad and ICRC.
func (p *Packet) Decode(b []byte) error {
	if len(b) < BTHLen+ICRCLen {
		return ErrShort
	}
	bth, _ := DecodeBTH(b)
	if bth.TVer != 0 {
		return ErrTVer
	}
	info := &opTable[bth.Opcode]
	if !info.Valid {
		return ErrOpcode
	}
	if len(b) < info.HdrLen+ICRCLen {
		return ErrShort
	}
	p.BTH = bth
	p.Info = info
	off := BTHLen
	f := info.Flags
	if f&HasDETH != 0 {
		p.DETH, _ = DecodeDETH(b[off:])
		off += DETHLen
	}
	if f&HasRETH != 0 {
		p.RETH, _ = DecodeRETH(b[off:])
		off += RETHLen
	}
	if f&HasAETH != 0 {
		p.AETH, _ = DecodeAETH(b[off:])
		off += AETHLen
	}
	if f&HasAtomicETH != 0 {
		p.Atomic, _ = DecodeAtomicETH(b[off:])
		off += AtomicETHLen
	}
	if f&HasAtomicAckETH != 0 {
		p.AtomicAck = binary.BigEndian.Uint64(b[off:])
		off += AtomicAckETHLen
	}
	if f&HasImmDt != 0 {
		p.Imm = binary.BigEndian.Uint32(b[off:])
		off += ImmDtLen
	}
	if f&HasIETH != 0 {
		p.IETH = binary.BigEndian.Uint32(b[off:])
		off += IETHLen
	}
	p.Ext = b[off:info.HdrLen]
	off = info.HdrLen
	end := len(b) - ICRCLen
	pay := end - off
	if int(bth.PadCnt) > pay {
		return ErrPad
	}
	pay -= int(bth.PadCnt)
	if pay > 0 && f&HasPayload == 0 {
		return ErrNoPayload
	}
	p.Payload = b[off : off+pay]
	return nil
}

// PadFor returns the number of pad bytes needed after a payload of n bytes.
func PadFor(n int) int { return (4 - n&3) & 3 }

// SetMigReq sets the MigReq bit of the BTH at the start of hdr. A QP starts in the
// Migrated state of IBTA's automatic path migration (APM) and, without APM, stays there;
// packets sent in that state carry MigReq 1 (a 0 is what moves a re-armed peer to Armed).
// softrnic has no APM, so every packet carries 1. Received packets may carry either.
func SetMigReq(hdr []byte) { hdr[1] |= 0x40 }
