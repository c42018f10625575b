package wire

import (
	"encoding/binary"
	"hash/crc32"
	"math/bits"
	"sync"
	"sync/atomic"
)

// The ICRC and the IPv4 Identification.
//
// RoCEv2's ICRC covers the IPv4 header's Identification field, which a UDP socket neither
// sets nor shows. On send, Linux gives a datagram from an unconnected socket with DF set the
// identification 0, and the segments of a GSO send base+i (base 0): segment i of a batch
// must carry the ICRC computed with identification i (SegmentICRC). On receive, a standard
// peer (Linux rxe) fills the field with any value, and the socket does not say which.
//
// CRC-32 is affine over GF(2): for two packets of the same length that differ only in the
// identification, the ICRCs differ by Z^L(c(id1 xor id2)), where c(v) is the raw CRC
// register after the two identification bytes v (from a zero register) and Z^L advances a
// register over the L bytes that follow them. So the receiver computes the ICRC with
// identification 0 and, if it differs from the packet's, solves for the identification:
// c = Z^-L(difference), and c must be c(v) for some 16-bit v. c is an injective linear map
// of v (v(x)·x^32 mod P, and P has degree 32), so there is at most one v; a difference that
// is no c(v) is an ICRC error. What is verified: 32 ICRC bits of which 16 pin down the
// identification, leaving 16 bits of check against corruption (a random corruption passes
// with probability 2^-16, against 2^-32 for a packet whose identification is known; the
// UDP checksum, which the kernel verifies, covers the same bytes).

// idOffset is where the identification sits in the ICRC's input: 8 bytes of ones, then
// the IPv4 header, whose bytes 4-5 it is.
const idOffset = 8 + 4

// gf2 is a linear map on 32-bit vectors, as the images of the 32 unit vectors.
type gf2 [32]uint32

func (m *gf2) apply(v uint32) uint32 {
	var r uint32
	for v != 0 {
		i := bits.TrailingZeros32(v)
		r ^= m[i]
		v &= v - 1
	}
	return r
}

func (m *gf2) square() gf2 {
	var r gf2
	for i := range r {
		r[i] = m.apply(m[i])
	}
	return r
}

// idMath holds what the identification arithmetic needs, built once (about 0.1 ms):
// Z^(2^k) and Z^-(2^k) for k < 32; c of each identification bit; and c's inverse as an
// echelon basis: basis[i] is a combination (the bits of comb[i]) of the c's whose highest
// set bit, pivot[i], no other basis vector has.
type idMath struct {
	zPow, zInvPow [32]gf2
	cBit          [16]uint32
	basis         [16]uint32
	comb          [16]uint16
}

var (
	idOnce sync.Once
	ids    *idMath
)

// PrepareIdentification builds what VerifyICRCAnyID and SegmentICRC use (about 0.2 ms),
// so that the first packet with a nonzero identification does not wait for it.
func PrepareIdentification() { idTables() }

func idTables() *idMath {
	idOnce.Do(func() {
		m := &idMath{}
		t := crc32.IEEETable
		var z, zi gf2
		for i := 0; i < 32; i++ {
			r := uint32(1) << i
			z[i] = t[byte(r)] ^ r>>8 // one zero byte
			// Its inverse: the top byte of T[x] identifies x (a property of CRC tables).
			zi[i] = invZeroByte(r)
		}
		m.zPow[0], m.zInvPow[0] = z, zi
		for k := 1; k < 32; k++ {
			m.zPow[k], m.zInvPow[k] = m.zPow[k-1].square(), m.zInvPow[k-1].square()
		}
		for k := 0; k < 16; k++ {
			v := uint16(1) << k
			r := t[byte(v>>8)]
			m.cBit[k] = t[byte(r)^byte(v)] ^ r>>8
		}
		m.eliminate()
		ids = m
	})
	return ids
}

// c is the raw CRC register after the identification bytes v, from a zero register: a
// linear map of v.
func (m *idMath) c(v uint16) uint32 {
	var r uint32
	for ; v != 0; v &= v - 1 {
		r ^= m.cBit[bits.TrailingZeros16(v)]
	}
	return r
}

// eliminate builds the echelon basis of the c's. c is injective (see the top of this
// file), so all 16 are independent.
func (m *idMath) eliminate() {
	for k := 0; k < 16; k++ {
		vec, comb := m.cBit[k], uint16(1)<<k
		for i := 0; i < k; i++ {
			if vec&topBit(m.basis[i]) != 0 {
				vec, comb = vec^m.basis[i], comb^m.comb[i]
			}
		}
		if vec == 0 {
			panic("wire: identification bits not independent")
		}
		// Keep every earlier vector free of the new pivot, so that solving is one pass.
		for i := 0; i < k; i++ {
			if m.basis[i]&topBit(vec) != 0 {
				m.basis[i], m.comb[i] = m.basis[i]^vec, m.comb[i]^comb
			}
		}
		m.basis[k], m.comb[k] = vec, comb
	}
}

