package wire

import (
	"bytes"
	"net/netip"
	"testing"
	"unsafe"
)

// Fuzz targets for the decoders and the ICRC. Their seed corpora live in
// testdata/fuzz/<FuzzName>/ and run as ordinary tests; TestWriteFuzzSeeds (seeds_test.go)
// regenerates them from testdata/roce-icrc-vectors.json when SOFTRNIC_WRITE_FUZZ_SEEDS=1.

// FuzzDecodePacket: Decode never panics on arbitrary bytes, and what it accepts is
// consistent with the input.
func FuzzDecodePacket(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		err := p.Decode(b)
		if err != nil {
			switch err {
			case ErrShort, ErrOpcode, ErrPad, ErrTVer, ErrNoPayload:
			default:
				t.Fatalf("Decode returned an undocumented error %v", err)
			}
			return
		}
		if len(b) < BTHLen+ICRCLen {
			t.Fatalf("Decode accepted %d bytes", len(b))
		}
		info := p.Info
		if info == nil || !info.Valid || info != p.BTH.Opcode.Info() {
			t.Fatalf("Info %+v does not describe opcode %#x", info, uint8(p.BTH.Opcode))
		}
		if p.BTH.TVer != 0 {
			t.Fatalf("accepted TVer %d", p.BTH.TVer)
		}
		if info.HdrLen < BTHLen || len(b) < info.HdrLen+ICRCLen {
			t.Fatalf("HdrLen %d for %d bytes", info.HdrLen, len(b))
		}

		// BTH.Put gives back the input's 12 bytes; the 7 reserved bits after the AckReq bit
		// (byte 8) are the only ones BTH does not keep.
		var enc [BTHLen]byte
		p.BTH.Put(enc[:])
		want := append([]byte(nil), b[:BTHLen]...)
		want[8] &= 0x80
		if !bytes.Equal(enc[:], want) {
			t.Fatalf("BTH re-encodes as %x, input %x", enc, b[:BTHLen])
		}
		if h, _ := DecodeBTH(b); h != p.BTH {
			t.Fatalf("Packet.BTH %+v, DecodeBTH %+v", p.BTH, h)
		}

		// Extended headers sit where the opcode's flags say, in wire order, and add up to
		// Info.HdrLen.
		off := BTHLen
		fl := info.Flags
		if fl&HasDETH != 0 {
			if d, _ := DecodeDETH(b[off:]); d != p.DETH {
				t.Fatalf("DETH %+v, at offset %d: %+v", p.DETH, off, d)
			}
			var enc [DETHLen]byte
			p.DETH.Put(enc[:])
			want := append([]byte(nil), b[off:off+DETHLen]...)
			want[4] = 0 // reserved
			if !bytes.Equal(enc[:], want) {
				t.Fatalf("DETH re-encodes as %x, input %x", enc, b[off:off+DETHLen])
			}
			off += DETHLen
		}
		if fl&HasRETH != 0 {
			if r, _ := DecodeRETH(b[off:]); r != p.RETH {
				t.Fatalf("RETH %+v, at offset %d: %+v", p.RETH, off, r)
			}
			off += RETHLen
		}
		if fl&HasAETH != 0 {
			if a, _ := DecodeAETH(b[off:]); a != p.AETH {
				t.Fatalf("AETH %+v, at offset %d: %+v", p.AETH, off, a)
			}
			off += AETHLen
		}
		if fl&HasAtomicETH != 0 {
			if a, _ := DecodeAtomicETH(b[off:]); a != p.Atomic {
				t.Fatalf("AtomicETH %+v, at offset %d: %+v", p.Atomic, off, a)
			}
			off += AtomicETHLen
		}
		if fl&HasAtomicAckETH != 0 {
			if v := be64(b[off:]); v != p.AtomicAck {
				t.Fatalf("AtomicAckETH %#x, at offset %d: %#x", p.AtomicAck, off, v)
			}
			off += AtomicAckETHLen
		}
		if fl&HasImmDt != 0 {
			if v := be32(b[off:]); v != p.Imm {
				t.Fatalf("ImmDt %#x, at offset %d: %#x", p.Imm, off, v)
			}
			off += ImmDtLen
		}
		if fl&HasIETH != 0 {
			if v := be32(b[off:]); v != p.IETH {
				t.Fatalf("IETH %#x, at offset %d: %#x", p.IETH, off, v)
			}
			off += IETHLen
		}
		if off != hdrLen(fl) {
			t.Fatalf("headers end at %d, hdrLen says %d", off, hdrLen(fl))
		}
		if len(p.Ext) != info.HdrLen-off {
			t.Fatalf("Ext is %d bytes, HdrLen %d, standard headers %d", len(p.Ext), info.HdrLen, off)
		}
		if len(p.Ext) > 0 && offsetIn(b, p.Ext) != off {
			t.Fatalf("Ext does not start at offset %d of the input", off)
		}

		// The payload is the input between the headers and pad + ICRC.
		if o := offsetIn(b, p.Payload); o != info.HdrLen {
			t.Fatalf("payload at offset %d of the input, HdrLen %d", o, info.HdrLen)
		}
		if info.HdrLen+len(p.Payload)+int(p.BTH.PadCnt)+ICRCLen != len(b) {
			t.Fatalf("HdrLen %d + payload %d + pad %d + ICRC != %d bytes", info.HdrLen, len(p.Payload), p.BTH.PadCnt, len(b))
		}
		if fl&HasPayload == 0 && len(p.Payload) != 0 {
			t.Fatalf("%v carries a %d-byte payload", p.BTH.Opcode, len(p.Payload))
		}
		if !bytes.Equal(p.Payload, b[info.HdrLen:info.HdrLen+len(p.Payload)]) {
			t.Fatal("payload bytes differ from the input")
		}

		// A weak-mode packet's extension is what its own decoder reads: the OOH of a
		// request, the SACK header of the acknowledgement (whose ranges are the payload).
		if fl&IsWeak != 0 {
			if p.BTH.Opcode == OpWeakAck {
				if len(p.Ext) != SACKHeaderLen {
					t.Fatalf("SACK header is %d bytes", len(p.Ext))
				}
				_ = SACKEcho(p.Ext)
				if r, err := DecodeSACK(p.Ext, p.Payload, nil); err == nil && len(r)*SACKRangeLen != len(p.Payload) {
					t.Fatalf("%d SACK ranges from %d payload bytes", len(r), len(p.Payload))
				}
			} else {
				if len(p.Ext) != OOHLen {
					t.Fatalf("%v: OOH is %d bytes", p.BTH.Opcode, len(p.Ext))
				}
				_, _ = DecodeOOH(p.Ext)
			}
		}
	})
}

