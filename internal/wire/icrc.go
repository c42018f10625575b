package wire

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"
)

// UDPPort is the IANA port for RoCEv2.
const UDPPort = 4791

// Flow identifies the IP and UDP endpoints of a packet: what the ICRC covers besides the
// transport headers and payload. Fields the ICRC masks (TOS/traffic class, TTL/hop limit,
// flow label, IP and UDP checksums) are not part of it.
//
// For IPv4 the ICRC also covers the Identification and flags/fragment-offset fields. A
// UDP socket does not control them; softrnic sends from unconnected sockets with DF set,
// for which Linux writes ID 0, and computes (and, on receive, verifies) with ID 0 and DF.
type Flow struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	IPID             uint16 // IPv4 Identification; 0 for softrnic's own packets
	DF               bool   // IPv4 Don't Fragment flag
}

// pseudoLen is the longest ICRC prefix: 8 bytes of ones, an IPv6 header, UDP, BTH.
const pseudoLen = 8 + 40 + 8 + BTHLen

// prefix writes the masked pseudo-header (8 x 0xFF, IP, UDP, masked BTH) for a packet whose
// transport part (BTH to ICRC inclusive) is tlen bytes, and returns its length.
func (f *Flow) prefix(buf *[pseudoLen]byte, bth []byte, tlen int) int {
	for i := 0; i < 8; i++ {
		buf[i] = 0xFF
	}
	udpLen := 8 + tlen
	o := 8
	if f.v4() {
		b := buf[o : o+20]
		b[0] = 0x45
		b[1] = 0xFF // TOS masked
		binary.BigEndian.PutUint16(b[2:4], uint16(20+udpLen))
		binary.BigEndian.PutUint16(b[4:6], f.IPID)
		if f.DF {
			b[6], b[7] = 0x40, 0
		} else {
			b[6], b[7] = 0, 0
		}
		b[8] = 0xFF // TTL masked
		b[9] = 17
		b[10], b[11] = 0xFF, 0xFF // checksum masked
		s, d := f.Src.Unmap().As4(), f.Dst.Unmap().As4()
		copy(b[12:16], s[:])
		copy(b[16:20], d[:])
		o += 20
	} else {
		b := buf[o : o+40]
		b[0], b[1], b[2], b[3] = 0x6F, 0xFF, 0xFF, 0xFF // version 6, TC and flow label masked
		binary.BigEndian.PutUint16(b[4:6], uint16(udpLen))
		b[6] = 17
		b[7] = 0xFF // hop limit masked
		s, d := f.Src.As16(), f.Dst.As16()
		copy(b[8:24], s[:])
		copy(b[24:40], d[:])
		o += 40
	}
	u := buf[o : o+8]
	binary.BigEndian.PutUint16(u[0:2], f.SrcPort)
	binary.BigEndian.PutUint16(u[2:4], f.DstPort)
	binary.BigEndian.PutUint16(u[4:6], uint16(udpLen))
	u[6], u[7] = 0xFF, 0xFF // checksum masked
	o += 8
	copy(buf[o:o+BTHLen], bth[:BTHLen])
	buf[o+4] = 0xFF // FECN, BECN and reserved bits masked
	return o + BTHLen
}

// crcSmall is CRC-32 (IEEE) over a short buffer, eight bytes at a time (slicing by 8:
// eight table lookups per eight bytes that do not wait on each other, where a byte at a
// time is a chain of dependent lookups). It is used for the pseudo-header, which lives on
// the stack: handing it to crc32.Update (an indirect call) would move it to the heap on
// every packet.
func crcSmall(crc uint32, p []byte) uint32 {
	t := &crcSlicing
	crc = ^crc
	for len(p) >= 8 {
		crc ^= binary.LittleEndian.Uint32(p)
		crc = t[0][p[7]] ^ t[1][p[6]] ^ t[2][p[5]] ^ t[3][p[4]] ^
			t[4][crc>>24] ^ t[5][crc>>16&0xFF] ^ t[6][crc>>8&0xFF] ^ t[7][crc&0xFF]
		p = p[8:]
	}
	for _, b := range p {
		crc = t[0][byte(crc)^b] ^ crc>>8
	}
	return ^crc
}

// smallMax is the length below which crcUpdate uses crcSmall: the standard library's
// crc32.Update costs about 17 ns for nothing at all here (its dispatch) and 37 ns for the
// 8 bytes of a small SEND, crcSmall a fraction of that; from 64 bytes the library's
// carry-less multiply is the faster.
const smallMax = 64

// crcSlicing holds crcSmall's tables: [0] is the byte table, [k] the effect of a byte
// followed by k zero bytes.
var crcSlicing = func() (t [8][256]uint32) {
	t[0] = *crc32.IEEETable
	for i := range 256 {
		for k := 1; k < 8; k++ {
			c := t[k-1][i]
			t[k][i] = t[0][c&0xFF] ^ c>>8
		}
	}
	return t
}()