func topBit(v uint32) uint32 { return 1 << (31 - bits.LeadingZeros32(v)) }

// solve returns the identification v with c(v) = r, if there is one.
func (m *idMath) solve(r uint32) (uint16, bool) {
	v, rest := m.solveRaw(r)
	return v, rest == 0
}

// solveRaw reduces r by the basis: it returns the identification and what is left, 0 when
// r = c(v). Both are linear in r.
func (m *idMath) solveRaw(r uint32) (uint16, uint32) {
	var v uint16
	for i := range m.basis {
		if r&topBit(m.basis[i]) != 0 {
			r ^= m.basis[i]
			v ^= m.comb[i]
		}
	}
	return v, r
}

// topByteIndex maps the top byte of T[x] back to x.
var topByteIndex = func() (idx [256]byte) {
	for x := 0; x < 256; x++ {
		idx[crc32.IEEETable[x]>>24] = byte(x)
	}
	return
}()

// invZeroByte undoes one zero byte's step r' = T[byte(r)] ^ r>>8.
func invZeroByte(r uint32) uint32 {
	x := topByteIndex[r>>24]
	return (r^crc32.IEEETable[x])<<8 | uint32(x)
}

// advance applies Z^n (or Z^-n with inv) to register v.
func (m *idMath) advance(v uint32, n int, inv bool) uint32 {
	pow := &m.zPow
	if inv {
		pow = &m.zInvPow
	}
	for k := 0; n != 0; k++ {
		if n&1 != 0 {
			v = pow[k].apply(v)
		}
		n >>= 1
	}
	return v
}

// icrcInputLen is the length of the ICRC's input for an IPv4 packet whose transport part
// (BTH to ICRC inclusive) is tlen bytes: 8 bytes of ones, IPv4, UDP, and the transport
// part without the ICRC.
func icrcInputLen(tlen int) int { return 8 + 20 + 8 + tlen - ICRCLen }

// idDelta is how the ICRC of an IPv4 packet with transport length tlen changes when its
// identification changes by v (xor).
func idDelta(v uint16, tlen int) uint32 {
	if v == 0 {
		return 0
	}
	m := idTables()
	return m.advance(m.c(v), icrcInputLen(tlen)-idOffset-2, false)
}

// SegmentICRC turns the ICRC of an IPv4 packet computed with identification 0 (its wire
// bytes, icrc) into the one for identification id (GSO segment id of a send), in place;
// tlen is the packet's transport length, BTH to ICRC inclusive (its UDP payload).
func SegmentICRC(icrc []byte, tlen int, id uint16) {
	v := binary.LittleEndian.Uint32(icrc) ^ idDelta(id, tlen)
	binary.LittleEndian.PutUint32(icrc, v)
}

// Segmenter is SegmentICRC with the arithmetic done once per transport length: the
// change an identification makes is linear in it, so for each length the change of each of
// its 16 bits is kept, and a segment's is the XOR of its set bits' (a GSO send's segments
// 1..15 share one length; SegmentICRC does the whole arithmetic for every one). It keeps a
// few lengths; a length not kept costs what SegmentICRC costs, once, and replaces another.
// Fix may be called from several goroutines at once.
type Segmenter struct {
	slots [4]atomic.Pointer[segBasis]
}

// segBasis is the ICRC change of each identification bit for one transport length.
type segBasis struct {
	tlen int
	d    [16]uint32
}

// Fix is SegmentICRC(icrc, tlen, id).
func (s *Segmenter) Fix(icrc []byte, tlen int, id uint16) {
	if id == 0 {
		return
	}
	slot := &s.slots[(tlen>>2^tlen>>5)&3]
	b := slot.Load()
	if b == nil || b.tlen != tlen {
		b = &segBasis{tlen: tlen}
		for k := range b.d {
			b.d[k] = idDelta(1<<k, tlen)
		}
		slot.Store(b)
	}
	var d uint32
	for v := id; v != 0; v &= v - 1 {
		d ^= b.d[bits.TrailingZeros16(v)]
	}
	binary.LittleEndian.PutUint32(icrc, binary.LittleEndian.Uint32(icrc)^d)
}

// VerifyICRCAnyID checks the ICRC at the end of pkt (BTH to end, including the ICRC)
// whatever the packet's IPv4 identification was, and returns that identification. For
// IPv6 (which has none) it is VerifyICRC. The Flow's own IPID is not used. A receive path
// that verifies many packets uses an IDSolver, which does the same faster.
func (f *Flow) VerifyICRCAnyID(pkt []byte) (id uint16, ok bool) {
	return f.verifyAnyID(pkt, nil, 0, nil)
}

