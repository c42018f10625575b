package rsocket

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// What librdmacm's rsockets put on the wire (rsocket(7), rdma-core's librdmacm/rsocket.c),
// described in docs/rsocket.md.
//
// A connection's private data (the REQ's after rdma_cm's addressing header, the REP's
// from its first byte) is a 40-byte connect block: version, flags, the receive credits the
// sender gives, the size of its iomap table, and two buffer descriptors, all big-endian:
// the sender's target area (where the peer writes grants of ring space) and the first half
// of its receive ring (the first grant).
//
// Everything after the connection is an RDMA WRITE WITH IMMEDIATE; the 32-bit immediate is
// an operation (3 bits) and a value (29 bits). Data is written into the peer's ring at the
// place its grants say, the value its length; the receiver reads it at its own read
// offset, so data must fill the grants in the order they were given. Grants of ring space
// are 16-byte descriptors written into one of the two slots of the sender's target area,
// in the byte order of the host that reads them, the immediate carrying the new credit
// limit; credits alone go as zero-length writes with that immediate. Shutdown is a
// zero-length write whose immediate is a control code.

// connDataLen is the length of the connect block.
const connDataLen = 40

// version is the only protocol version librdmacm speaks (and checks).
const version = 1

// Connect block flags.
const (
	flagNet   = 1 << 0 // the sender reads descriptors in network (big-endian) order
	flagIOMap = 1 << 1 // the sender has an iomap table after its target area's slots
)

// sgeLen and iomapLen are the sizes of a buffer descriptor and an iomap entry.
const (
	sgeLen   = 16
	iomapLen = 24
)

// grantSlots is the number of descriptor slots in a target area.
const grantSlots = 2

// sge describes remote memory: librdmacm's struct rs_sge.
type sge struct {
	Addr uint64
	Key  uint32
	Len  uint32
}

// connData is the connect block (librdmacm's struct rs_conn_data).
type connData struct {
	Version uint8
	Flags   uint8
	Credits uint16 // data messages the sender may receive before it grants more
	IOMap   int    // entries of the sender's iomap table (decoded from its one-byte scale)
	Target  sge    // the sender's target area; Len counts its slots (grantSlots)
	DataBuf sge    // the first grant: the first half of the sender's receive ring
}

// errConnData is wrapped by every refusal of a peer's connect block.
var errConnData = errors.New("rsocket: bad connect data")

func (d *connData) put(b []byte) {
	_ = b[connDataLen-1]
	be := binary.BigEndian
	b[0], b[1] = d.Version, d.Flags
	be.PutUint16(b[2:], d.Credits)
	b[4], b[5], b[6] = 0, 0, 0
	b[7] = scaleOf(d.IOMap)
	be.PutUint64(b[8:], d.Target.Addr)
	be.PutUint32(b[16:], d.Target.Key)
	be.PutUint32(b[20:], d.Target.Len)
	be.PutUint64(b[24:], d.DataBuf.Addr)
	be.PutUint32(b[32:], d.DataBuf.Key)
	be.PutUint32(b[36:], d.DataBuf.Len)
}

// parseConnData reads a peer's connect block and checks what this side relies on: the
// version (as librdmacm does), two grant slots in its target area, receive credits, and
// a first grant that is not empty.
func parseConnData(b []byte) (connData, error) {
	var d connData
	if len(b) < connDataLen {
		return d, fmt.Errorf("%w: %d bytes, want %d", errConnData, len(b), connDataLen)
	}
	be := binary.BigEndian
	d.Version, d.Flags = b[0], b[1]
	d.Credits = be.Uint16(b[2:])
	d.IOMap = valueOfScale(b[7])
	d.Target = sge{Addr: be.Uint64(b[8:]), Key: be.Uint32(b[16:]), Len: be.Uint32(b[20:])}
	d.DataBuf = sge{Addr: be.Uint64(b[24:]), Key: be.Uint32(b[32:]), Len: be.Uint32(b[36:])}
	switch {
	case d.Version != version:
		return d, fmt.Errorf("%w: version %d, want %d", errConnData, d.Version, version)
	case d.Target.Len < grantSlots:
		// librdmacm writes grants into two slots whatever the peer says.
		return d, fmt.Errorf("%w: a target area of %d grant slots, want %d", errConnData, d.Target.Len, grantSlots)
	case d.DataBuf.Len == 0:
		return d, fmt.Errorf("%w: an empty first grant", errConnData)
	case d.Credits == 0:
		return d, fmt.Errorf("%w: no receive credits", errConnData)
	}
	return d, nil
}

// scaleOf encodes an iomap size in one byte as librdmacm does: up to 128 literally, above
// it in units of 256 with the high bit set.
func scaleOf(v int) uint8 {
	if v <= 0x80 {
		return uint8(v)
	}
	return 0x80 | uint8(min(v>>8, 0x7F))
}

func valueOfScale(b uint8) int {
	if b <= 0x80 {
		return int(b)
	}
	return int(b&0x7F) << 8
}

// Operations of the immediate's top 3 bits.
const (
	opData     = 0 // data of the immediate's value bytes was written into the ring
	opSGL      = 4 // a grant (16 bytes) or no payload; the value is the new credit limit
	opIOMapSGL = 6 // an iomap entry; the value is its index
	opCtrl     = 7 // a control code, no payload
)

// Control codes.
const (
	ctrlDisconnect = 0 // the sender neither reads nor writes any more
	ctrlShutdown   = 2 // the sender writes no more (half-close)
)

// immValueMask masks the immediate's value: its low 29 bits.
const immValueMask = 1<<29 - 1

func imm(op, value uint32) uint32 { return op<<29 | value&immValueMask }

func immOp(v uint32) (op, value uint32) { return v >> 29, v & immValueMask }

// putSGE writes a grant in the byte order its reader announced (flagNet: big-endian).
func putSGE(b []byte, s sge, bigEndian bool) {
	var o binary.ByteOrder = binary.LittleEndian
	if bigEndian {
		o = binary.BigEndian
	}
	o.PutUint64(b[0:], s.Addr)
	o.PutUint32(b[8:], s.Key)
	o.PutUint32(b[12:], s.Len)
}

// getSGE reads a grant written into this side's target area: softrnic announces
// little-endian (flagNet clear) whatever the host's order.
func getSGE(b []byte) sge {
	le := binary.LittleEndian
	return sge{Addr: le.Uint64(b[0:]), Key: le.Uint32(b[8:]), Len: le.Uint32(b[12:])}
}