// oohReserved reports whether the 20 bytes of an OOH have a bit set that DecodeOOH must
// refuse: a receive/read sequence number wider than 24 bits, a flag other than OOHRecv,
// or one of the three reserved bytes.
func oohReserved(b []byte) bool {
	return be32(b[0:4]) > PSNMask || b[12]&^OOHRecv != 0 || b[13]|b[14]|b[15] != 0
}

// FuzzDecodeOOH: DecodeOOH never panics; it refuses exactly the inputs that are short or
// set a reserved bit; what it accepts re-encodes byte for byte (Put) and decodes to the
// same header again. Put of any header decodes back to it (with Seq cut to 24 bits),
// unless it has flags DecodeOOH refuses.
func FuzzDecodeOOH(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := DecodeOOH(b)
		switch {
		case len(b) < OOHLen:
			if err != ErrShort {
				t.Fatalf("DecodeOOH(%d bytes): %v, want ErrShort", len(b), err)
			}
		case oohReserved(b):
			if err != ErrReserved {
				t.Fatalf("DecodeOOH(%x): %v, want ErrReserved", b[:OOHLen], err)
			}
		case err != nil:
			t.Fatalf("DecodeOOH(%x): %v", b[:OOHLen], err)
		default:
			if o.Seq > PSNMask || o.Flags&^OOHRecv != 0 {
				t.Fatalf("accepted out-of-range fields %+v", o)
			}
			var enc [OOHLen]byte
			o.Put(enc[:])
			if !bytes.Equal(enc[:], b[:OOHLen]) {
				t.Fatalf("Put gives %x for input %x", enc, b[:OOHLen])
			}
			if o2, err := DecodeOOH(enc[:]); err != nil || o2 != o {
				t.Fatalf("round trip %+v -> %+v (%v)", o, o2, err)
			}
		}

		// The input's bytes as the fields of a header to encode.
		r := append(append([]byte(nil), b...), make([]byte, 17)...)
		in := OOH{Seq: PSN(be32(r[0:])), Offset: be32(r[4:]), Length: be32(r[8:]), Flags: r[12], TxSeq: be32(r[13:])}
		enc := bytes.Repeat([]byte{0xA5}, OOHLen+1)
		in.Put(enc)
		if enc[OOHLen] != 0xA5 {
			t.Fatal("Put wrote past the OOH")
		}
		out, err := DecodeOOH(enc)
		want := in
		want.Seq &= PSNMask
		switch {
		case in.Flags&^OOHRecv != 0:
			if err != ErrReserved {
				t.Fatalf("Put of flags %#x decodes: %+v, %v", in.Flags, out, err)
			}
		case err != nil || out != want:
			t.Fatalf("Put %+v decodes to %+v (%v), want %+v", in, out, err, want)
		}
	})
}