// v4 reports whether the flow is IPv4: both addresses IPv4 or IPv4-mapped. Anything else
// (including a mixed or zero address) is computed as IPv6 over the 16-byte forms.
func (f *Flow) v4() bool {
	return (f.Src.Is4() || f.Src.Is4In6()) && (f.Dst.Is4() || f.Dst.Is4In6())
}

// PrefixCache keeps the CRC of one flow's pseudo-header up to the BTH (the ones, the IP and
// UDP headers with their masks) for one transport length, which every full-sized packet of
// a flow shares: a stream computes it once and goes on from it with the packet's own BTH.
// A receive queue keeps one (in its IDSolver), a QP one for what it sends. The zero value
// is empty; it is not safe for concurrent use.
type PrefixCache struct {
	flow Flow
	tlen int
	crc  uint32
	ok   bool
}

// ipUDP returns the CRC, from zero, of the pseudo-header's bytes before the BTH for a
// packet of flow f whose transport part is tlen bytes.
func (c *PrefixCache) ipUDP(f *Flow, tlen int) uint32 {
	if c.ok && c.tlen == tlen && c.flow == *f {
		return c.crc
	}
	var buf [pseudoLen]byte
	var bth [BTHLen]byte
	n := f.prefix(&buf, bth[:], tlen) - BTHLen
	*c = PrefixCache{flow: *f, tlen: tlen, crc: crcSmall(0, buf[:n]), ok: true}
	return c.crc
}

// head returns the CRC, from zero, of the pseudo-header with bth masked in (from pc when
// it holds the flow and length; pc may be nil).
func (f *Flow) head(pc *PrefixCache, bth []byte, tlen int) uint32 {
	if pc == nil {
		var buf [pseudoLen]byte
		n := f.prefix(&buf, bth, tlen)
		return crcSmall(0, buf[:n])
	}
	var m [BTHLen]byte
	copy(m[:], bth[:BTHLen])
	m[4] = 0xFF // FECN, BECN and reserved bits masked
	return crcSmall(pc.ipUDP(f, tlen), m[:])
}

// ICRC returns the invariant CRC of pkt, which runs from the BTH to the end of the payload
// and pad, without the 4 ICRC bytes.
func (f *Flow) ICRC(pkt []byte) uint32 { return f.icrc(nil, pkt) }

func (f *Flow) icrc(pc *PrefixCache, pkt []byte) uint32 {
	if len(pkt) < BTHLen {
		return 0
	}
	c := f.head(pc, pkt, len(pkt)+ICRCLen)
	return crcUpdate(c, pkt[BTHLen:])
}

// icrcCopy is ICRC(pkt), copying pkt[off:off+len(dst)] (within the payload: off >= BTHLen)
// to dst in the same pass.
func (f *Flow) icrcCopy(pc *PrefixCache, pkt []byte, off int, dst []byte) uint32 {
	c := f.head(pc, pkt, len(pkt)+ICRCLen)
	c = crcUpdate(c, pkt[BTHLen:off])
	c = crcCopy(c, dst, pkt[off:off+len(dst)])
	return crcUpdate(c, pkt[off+len(dst):])
}

// ICRCParts computes the ICRC of a packet held in pieces: hdr (BTH and extended headers),
// the payload pieces, and pad bytes. tlen is the total transport length including ICRC.
func (f *Flow) ICRCParts(hdr []byte, payload [][]byte, pad []byte) uint32 {
	return f.ICRCPartsCached(nil, hdr, payload, pad)
}

// ICRCPartsCached is ICRCParts, taking the pseudo-header's CRC up to the BTH from pc
// (and keeping it there) when pc is not nil.
func (f *Flow) ICRCPartsCached(pc *PrefixCache, hdr []byte, payload [][]byte, pad []byte) uint32 {
	if len(hdr) < BTHLen {
		return 0
	}
	tlen := len(hdr) + len(pad) + ICRCLen
	for _, p := range payload {
		tlen += len(p)
	}
	c := f.head(pc, hdr, tlen)
	c = crcUpdate(c, hdr[BTHLen:])
	for _, p := range payload {
		c = crcUpdate(c, p)
	}
	return crcUpdate(c, pad)
}

// PutICRC stores the ICRC in its wire byte order (least significant byte first).
func PutICRC(b []byte, icrc uint32) { binary.LittleEndian.PutUint32(b, icrc) }

// VerifyICRC checks the ICRC at the end of pkt (BTH to end, including the ICRC).
func (f *Flow) VerifyICRC(pkt []byte) bool {
	if len(pkt) < BTHLen+ICRCLen {
		return false
	}
	n := len(pkt) - ICRCLen
	return f.ICRC(pkt[:n]) == binary.LittleEndian.Uint32(pkt[n:])
}
