// Package mad encodes and decodes the management datagrams (MADs) of InfiniBand
// Communication Management as RoCEv2 peers exchange them on QP1: the 24-byte common MAD
// header and the CM messages of IBTA Vol. 1 chapter 12 (REQ, MRA, REJ, REP, RTU, DREQ,
// DREP), field by field at the byte and bit positions the specification gives, and the
// rdma_cm addressing header that librdmacm puts at the start of a REQ's private data.
//
// Every MAD is 256 bytes. Decoding never panics: it checks the length and the header, and
// returns an error that says what was wrong. Bit positions count from the most significant
// bit of a byte, as the IBTA tables do.
package mad

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Size is the size of every MAD; HeaderLen the common MAD header's; DataLen what follows.
const (
	Size      = 256
	HeaderLen = 24
	DataLen   = Size - HeaderLen
)

// Management class and version of Communication Management (IBTA 13.4.4, 12.6).
const (
	BaseVersion  = 1
	ClassCM      = 0x07
	ClassVersion = 2
)

// GSIQKey is the well-known Q_Key of QP1, the general services interface (GSI).
const GSIQKey = 0x80010000

// MAD methods used by CM.
const (
	MethodGet     = 0x01
	MethodSet     = 0x02
	MethodSend    = 0x03
	MethodGetResp = 0x81
)

// AttrID identifies a CM message.
type AttrID uint16

// CM attribute IDs (IBTA Table 105).
const (
	AttrClassPortInfo AttrID = 0x0001
	AttrREQ           AttrID = 0x0010
	AttrMRA           AttrID = 0x0011
	AttrREJ           AttrID = 0x0012
	AttrREP           AttrID = 0x0013
	AttrRTU           AttrID = 0x0014
	AttrDREQ          AttrID = 0x0015
	AttrDREP          AttrID = 0x0016
	AttrSIDRREQ       AttrID = 0x0017
	AttrSIDRREP       AttrID = 0x0018
	AttrLAP           AttrID = 0x0019
	AttrAPR           AttrID = 0x001A
)

var attrNames = map[AttrID]string{AttrClassPortInfo: "ClassPortInfo", AttrREQ: "REQ", AttrMRA: "MRA", AttrREJ: "REJ",
	AttrREP: "REP", AttrRTU: "RTU", AttrDREQ: "DREQ", AttrDREP: "DREP", AttrSIDRREQ: "SIDR_REQ", AttrSIDRREP: "SIDR_REP",
	AttrLAP: "LAP", AttrAPR: "APR"}

func (a AttrID) String() string {
	if n, ok := attrNames[a]; ok {
		return n
	}
	return fmt.Sprintf("attribute %#04x", uint16(a))
}

// Header is the common MAD header (IBTA 13.4.3).
type Header struct {
	BaseVersion   uint8
	MgmtClass     uint8
	ClassVersion  uint8
	Method        uint8
	Status        uint16
	ClassSpecific uint16
	TID           uint64 // transaction ID
	AttrID        AttrID
	AttrMod       uint32
}

// Put encodes the header into b[:HeaderLen] (the reserved field zero).
func (h *Header) Put(b []byte) {
	_ = b[HeaderLen-1]
	b[0], b[1], b[2], b[3] = h.BaseVersion, h.MgmtClass, h.ClassVersion, h.Method
	binary.BigEndian.PutUint16(b[4:], h.Status)
	binary.BigEndian.PutUint16(b[6:], h.ClassSpecific)
	binary.BigEndian.PutUint64(b[8:], h.TID)
	binary.BigEndian.PutUint16(b[16:], uint16(h.AttrID))
	b[18], b[19] = 0, 0
	binary.BigEndian.PutUint32(b[20:], h.AttrMod)
}

// Decode errors.
var (
	ErrSize    = errors.New("mad: not a 256-byte MAD")
	ErrVersion = errors.New("mad: not a CM MAD of base version 1, class version 2")
	ErrAttr    = errors.New("mad: unexpected attribute")
	ErrField   = errors.New("mad: field out of range")
)

// DecodeHeader decodes the header of a CM MAD: b must be Size bytes with base version 1,
// class CM and class version 2.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) != Size {
		return Header{}, ErrSize
	}
	h := Header{
		BaseVersion: b[0], MgmtClass: b[1], ClassVersion: b[2], Method: b[3],
		Status: binary.BigEndian.Uint16(b[4:]), ClassSpecific: binary.BigEndian.Uint16(b[6:]),
		TID: binary.BigEndian.Uint64(b[8:]), AttrID: AttrID(binary.BigEndian.Uint16(b[16:])),
		AttrMod: binary.BigEndian.Uint32(b[20:]),
	}
	if h.BaseVersion != BaseVersion || h.MgmtClass != ClassCM || h.ClassVersion != ClassVersion {
		return h, ErrVersion
	}
	return h, nil
}

// cmHeader returns the header of a CM message sent with method Send.
func cmHeader(tid uint64, attr AttrID) Header {
	return Header{BaseVersion: BaseVersion, MgmtClass: ClassCM, ClassVersion: ClassVersion, Method: MethodSend, TID: tid, AttrID: attr}
}

// Field access within a message's data (after the common header): big-endian words, and
// bit fields counted from the most significant bit of their byte or word.

func get24(d []byte, off int) uint32 { return binary.BigEndian.Uint32(d[off:]) >> 8 }

func put24(d []byte, off int, v uint32) {
	d[off], d[off+1], d[off+2] = byte(v>>16), byte(v>>8), byte(v)
}

// bits returns n bits of byte c starting at bit pos (0 = most significant).
func bits(c byte, pos, n uint) uint8 { return (c >> (8 - pos - n)) & (1<<n - 1) }

// setBits stores v in n bits of *c starting at bit pos.
func setBits(c *byte, pos, n uint, v uint8) {
	shift := 8 - pos - n
	mask := byte(1<<n-1) << shift
	*c = *c&^mask | (v<<shift)&mask
}
