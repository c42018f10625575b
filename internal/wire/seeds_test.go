package wire_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// The seed corpora of the fuzz targets in fuzz_test.go, and the weak-mode packets they
// start from.

// TestWriteFuzzSeeds writes the seed corpora of the fuzz targets of fuzz_test.go into
// testdata/fuzz/. It only runs with SOFTRNIC_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SOFTRNIC_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set SOFTRNIC_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	vecs := wire.LoadVectors(t)
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
		add("FuzzDecodeBTH", name, full[:wire.BTHLen])
		var p wire.Packet
		if err := p.Decode(full); err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		hl := p.Info.HdrLen
		if len(full) > hl+wire.ICRCLen {
			add("FuzzDecodePacket", name+"-hdr-only", full[:hl+wire.ICRCLen])
		}
		add("FuzzDecodePacket", name+"-one-short", full[:hl+wire.ICRCLen-1])
		if p.BTH.PadCnt == 0 && len(p.Payload) > 0 {
			bad := append([]byte{}, full...)
			bad[1] |= 0x30 // pad 3
			add("FuzzDecodePacket", name+"-pad3", bad)
		}
		switch f := p.Info.Flags; {
		case f&wire.HasRETH != 0:
			add("FuzzDecodeRETH", name, full[wire.BTHLen:wire.BTHLen+wire.RETHLen])
		case f&wire.HasAtomicETH != 0:
			add("FuzzDecodeAtomicETH", name, full[wire.BTHLen:wire.BTHLen+wire.AtomicETHLen])
		case f&wire.HasAETH != 0:
			add("FuzzDecodeAETH", name, full[wire.BTHLen:wire.BTHLen+wire.AETHLen])
		}
	}
	// Edge inputs.
	ff := bytes.Repeat([]byte{0xFF}, 64)
	for _, n := range []int{0, 1, wire.BTHLen - 1, wire.BTHLen, wire.BTHLen + wire.ICRCLen - 1, wire.BTHLen + wire.ICRCLen, wire.MaxHeaderLen + wire.ICRCLen} {
		add("FuzzDecodePacket", fmt.Sprintf("zero-%d", n), make([]byte, n))
	}
	add("FuzzDecodePacket", "ones-64", ff)
	tver := make([]byte, 32)
	tver[0], tver[1] = byte(wire.OpSendOnly), 0x01
	add("FuzzDecodePacket", "tver1", tver)
	reserved := make([]byte, 32)
	reserved[0] = 0x15
	add("FuzzDecodePacket", "reserved-opcode", reserved)
	manuf := make([]byte, 32)
	manuf[0] = 0xC0
	add("FuzzDecodePacket", "manufacturer-opcode", manuf)
	ackPay := make([]byte, wire.BTHLen+wire.AETHLen+4+wire.ICRCLen)
	ackPay[0] = byte(wire.OpAcknowledge)
	add("FuzzDecodePacket", "ack-with-payload", ackPay)
	pad := make([]byte, wire.BTHLen+1+wire.ICRCLen)
	pad[0], pad[1] = byte(wire.OpSendOnly), 0x30
	add("FuzzDecodePacket", "pad-exceeds-payload", pad)
	for name, n := range map[string]int{"FuzzDecodeBTH": wire.BTHLen, "FuzzDecodeRETH": wire.RETHLen, "FuzzDecodeAETH": wire.AETHLen, "FuzzDecodeAtomicETH": wire.AtomicETHLen} {
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
		add("FuzzDecodeBTH", name, w.pkt[:wire.BTHLen])
		var p wire.Packet
		if err := p.Decode(w.pkt); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		hl := p.Info.HdrLen
		if len(w.pkt) > hl+wire.ICRCLen {
			add("FuzzDecodePacket", name+"-hdr-only", w.pkt[:hl+wire.ICRCLen])
		}
		add("FuzzDecodePacket", name+"-one-short", w.pkt[:hl+wire.ICRCLen-1])
		if p.BTH.Opcode == wire.OpWeakAck {
			add("FuzzDecodeSACK", name, p.Ext, p.Payload, wire.SACKEcho(p.Ext))
		} else {
			add("FuzzDecodeOOH", name, p.Ext)
		}
	}
	ooh := func(seq, off, n uint32, flags uint8, tx uint32) []byte {
		b := make([]byte, wire.OOHLen)
		(&wire.OOH{Seq: wire.PSN(seq), Offset: off, Length: n, Flags: flags, TxSeq: tx}).Put(b)
		return b
	}
	add("FuzzDecodeOOH", "empty", []byte{})
	add("FuzzDecodeOOH", "one-short", ooh(1, 2, 3, wire.OOHRecv, 4)[:wire.OOHLen-1])
	add("FuzzDecodeOOH", "ones", ff[:wire.OOHLen])
	add("FuzzDecodeOOH", "max-fields", append(ooh(wire.PSNMask, ^uint32(0), ^uint32(0), wire.OOHRecv, ^uint32(0)), 0xEE))
	seqTop := ooh(5, 0, 8, 0, 1)
	seqTop[0] = 1
	add("FuzzDecodeOOH", "seq-25-bits", seqTop)
	add("FuzzDecodeOOH", "flag-2", ooh(5, 0, 8, 2, 1))
	resv := ooh(5, 0, 8, wire.OOHRecv, 1)
	resv[14] = 0x80
	add("FuzzDecodeOOH", "reserved-byte", resv)
	sack := func(echo uint32, rs ...[2]wire.PSN) ([]byte, []byte) {
		hdr := make([]byte, wire.SACKHeaderLen)
		wire.PutSACKHeader(hdr, len(rs), echo)
		pay := make([]byte, len(rs)*wire.SACKRangeLen)
		wire.PutSACKRanges(pay, rs)
		return hdr, pay
	}
	sackSeed := func(name string, hdr, pay []byte) { add("FuzzDecodeSACK", name, hdr, pay, wire.SACKEcho(hdr)+1) }
	h, pl := sack(7)
	sackSeed("none", h, pl)
	h, pl = sack(9, [2]wire.PSN{3, 5}, [2]wire.PSN{8, 100})
	sackSeed("two", h, pl)
	var many [][2]wire.PSN
	for i := wire.PSN(0); i < wire.MaxSACKRanges+1; i++ {
		many = append(many, [2]wire.PSN{10 * i, 10*i + 5})
	}
	h, pl = sack(1, many[:wire.MaxSACKRanges]...)
	sackSeed("max-ranges", h, pl)
	h, pl = sack(1, many...)
	sackSeed("too-many-ranges", h, pl)
	h, pl = sack(2, [2]wire.PSN{wire.PSNMask - 3, 4})
	sackSeed("wrap", h, pl)
	h, pl = sack(2, [2]wire.PSN{5, 5})
	sackSeed("empty-range", h, pl)
	h, pl = sack(2, [2]wire.PSN{9, 5})
	sackSeed("reversed-range", h, pl)
	h, pl = sack(2, [2]wire.PSN{0, 1 << 23})
	sackSeed("half-space", h, pl)
	h, pl = sack(2, [2]wire.PSN{0, 1<<23 - 1})
	sackSeed("just-under-half", h, pl)
	h, pl = sack(2, [2]wire.PSN{3, 5})
	pl[0] = 1
	sackSeed("top-byte-set", h, pl)
	h, pl = sack(2, [2]wire.PSN{3, 5})
	sackSeed("payload-short", h, pl[:7])
	sackSeed("payload-long", h, append(pl, 0))
	sackSeed("count-short", h[:3], pl)
	sackSeed("count-ones", ff[:wire.SACKHeaderLen], ff[:16])

	v6 := append(netip.MustParseAddr("fd00::1").AsSlice(), netip.MustParseAddr("fd00::2").AsSlice()...)
	mapped := append(netip.MustParseAddr("::ffff:10.0.0.1").AsSlice(), netip.MustParseAddr("::ffff:10.0.0.2").AsSlice()...)
	first, _ := hex.DecodeString(vecs[0].BTHToEnd)
	add("FuzzICRC", "empty", []byte{}, []byte{}, uint16(1), uint16(wire.UDPPort), uint16(0), true, uint32(0))
	add("FuzzICRC", "short-15", make([]byte, 15), []byte{}, uint16(1), uint16(wire.UDPPort), uint16(0), true, uint32(0))
	add("FuzzICRC", "bth-only", first[:wire.BTHLen], []byte{}, uint16(1), uint16(wire.UDPPort), uint16(0), true, uint32(33))
	add("FuzzICRC", "ipv6", first, v6, uint16(49152), uint16(wire.UDPPort), uint16(0), false, uint32(1000))
	add("FuzzICRC", "ipv4-mapped", first, mapped, uint16(49152), uint16(wire.UDPPort), uint16(7), false, uint32(5))

	for target, seeds := range corpora {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := wiretest.ClearSeeds(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range seeds {
			if err := os.WriteFile(filepath.Join(dir, s.name), wiretest.CorpusFile(s.args...), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%s: %d seeds", target, len(seeds))
	}
}

// weakSeed is a sealed weak-mode packet for the seed corpora.
type weakSeed struct {
	name string
	pkt  []byte // BTH to ICRC
}

// weakSeedPackets builds one packet of every weak-mode opcode, as softrnic sends them,
// sealed with the ICRC of a fixed IPv4 flow.
func weakSeedPackets() []weakSeed {
	fl := wire.Flow{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2"), SrcPort: 49152, DstPort: wire.UDPPort, DF: true}
	build := func(op wire.Opcode, psn uint32, fill func(hdr []byte), payload []byte) []byte {
		return wiretest.Build(&fl, wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: 0x12345, PSN: wire.PSN(psn), AckReq: true}, fill, payload)
	}
	putOOH := wiretest.PutOOH
	data := bytes.Repeat([]byte("weak-mode payload "), 8)
	reth := &wire.RETH{VA: 0x7f0000001000, RKey: 0xabcd01, DMALen: 3000}
	at := &wire.AtomicETH{VA: 0x7f0000002008, RKey: 0xabcd02, SwapAdd: 5, Compare: 7}
	return []weakSeed{
		{"send", build(wire.OpWeakSend, 10, func(h []byte) { putOOH(h, wire.OOH{Seq: 3, Offset: 256, Length: 1000, Flags: wire.OOHRecv, TxSeq: 11}) }, data[:101])},
		{"send-imm", build(wire.OpWeakSendImm, 11, func(h []byte) {
			binary.BigEndian.PutUint32(h[wire.BTHLen:], 0xfeedface)
			putOOH(h, wire.OOH{Seq: 4, Length: 7, Flags: wire.OOHRecv, TxSeq: 12})
		}, data[:7])},
		{"write", build(wire.OpWeakWrite, 12, func(h []byte) {
			reth.Put(h[wire.BTHLen:])
			putOOH(h, wire.OOH{Offset: 1024, Length: 3000, TxSeq: 13})
		}, data[:128])},
		{"write-imm", build(wire.OpWeakWriteImm, wire.PSNMask, func(h []byte) {
			reth.Put(h[wire.BTHLen:])
			binary.BigEndian.PutUint32(h[wire.BTHLen+wire.RETHLen:], 42)
			putOOH(h, wire.OOH{Seq: 5, Offset: 2048, Length: 3000, Flags: wire.OOHRecv, TxSeq: 14})
		}, data[:9])},
		{"read-request", build(wire.OpWeakReadReq, 13, func(h []byte) {
			reth.Put(h[wire.BTHLen:])
			putOOH(h, wire.OOH{Seq: 2, Length: 3000, TxSeq: 15})
		}, nil)},
		{"cmp-swap", build(wire.OpWeakCmpSwap, 16, func(h []byte) {
			at.Put(h[wire.BTHLen:])
			putOOH(h, wire.OOH{Seq: 3, Length: 8, TxSeq: 16})
		}, nil)},
		{"fetch-add", build(wire.OpWeakFetchAdd, 17, func(h []byte) {
			at.Put(h[wire.BTHLen:])
			putOOH(h, wire.OOH{Seq: 4, Length: 8, TxSeq: 17})
		}, nil)},
		{"ack", build(wire.OpWeakAck, 9, func(h []byte) {
			(&wire.AETH{Syndrome: wire.AETHAck | wire.NoCredits, MSN: 3}).Put(h[wire.BTHLen:])
			wire.PutSACKHeader(h[wire.BTHLen+wire.AETHLen:], 2, 17)
		}, func() []byte {
			b := make([]byte, 2*wire.SACKRangeLen)
			wire.PutSACKRanges(b, [][2]wire.PSN{{11, 13}, {16, 18}})
			return b
		}())},
		{"ack-no-ranges", build(wire.OpWeakAck, 17, func(h []byte) {
			(&wire.AETH{Syndrome: wire.AETHAck | wire.NoCredits, MSN: 9}).Put(h[wire.BTHLen:])
			wire.PutSACKHeader(h[wire.BTHLen+wire.AETHLen:], 0, 17)
		}, nil)},
		{"rnr-nak", build(wire.OpWeakAck, 9, func(h []byte) {
			(&wire.AETH{Syndrome: wire.AETHRNR | 1, MSN: 3}).Put(h[wire.BTHLen:])
			wire.PutSACKHeader(h[wire.BTHLen+wire.AETHLen:], 1, 12)
		}, func() []byte {
			b := make([]byte, wire.SACKRangeLen)
			wire.PutSACKRanges(b, [][2]wire.PSN{{11, 12}})
			return b
		}())},
	}
}

// TestWeakSeedPackets checks the weak-mode seed packets: each decodes as its opcode with a
// valid ICRC and extension, so the seed corpora start from real packets.
func TestWeakSeedPackets(t *testing.T) {
	fl := wire.Flow{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("192.0.2.2"), SrcPort: 49152, DstPort: wire.UDPPort, DF: true}
	seen := map[wire.Opcode]bool{}
	for _, w := range weakSeedPackets() {
		var p wire.Packet
		if err := p.Decode(w.pkt); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		if !fl.VerifyICRC(w.pkt) || p.Info.Flags&wire.IsWeak == 0 {
			t.Fatalf("%s: ICRC or opcode %v", w.name, p.BTH.Opcode)
		}
		if p.BTH.Opcode == wire.OpWeakAck {
			if _, err := wire.DecodeSACK(p.Ext, p.Payload, nil); err != nil {
				t.Fatalf("%s: %v", w.name, err)
			}
		} else if _, err := wire.DecodeOOH(p.Ext); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		seen[p.BTH.Opcode] = true
	}
	for op := wire.OpWeakAck; op <= wire.OpWeakFetchAdd; op++ {
		if !seen[op] {
			t.Errorf("no seed packet of %v", op)
		}
	}
}