// FuzzDecodeSACK: DecodeSACK never panics and never drops what dst held; what it accepts
// is a count word of at most MaxSACKRanges ranges, exactly that many 8-byte ranges of
// non-empty PSN runs shorter than half the PSN space, each with a zero top byte; the
// ranges re-encode (PutSACKRanges) to the input byte for byte, and a SACK built from them
// (PutSACKHeader) decodes to them again with its echo. SACKEcho never panics.
func FuzzDecodeSACK(f *testing.F) {
	f.Fuzz(func(t *testing.T, count, payload []byte, echo uint32) {
		_ = SACKEcho(count)
		prefix := [][2]PSN{{1, 2}}
		got, err := DecodeSACK(count, payload, prefix)
		if len(got) < 1 || got[0] != prefix[0] {
			t.Fatalf("DecodeSACK lost what dst held: %v", got)
		}
		if err != nil {
			if err != ErrShort && err != ErrSACK {
				t.Fatalf("undocumented error %v", err)
			}
			if (err == ErrShort) != (len(count) < 4) {
				t.Fatalf("%v for a %d-byte count", err, len(count))
			}
			return
		}
		ranges := got[1:]
		n := be32(count)
		if len(count) < 4 || n > MaxSACKRanges || uint32(len(ranges)) != n || len(payload) != int(n)*SACKRangeLen {
			t.Fatalf("accepted count %d with %d payload bytes: %d ranges", n, len(payload), len(ranges))
		}
		for i, r := range ranges {
			if r[0] > PSNMask || r[1] > PSNMask || r[1].Diff(r[0]) <= 0 {
				t.Fatalf("accepted range %d [%#x, %#x): empty, reversed or wider than 24 bits", i, r[0], r[1])
			}
			if r[0] != PSN(be32(payload[i*8:])) || r[1] != PSN(be32(payload[i*8+4:])) {
				t.Fatalf("range %d [%#x, %#x) is not the input's", i, r[0], r[1])
			}
		}
		enc := make([]byte, len(ranges)*SACKRangeLen)
		PutSACKRanges(enc, ranges)
		if !bytes.Equal(enc, payload) {
			t.Fatalf("ranges re-encode as %x, input %x", enc, payload)
		}
		var hdr [SACKHeaderLen]byte
		PutSACKHeader(hdr[:], len(ranges), echo)
		again, err := DecodeSACK(hdr[:], enc, nil)
		if err != nil || len(again) != len(ranges) || SACKEcho(hdr[:]) != echo {
			t.Fatalf("rebuilt SACK: %v, %v, echo %#x", again, err, SACKEcho(hdr[:]))
		}
		for i := range again {
			if again[i] != ranges[i] {
				t.Fatalf("rebuilt SACK range %d: %v, want %v", i, again[i], ranges[i])
			}
		}
	})
}

// offsetIn returns the offset of s's first element inside b, or -1 if s does not lie
// within b (s may be empty, then it must point into b or just past its end).
func offsetIn(b, s []byte) int {
	if cap(b) == 0 {
		return -1
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
	if p < base || p > base+uintptr(len(b)) {
		return -1
	}
	o := int(p - base)
	if o+len(s) > len(b) {
		return -1
	}
	return o
}

func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}
func be64(b []byte) uint64 { return uint64(be32(b))<<32 | uint64(be32(b[4:])) }