// verifyAnyID verifies pkt with solver s (nil: the arithmetic), copying
// pkt[off:off+len(dst)] to dst as it reads it if dst is not nil.
func (f *Flow) verifyAnyID(pkt []byte, s *IDSolver, off int, dst []byte) (id uint16, ok bool) {
	if len(pkt) < BTHLen+ICRCLen {
		return 0, false
	}
	n := len(pkt) - ICRCLen
	g := *f
	g.IPID = 0
	var pc *PrefixCache
	if s != nil {
		pc = &s.prefix
	}
	var icrc uint32
	if dst != nil {
		icrc = g.icrcCopy(pc, pkt[:n], off, dst)
	} else {
		icrc = g.icrc(pc, pkt[:n])
	}
	diff := icrc ^ binary.LittleEndian.Uint32(pkt[n:])
	if diff == 0 {
		return 0, true
	}
	if !f.v4() {
		return 0, false
	}
	if s != nil {
		return s.solve(diff, len(pkt))
	}
	m := idTables()
	return m.solve(m.advance(diff, icrcInputLen(len(pkt))-idOffset-2, true))
}

// IDSolver verifies ICRCs whatever the IPv4 identification, as Flow.VerifyICRCAnyID does,
// keeping for the packet lengths it sees most the whole solution as a table: the
// identification and what is left after solving are linear maps of the ICRC difference
// (Z^-L, then the elimination), so four lookups, one per byte of the difference, replace
// about a hundred. A table is for one length; a stream of full-sized packets hits it. The
// zero value is ready to use; it is not safe for concurrent use (one per receive queue).
//
// What a peer can make it do is bounded: a length must be seen idTableAfter times in a row
// before it gets a table, and once both tables are made a new one is built at most once
// per idTableEvery packets, so a peer varying its lengths gets the arithmetic
// VerifyICRCAnyID does, never more.
type IDSolver struct {
	tabs    [2]idTable // the lengths with tables; tabs[0] the most recently built
	cand    int        // a length without a table, seen candRun times in a row
	candRun int
	since   int         // packets solved since the last table was built
	prefix  PrefixCache // the pseudo-header's CRC for the last flow and length verified
}

const (
	idTableAfter = 16   // packets of one length in a row before it gets a table
	idTableEvery = 4096 // packets between two tables built
)

// idTable solves for one transport length: t[k][b] is the solution for byte k of the
// difference being b: the identification in bits 32-47, the remainder (0 for a valid
// packet) in bits 0-31.
type idTable struct {
	tlen int
	t    *[4][256]uint64
}

// VerifyICRCAnyID is Flow.VerifyICRCAnyID(pkt) for flow f.
func (s *IDSolver) VerifyICRCAnyID(f *Flow, pkt []byte) (id uint16, ok bool) {
	return f.verifyAnyID(pkt, s, 0, nil)
}

// VerifyICRCCopy is VerifyICRCAnyID that also copies len(dst) bytes of pkt's payload,
// from offset off (BTHLen <= off, off+len(dst) <= len(pkt)-ICRCLen), to dst as it reads
// them for the CRC: a receive path that places a payload where it knows it goes reads it
// once. The bytes are copied whether or not the ICRC verifies.
func (s *IDSolver) VerifyICRCCopy(f *Flow, pkt []byte, off int, dst []byte) (id uint16, ok bool) {
	if off < BTHLen || off+len(dst) > len(pkt)-ICRCLen {
		panic("wire: VerifyICRCCopy: the copied bytes are not within the payload")
	}
	return f.verifyAnyID(pkt, s, off, dst)
}

// solve finds the identification that explains an ICRC difference diff for a packet whose
// transport part is tlen bytes.
func (s *IDSolver) solve(diff uint32, tlen int) (uint16, bool) {
	s.since++
	for i := range s.tabs {
		if tb := &s.tabs[i]; tb.tlen == tlen && tb.t != nil {
			t := tb.t
			r := t[0][byte(diff)] ^ t[1][byte(diff>>8)] ^ t[2][byte(diff>>16)] ^ t[3][diff>>24]
			return uint16(r >> 32), uint32(r) == 0
		}
	}
	if tlen == s.cand {
		s.candRun++
	} else {
		s.cand, s.candRun = tlen, 1
	}
	if s.candRun >= idTableAfter && (s.since >= idTableEvery || s.tabs[1].t == nil) {
		s.tabs[1] = s.tabs[0]
		s.tabs[0] = idTable{tlen: tlen, t: buildIDTable(tlen)}
		s.since, s.cand, s.candRun = 0, 0, 0
	}
	m := idTables()
	return m.solve(m.advance(diff, icrcInputLen(tlen)-idOffset-2, true))
}

// buildIDTable makes the table for transport length tlen (about 10 us): the solution for
// each of the 32 bits of the difference, then every byte value as a sum of those.
func buildIDTable(tlen int) *[4][256]uint64 {
	m := idTables()
	t := new([4][256]uint64)
	for k := range 4 {
		for b := 1; b < 256; b++ {
			low := b & -b
			if b == low {
				v, r := m.solveRaw(m.advance(uint32(b)<<(8*k), icrcInputLen(tlen)-idOffset-2, true))
				t[k][b] = uint64(v)<<32 | uint64(r)
			} else {
				t[k][b] = t[k][low] ^ t[k][b^low]
			}
		}
	}
	return t
}
