package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"
)

// Fuzz targets for the decoders and the ICRC. Their seed corpora live in
// testdata/fuzz/<FuzzName>/ and run as ordinary tests; TestWriteFuzzSeeds regenerates them
// from testdata/roce-icrc-vectors.json when SOFTRNIC_WRITE_FUZZ_SEEDS=1.

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
		in := OOH{Seq: be32(r[0:]), Offset: be32(r[4:]), Length: be32(r[8:]), Flags: r[12], TxSeq: be32(r[13:])}
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
		prefix := [][2]uint32{{1, 2}}
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
			if r[0] > PSNMask || r[1] > PSNMask || PSNDiff(r[1], r[0]) <= 0 {
				t.Fatalf("accepted range %d [%#x, %#x): empty, reversed or wider than 24 bits", i, r[0], r[1])
			}
			if r[0] != be32(payload[i*8:]) || r[1] != be32(payload[i*8+4:]) {
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

// TestWriteFuzzSeeds writes the seed corpora of the fuzz targets above into
// testdata/fuzz/. It only runs with SOFTRNIC_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SOFTRNIC_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set SOFTRNIC_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	vecs := loadVectors(t)
	type seed struct {
		name string
		args []any
	}
	corpora := map[string][]seed{}
	add := func(target, name string, args ...any) {
		corpora[target] = append(corpora[target], seed{name, args})
	}
	seen := map[string]bool{}
	for i, v := range vecs {
		pkt, err := hex.DecodeString(v.BTHToEnd)
		if err != nil {
			t.Fatal(err)
		}
		icrc, _ := hex.DecodeString(v.ICRCWire)
		full := append(append([]byte{}, pkt...), icrc...)
		name := fmt.Sprintf("vec%02d-%s", i, v.Name)
		src, dst := netip.MustParseAddr(v.IPSrc).As4(), netip.MustParseAddr(v.IPDst).As4()
		addrs := append(src[:], dst[:]...)
		add("FuzzICRC", name, full, addrs, v.UDPSport, v.UDPDport, v.IPID, v.IPFlagsDF, uint32(i*37))
		// The decoder corpora need one vector per opcode, and its truncations.
		if seen[v.Name] {
			continue
		}
		seen[v.Name] = true
		add("FuzzDecodePacket", name, full)
		add("FuzzDecodeBTH", name, full[:BTHLen])
		var p Packet
		if err := p.Decode(full); err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		hl := p.Info.HdrLen
		if len(full) > hl+ICRCLen {
			add("FuzzDecodePacket", name+"-hdr-only", full[:hl+ICRCLen])
		}
		add("FuzzDecodePacket", name+"-one-short", full[:hl+ICRCLen-1])
		if p.BTH.PadCnt == 0 && len(p.Payload) > 0 {
			bad := append([]byte{}, full...)
			bad[1] |= 0x30 // pad 3
			add("FuzzDecodePacket", name+"-pad3", bad)
		}
		switch f := p.Info.Flags; {
		case f&HasRETH != 0:
			add("FuzzDecodeRETH", name, full[BTHLen:BTHLen+RETHLen])
		case f&HasAtomicETH != 0:
			add("FuzzDecodeAtomicETH", name, full[BTHLen:BTHLen+AtomicETHLen])
		case f&HasAETH != 0:
			add("FuzzDecodeAETH", name, full[BTHLen:BTHLen+AETHLen])
		}
	}
	// Edge inputs.
	ff := bytes.Repeat([]byte{0xFF}, 64)
	for _, n := range []int{0, 1, BTHLen - 1, BTHLen, BTHLen + ICRCLen - 1, BTHLen + ICRCLen, MaxHeaderLen + ICRCLen} {
		add("FuzzDecodePacket", fmt.Sprintf("zero-%d", n), make([]byte, n))
	}
	add("FuzzDecodePacket", "ones-64", ff)
	tver := make([]byte, 32)
	tver[0], tver[1] = byte(OpSendOnly), 0x01
	add("FuzzDecodePacket", "tver1", tver)
	reserved := make([]byte, 32)
	reserved[0] = 0x15
	add("FuzzDecodePacket", "reserved-opcode", reserved)
	manuf := make([]byte, 32)
	manuf[0] = 0xC0
	add("FuzzDecodePacket", "manufacturer-opcode", manuf)
	ackPay := make([]byte, BTHLen+AETHLen+4+ICRCLen)
	ackPay[0] = byte(OpAcknowledge)
	add("FuzzDecodePacket", "ack-with-payload", ackPay)
	pad := make([]byte, BTHLen+1+ICRCLen)
	pad[0], pad[1] = byte(OpSendOnly), 0x30
	add("FuzzDecodePacket", "pad-exceeds-payload", pad)
	for name, n := range map[string]int{"FuzzDecodeBTH": BTHLen, "FuzzDecodeRETH": RETHLen, "FuzzDecodeAETH": AETHLen, "FuzzDecodeAtomicETH": AtomicETHLen} {
		add(name, "empty", []byte{})
		add(name, "one-short", ff[:n-1])
		add(name, "ones", ff[:n])
		add(name, "ones-long", ff[:n+5])
	}
	// Weak-mode packets: one of every opcode (built here, there are no external vectors
	// for the manufacturer-specific opcodes), with their truncations, and their OOH and
	// SACK parts for the decoders of their own.
	for _, w := range weakSeedPackets() {
		name := "weak-" + w.name
		add("FuzzDecodePacket", name, w.pkt)
		add("FuzzDecodeBTH", name, w.pkt[:BTHLen])
		var p Packet
		if err := p.Decode(w.pkt); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		hl := p.Info.HdrLen
		if len(w.pkt) > hl+ICRCLen {
			add("FuzzDecodePacket", name+"-hdr-only", w.pkt[:hl+ICRCLen])
		}
		add("FuzzDecodePacket", name+"-one-short", w.pkt[:hl+ICRCLen-1])
		if p.BTH.Opcode == OpWeakAck {
			add("FuzzDecodeSACK", name, p.Ext, p.Payload, SACKEcho(p.Ext))
		} else {
			add("FuzzDecodeOOH", name, p.Ext)
		}
	}
	ooh := func(seq, off, n uint32, flags uint8, tx uint32) []byte {
		b := make([]byte, OOHLen)
		(&OOH{Seq: seq, Offset: off, Length: n, Flags: flags, TxSeq: tx}).Put(b)
		return b
	}
	add("FuzzDecodeOOH", "empty", []byte{})
	add("FuzzDecodeOOH", "one-short", ooh(1, 2, 3, OOHRecv, 4)[:OOHLen-1])
	add("FuzzDecodeOOH", "ones", ff[:OOHLen])
	add("FuzzDecodeOOH", "max-fields", append(ooh(PSNMask, ^uint32(0), ^uint32(0), OOHRecv, ^uint32(0)), 0xEE))
	seqTop := ooh(5, 0, 8, 0, 1)
	seqTop[0] = 1
	add("FuzzDecodeOOH", "seq-25-bits", seqTop)
	add("FuzzDecodeOOH", "flag-2", ooh(5, 0, 8, 2, 1))
	resv := ooh(5, 0, 8, OOHRecv, 1)
	resv[14] = 0x80
	add("FuzzDecodeOOH", "reserved-byte", resv)
	sack := func(echo uint32, rs ...[2]uint32) ([]byte, []byte) {
		hdr := make([]byte, SACKHeaderLen)
		PutSACKHeader(hdr, len(rs), echo)
		pay := make([]byte, len(rs)*SACKRangeLen)
		PutSACKRanges(pay, rs)
		return hdr, pay
	}
	sackSeed := func(name string, hdr, pay []byte) { add("FuzzDecodeSACK", name, hdr, pay, SACKEcho(hdr)+1) }
	h, pl := sack(7)
	sackSeed("none", h, pl)
	h, pl = sack(9, [2]uint32{3, 5}, [2]uint32{8, 100})
	sackSeed("two", h, pl)
	var many [][2]uint32
	for i := uint32(0); i < MaxSACKRanges+1; i++ {
		many = append(many, [2]uint32{10 * i, 10*i + 5})
	}
	h, pl = sack(1, many[:MaxSACKRanges]...)
	sackSeed("max-ranges", h, pl)
	h, pl = sack(1, many...)
	sackSeed("too-many-ranges", h, pl)
	h, pl = sack(2, [2]uint32{PSNMask - 3, 4})
	sackSeed("wrap", h, pl)
	h, pl = sack(2, [2]uint32{5, 5})
	sackSeed("empty-range", h, pl)
	h, pl = sack(2, [2]uint32{9, 5})
	sackSeed("reversed-range", h, pl)
	h, pl = sack(2, [2]uint32{0, 1 << 23})
	sackSeed("half-space", h, pl)
	h, pl = sack(2, [2]uint32{0, 1<<23 - 1})
	sackSeed("just-under-half", h, pl)
	h, pl = sack(2, [2]uint32{3, 5})
	pl[0] = 1
	sackSeed("top-byte-set", h, pl)
	h, pl = sack(2, [2]uint32{3, 5})
	sackSeed("payload-short", h, pl[:7])
	sackSeed("payload-long", h, append(pl, 0))
	sackSeed("count-short", h[:3], pl)
	sackSeed("count-ones", ff[:SACKHeaderLen], ff[:16])

	v6 := append(netip.MustParseAddr("fd00::1").AsSlice(), netip.MustParseAddr("fd00::2").AsSlice()...)
	mapped := append(netip.MustParseAddr("::ffff:10.0.0.1").AsSlice(), netip.MustParseAddr("::ffff:10.0.0.2").AsSlice()...)
	first, _ := hex.DecodeString(vecs[0].BTHToEnd)
	add("FuzzICRC", "empty", []byte{}, []byte{}, uint16(1), uint16(UDPPort), uint16(0), true, uint32(0))
	add("FuzzICRC", "short-15", make([]byte, 15), []byte{}, uint16(1), uint16(UDPPort), uint16(0), true, uint32(0))
	add("FuzzICRC", "bth-only", first[:BTHLen], []byte{}, uint16(1), uint16(UDPPort), uint16(0), true, uint32(33))
	add("FuzzICRC", "ipv6", first, v6, uint16(49152), uint16(UDPPort), uint16(0), false, uint32(1000))
	add("FuzzICRC", "ipv4-mapped", first, mapped, uint16(49152), uint16(UDPPort), uint16(7), false, uint32(5))

	for target, seeds := range corpora {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := clearSeeds(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range seeds {
			if err := os.WriteFile(filepath.Join(dir, s.name), corpusFile(s.args...), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%s: %d seeds", target, len(seeds))
	}
}

// clearSeeds removes the generated seeds of a corpus directory, keeping the inputs the
// fuzzer found (named regression-*), which the generator cannot make again.
func clearSeeds(dir string) error {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "regression-") {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// weakSeed is a sealed weak-mode packet for the seed corpora.
type weakSeed struct {
	name string
	pkt  []byte // BTH to ICRC
}

// weakSeedPackets builds one packet of every weak-mode opcode, as softrnic sends them,
// sealed with the ICRC of a fixed IPv4 flow.
func weakSeedPackets() []weakSeed {
	fl := Flow{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2"), SrcPort: 49152, DstPort: UDPPort, DF: true}
	build := func(op Opcode, psn uint32, fill func(hdr []byte), payload []byte) []byte {
		info := op.Info()
		pad := PadFor(len(payload))
		pkt := make([]byte, info.HdrLen, info.HdrLen+len(payload)+pad+ICRCLen)
		(&BTH{Opcode: op, PKey: DefaultPKey, DestQP: 0x12345, PSN: psn, AckReq: true, PadCnt: uint8(pad)}).Put(pkt)
		fill(pkt)
		pkt = append(pkt, payload...)
		pkt = append(pkt, make([]byte, pad)...)
		var c [ICRCLen]byte
		PutICRC(c[:], fl.ICRC(pkt))
		return append(pkt, c[:]...)
	}
	putOOH := func(hdr []byte, o OOH) { o.Put(hdr[len(hdr)-OOHLen:]) }
	data := bytes.Repeat([]byte("weak-mode payload "), 8)
	reth := &RETH{VA: 0x7f0000001000, RKey: 0xabcd01, DMALen: 3000}
	at := &AtomicETH{VA: 0x7f0000002008, RKey: 0xabcd02, SwapAdd: 5, Compare: 7}
	return []weakSeed{
		{"send", build(OpWeakSend, 10, func(h []byte) { putOOH(h, OOH{Seq: 3, Offset: 256, Length: 1000, Flags: OOHRecv, TxSeq: 11}) }, data[:101])},
		{"send-imm", build(OpWeakSendImm, 11, func(h []byte) {
			binary.BigEndian.PutUint32(h[BTHLen:], 0xfeedface)
			putOOH(h, OOH{Seq: 4, Length: 7, Flags: OOHRecv, TxSeq: 12})
		}, data[:7])},
		{"write", build(OpWeakWrite, 12, func(h []byte) {
			reth.Put(h[BTHLen:])
			putOOH(h, OOH{Offset: 1024, Length: 3000, TxSeq: 13})
		}, data[:128])},
		{"write-imm", build(OpWeakWriteImm, PSNMask, func(h []byte) {
			reth.Put(h[BTHLen:])
			binary.BigEndian.PutUint32(h[BTHLen+RETHLen:], 42)
			putOOH(h, OOH{Seq: 5, Offset: 2048, Length: 3000, Flags: OOHRecv, TxSeq: 14})
		}, data[:9])},
		{"read-request", build(OpWeakReadReq, 13, func(h []byte) {
			reth.Put(h[BTHLen:])
			putOOH(h, OOH{Seq: 2, Length: 3000, TxSeq: 15})
		}, nil)},
		{"cmp-swap", build(OpWeakCmpSwap, 16, func(h []byte) {
			at.Put(h[BTHLen:])
			putOOH(h, OOH{Seq: 3, Length: 8, TxSeq: 16})
		}, nil)},
		{"fetch-add", build(OpWeakFetchAdd, 17, func(h []byte) {
			at.Put(h[BTHLen:])
			putOOH(h, OOH{Seq: 4, Length: 8, TxSeq: 17})
		}, nil)},
		{"ack", build(OpWeakAck, 9, func(h []byte) {
			(&AETH{Syndrome: AETHAck | NoCredits, MSN: 3}).Put(h[BTHLen:])
			PutSACKHeader(h[BTHLen+AETHLen:], 2, 17)
		}, func() []byte {
			b := make([]byte, 2*SACKRangeLen)
			PutSACKRanges(b, [][2]uint32{{11, 13}, {16, 18}})
			return b
		}())},
		{"ack-no-ranges", build(OpWeakAck, 17, func(h []byte) {
			(&AETH{Syndrome: AETHAck | NoCredits, MSN: 9}).Put(h[BTHLen:])
			PutSACKHeader(h[BTHLen+AETHLen:], 0, 17)
		}, nil)},
		{"rnr-nak", build(OpWeakAck, 9, func(h []byte) {
			(&AETH{Syndrome: AETHRNR | 1, MSN: 3}).Put(h[BTHLen:])
			PutSACKHeader(h[BTHLen+AETHLen:], 1, 12)
		}, func() []byte {
			b := make([]byte, SACKRangeLen)
			PutSACKRanges(b, [][2]uint32{{11, 12}})
			return b
		}())},
	}
}

// TestWeakSeedPackets checks the weak-mode seed packets: each decodes as its opcode with a
// valid ICRC and extension, so the seed corpora start from real packets.
func TestWeakSeedPackets(t *testing.T) {
	fl := Flow{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2"), SrcPort: 49152, DstPort: UDPPort, DF: true}
	seen := map[Opcode]bool{}
	for _, w := range weakSeedPackets() {
		var p Packet
		if err := p.Decode(w.pkt); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		if !fl.VerifyICRC(w.pkt) || p.Info.Flags&IsWeak == 0 {
			t.Fatalf("%s: ICRC or opcode %v", w.name, p.BTH.Opcode)
		}
		if p.BTH.Opcode == OpWeakAck {
			if _, err := DecodeSACK(p.Ext, p.Payload, nil); err != nil {
				t.Fatalf("%s: %v", w.name, err)
			}
		} else if _, err := DecodeOOH(p.Ext); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		seen[p.BTH.Opcode] = true
	}
	for op := OpWeakAck; op <= OpWeakFetchAdd; op++ {
		if !seen[op] {
			t.Errorf("no seed packet of %v", op)
		}
	}
}

// corpusFile encodes fuzz arguments in the "go test fuzz v1" format.
func corpusFile(args ...any) []byte {
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		case string:
			fmt.Fprintf(&b, "string(%q)\n", v)
		case bool, uint16, uint32, uint64, uint8, int:
			fmt.Fprintf(&b, "%T(%v)\n", v, v)
		default:
			panic(errors.New("corpusFile: unsupported type " + fmt.Sprintf("%T", a)))
		}
	}
	return b.Bytes()
}