// FuzzDecodeBTH: decode -> Put -> decode gives the same header, and Put reproduces the
// input except the reserved bits of byte 8.
func FuzzDecodeBTH(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeBTH(b)
		if len(b) < BTHLen {
			if err == nil {
				t.Fatalf("DecodeBTH accepted %d bytes", len(b))
			}
			return
		}
		if err != nil {
			t.Fatalf("DecodeBTH(%d bytes): %v", len(b), err)
		}
		var enc [BTHLen]byte
		h.Put(enc[:])
		want := append([]byte(nil), b[:BTHLen]...)
		want[8] &= 0x80
		if !bytes.Equal(enc[:], want) {
			t.Fatalf("Put gives %x for input %x", enc, b[:BTHLen])
		}
		h2, err := DecodeBTH(enc[:])
		if err != nil || h2 != h {
			t.Fatalf("round trip %+v -> %+v (%v)", h, h2, err)
		}
		if h.PadCnt > 3 || h.TVer > 15 || h.DestQP > PSNMask || h.PSN > PSNMask || h.Reserve > 0x3F {
			t.Fatalf("field out of range: %+v", h)
		}
	})
}

// FuzzDecodeRETH: decode -> Put -> decode is the identity, byte for byte.
func FuzzDecodeRETH(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRETH(b)
		if len(b) < RETHLen {
			if err == nil {
				t.Fatalf("DecodeRETH accepted %d bytes", len(b))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var enc [RETHLen]byte
		r.Put(enc[:])
		if !bytes.Equal(enc[:], b[:RETHLen]) {
			t.Fatalf("Put gives %x for input %x", enc, b[:RETHLen])
		}
		if r2, err := DecodeRETH(enc[:]); err != nil || r2 != r {
			t.Fatalf("round trip %+v -> %+v (%v)", r, r2, err)
		}
	})
}

// FuzzDecodeAETH: decode -> Put -> decode is the identity, byte for byte.
func FuzzDecodeAETH(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeAETH(b)
		if len(b) < AETHLen {
			if err == nil {
				t.Fatalf("DecodeAETH accepted %d bytes", len(b))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if a.MSN > PSNMask {
			t.Fatalf("MSN %#x wider than 24 bits", a.MSN)
		}
		var enc [AETHLen]byte
		a.Put(enc[:])
		if !bytes.Equal(enc[:], b[:AETHLen]) {
			t.Fatalf("Put gives %x for input %x", enc, b[:AETHLen])
		}
		if a2, err := DecodeAETH(enc[:]); err != nil || a2 != a {
			t.Fatalf("round trip %+v -> %+v (%v)", a, a2, err)
		}
	})
}

// FuzzDecodeAtomicETH: decode -> Put -> decode is the identity, byte for byte.
func FuzzDecodeAtomicETH(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeAtomicETH(b)
		if len(b) < AtomicETHLen {
			if err == nil {
				t.Fatalf("DecodeAtomicETH accepted %d bytes", len(b))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var enc [AtomicETHLen]byte
		a.Put(enc[:])
		if !bytes.Equal(enc[:], b[:AtomicETHLen]) {
			t.Fatalf("Put gives %x for input %x", enc, b[:AtomicETHLen])
		}
		if a2, err := DecodeAtomicETH(enc[:]); err != nil || a2 != a {
			t.Fatalf("round trip %+v -> %+v (%v)", a, a2, err)
		}
	})
}

// fuzzFlow makes a Flow from fuzzed bytes: 8 bytes are an IPv4 source and destination,
// 32 bytes two 16-byte (IPv6, possibly IPv4-mapped) addresses; other lengths pick a fixed
// IPv4 or IPv6 pair. A source of one family with a destination of the other is computed as
// IPv6 (it used to panic).
func fuzzFlow(addrs []byte, sport, dport, ipid uint16, df bool) (fl Flow) {
	switch {
	case len(addrs) >= 32:
		fl.Src = netip.AddrFrom16([16]byte(addrs[:16]))
		fl.Dst = netip.AddrFrom16([16]byte(addrs[16:32]))
	case len(addrs) >= 8:
		fl.Src = netip.AddrFrom4([4]byte(addrs[:4]))
		fl.Dst = netip.AddrFrom4([4]byte(addrs[4:8]))
	case len(addrs)%2 == 1:
		fl.Src, fl.Dst = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	default:
		fl.Src, fl.Dst = netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	}
	fl.SrcPort, fl.DstPort, fl.IPID, fl.DF = sport, dport, ipid, df
	return fl
}

// FuzzICRC: VerifyICRC never panics; a computed ICRC appended to the packet verifies (and
// ICRCParts agrees with ICRC); any single flipped bit outside BTH byte 4 (which the ICRC
// masks) makes the packet fail verification, as does a flipped bit of a UDP port.
func FuzzICRC(f *testing.F) {
	f.Fuzz(func(t *testing.T, pkt, addrs []byte, sport, dport, ipid uint16, df bool, bit uint32) {
		fl := fuzzFlow(addrs, sport, dport, ipid, df)
		_ = fl.VerifyICRC(pkt) // arbitrary input: must not panic

		// Treat pkt as BTH..payload (without ICRC) and seal it.
		if len(pkt) < BTHLen {
			return
		}
		c := fl.ICRC(pkt)
		full := make([]byte, len(pkt)+ICRCLen)
		copy(full, pkt)
		PutICRC(full[len(pkt):], c)
		if !fl.VerifyICRC(full) {
			t.Fatalf("sealed packet does not verify (ICRC %08x, flow %+v)", c, fl)
		}
		// Whatever its identification, the receiver recovers it (IPv4), and a GSO segment's
		// trailer made from identification 0's agrees with the ICRC computed directly.
		_, _ = fl.VerifyICRCAnyID(pkt) // arbitrary input: must not panic
		if fl.v4() {
			if id, ok := fl.VerifyICRCAnyID(full); !ok || id != fl.IPID {
				t.Fatalf("VerifyICRCAnyID = %d, %v; the identification is %d", id, ok, fl.IPID)
			}
			z := fl
			z.IPID = 0
			var tr [ICRCLen]byte
			PutICRC(tr[:], z.ICRC(pkt))
			tr2 := tr
			SegmentICRC(tr[:], len(full), fl.IPID)
			if !bytes.Equal(tr[:], full[len(pkt):]) {
				t.Fatalf("SegmentICRC to identification %d: %x, want %x", fl.IPID, tr, full[len(pkt):])
			}
			// A Segmenter (twice: computing its basis, then from it) agrees.
			var sg Segmenter
			for range 2 {
				tr3 := tr2
				sg.Fix(tr3[:], len(full), fl.IPID)
				if tr3 != tr {
					t.Fatalf("Segmenter to identification %d: %x, want %x", fl.IPID, tr3, tr)
				}
			}
			// A receive queue's IDSolver with a table for this length answers the same, for
			// the packet and for one with a flipped bit.
			s := IDSolver{tabs: [2]idTable{{tlen: len(full), t: buildIDTable(len(full))}}}
			flipped := append([]byte(nil), full...)
			flipped[int(bit)%len(flipped)] ^= 1 << (bit % 8)
			for _, q := range [][]byte{full, flipped} {
				id, ok := s.VerifyICRCAnyID(&fl, q)
				wid, wok := fl.VerifyICRCAnyID(q)
				if ok != wok || (ok && id != wid) {
					t.Fatalf("IDSolver %d, %v; VerifyICRCAnyID %d, %v", id, ok, wid, wok)
				}
			}
		}
		// The same value from pieces: split the packet at a fuzzed point after the BTH.
		split := BTHLen + int(bit%uint32(len(pkt)-BTHLen+1))
		mid, tail := pkt[split:], []byte(nil)
		if len(mid) > 3 {
			mid, tail = mid[:len(mid)-3], mid[len(mid)-3:]
		}
		if p := fl.ICRCParts(pkt[:split], [][]byte{mid[:len(mid)/2], mid[len(mid)/2:]}, tail); p != c {
			t.Fatalf("ICRCParts %08x, ICRC %08x (split at %d)", p, c, split)
		}

		// One flipped bit anywhere but BTH byte 4 is always caught (CRC-32 detects every
		// single-bit error).
		i := int(bit % uint32(len(full)*8))
		if i/8 == 4 {
			i = (i + 8) % (len(full) * 8)
		}
		bad := append([]byte(nil), full...)
		bad[i/8] ^= 1 << (i % 8)
		if fl.VerifyICRC(bad) {
			t.Fatalf("bit %d flipped, ICRC still verifies", i)
		}
		// Bits of BTH byte 4 are masked: flipping one keeps the packet valid.
		masked := append([]byte(nil), full...)
		masked[4] ^= 1 << (bit % 8)
		if !fl.VerifyICRC(masked) {
			t.Fatal("a flipped FECN/BECN/reserved bit broke the ICRC")
		}
		// The UDP ports are covered.
		other := fl
		other.SrcPort ^= 1 << (bit % 16)
		if other.VerifyICRC(full) {
			t.Fatalf("source port %d verifies a packet sealed for port %d", other.SrcPort, fl.SrcPort)
		}
	})
}
