package wire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
)

type icrcVector struct {
	Name       string `json:"name"`
	IPVersion  int    `json:"ip_version"`
	IPSrc      string `json:"ip_src"`
	IPDst      string `json:"ip_dst"`
	IPID       uint16 `json:"ip_id"`
	IPFlagsDF  bool   `json:"ip_flags_df"`
	UDPSport   uint16 `json:"udp_sport"`
	UDPDport   uint16 `json:"udp_dport"`
	BTHToEnd   string `json:"bth_to_end_hex"`
	ICRCWire   string `json:"icrc_wire_hex"`
	IPv4Packet string `json:"ipv4_packet_hex"`
}

func loadVectors(t testing.TB) []icrcVector {
	t.Helper()
	raw, err := os.ReadFile("testdata/roce-icrc-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Vectors []icrcVector `json:"vectors"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Vectors) == 0 {
		t.Fatal("no vectors")
	}
	return f.Vectors
}

// TestICRCVectors checks the ICRC against every vector made by an independent
// implementation (scapy.contrib.roce), and that each vector's packet decodes to the
// opcode its name says.
func TestICRCVectors(t *testing.T) {
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			pkt, err := hex.DecodeString(v.BTHToEnd)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := hex.DecodeString(v.ICRCWire)
			f := Flow{
				Src: netip.MustParseAddr(v.IPSrc), Dst: netip.MustParseAddr(v.IPDst),
				SrcPort: v.UDPSport, DstPort: v.UDPDport, IPID: v.IPID, DF: v.IPFlagsDF,
			}
			var got [4]byte
			PutICRC(got[:], f.ICRC(pkt))
			if !bytes.Equal(got[:], want) {
				t.Fatalf("ICRC %x, want %x", got, want)
			}
			full := append(append([]byte{}, pkt...), want...)
			if !f.VerifyICRC(full) {
				t.Fatal("VerifyICRC rejected a good packet")
			}
			// The whole IPv4 packet must end with our transport bytes.
			ip, _ := hex.DecodeString(v.IPv4Packet)
			if !bytes.HasSuffix(ip, full) {
				t.Fatal("vector's IPv4 packet does not end with BTH..ICRC")
			}
			var p Packet
			if err := p.Decode(full); err != nil {
				t.Fatalf("decode: %v", err)
			}
			name := strings.TrimPrefix(v.Name, "RC_")
			name = strings.ReplaceAll(name, "_WITH_IMM", "_WITH_IMMEDIATE")
			name = strings.ReplaceAll(name, "RDMA_READ_REQUEST", "RDMA_READ_REQUEST")
			name = strings.ReplaceAll(name, "CMP_SWAP", "COMPARE_SWAP")
			if p.BTH.Opcode.String() != name {
				t.Fatalf("opcode %v, vector %s", p.BTH.Opcode, v.Name)
			}
			// Scatter form gives the same value.
			hl := p.Info.HdrLen
			pad := int(p.BTH.PadCnt)
			parts := [][]byte{pkt[hl : len(pkt)-pad]}
			if f.ICRCParts(pkt[:hl], parts, pkt[len(pkt)-pad:]) != f.ICRC(pkt) {
				t.Fatal("ICRCParts differs from ICRC")
			}
			// Any flipped bit is caught.
			for i := 0; i < len(full)*8; i += 7 {
				c := append([]byte{}, full...)
				c[i/8] ^= 1 << (i % 8)
				if i/8 == 4 { // masked BTH byte (FECN/BECN/reserved)
					continue
				}
				if f.VerifyICRC(c) {
					t.Fatalf("bit %d flipped, ICRC still verifies", i)
				}
			}
		})
	}
}

func TestHeadersRoundTrip(t *testing.T) {
	h := BTH{Opcode: OpWriteFirst, SE: true, PadCnt: 3, PKey: 0xFFFF, FECN: true, DestQP: 0xABCDEF, AckReq: true, PSN: 0xFFFFFE}
	var b [BTHLen]byte
	h.Put(b[:])
	g, err := DecodeBTH(b[:])
	if err != nil || g != h {
		t.Fatalf("BTH round trip: %+v %v", g, err)
	}
	r := RETH{VA: 0x1122334455667788, RKey: 0xdeadbeef, DMALen: 1 << 30}
	var rb [RETHLen]byte
	r.Put(rb[:])
	if g, _ := DecodeRETH(rb[:]); g != r {
		t.Fatal("RETH round trip")
	}
	a := AETH{Syndrome: AETHNak | NakRemoteAccessError, MSN: 0x123456}
	var ab [AETHLen]byte
	a.Put(ab[:])
	if g, _ := DecodeAETH(ab[:]); g != a {
		t.Fatal("AETH round trip")
	}
	at := AtomicETH{VA: 8, RKey: 9, SwapAdd: 10, Compare: 11}
	var atb [AtomicETHLen]byte
	at.Put(atb[:])
	if g, _ := DecodeAtomicETH(atb[:]); g != at {
		t.Fatal("AtomicETH round trip")
	}
}

func TestDecodeErrors(t *testing.T) {
	var p Packet
	if p.Decode(make([]byte, 10)) != ErrShort {
		t.Fatal("short")
	}
	b := make([]byte, 16)
	b[0] = 0x15 // reserved opcode
	if p.Decode(b) != ErrOpcode {
		t.Fatal("reserved opcode accepted")
	}
	b[0] = byte(OpAcknowledge)
	b[1] = 0x01 // TVer 1
	if p.Decode(b) != ErrTVer {
		t.Fatal("tver")
	}
	b[1] = 0
	if p.Decode(b) != ErrShort { // ACK needs an AETH
		t.Fatal("ack without AETH")
	}
	b = make([]byte, BTHLen+AETHLen+4+ICRCLen)
	b[0] = byte(OpAcknowledge)
	if p.Decode(b) != ErrNoPayload {
		t.Fatal("payload on ACK accepted")
	}
	b = make([]byte, BTHLen+1+ICRCLen)
	b[0] = byte(OpSendOnly)
	b[1] = 0x30 // pad 3 but only 1 byte
	if p.Decode(b) != ErrPad {
		t.Fatal("pad")
	}
}

func TestPSN(t *testing.T) {
	if PSN(0xFFFFFF).Add(2) != 1 {
		t.Fatal("wrap")
	}
	if PSN(1).Diff(0xFFFFFF) != 2 || PSN(0xFFFFFF).Diff(1) != -2 {
		t.Fatal("diff across wrap")
	}
	if !PSN(0xFFFFF0).Before(3) || PSN(3).Before(0xFFFFF0) {
		t.Fatal("before across wrap")
	}
	if !PSN(0xFFFFFE).InWindow(0xFFFFFD, 4) || !PSN(1).InWindow(0xFFFFFD, 5) || PSN(2).InWindow(0xFFFFFD, 5) || PSN(0xFFFFFC).InWindow(0xFFFFFD, 5) {
		t.Fatal("window across wrap")
	}
	if AckTimeout(14).Microseconds() != 67108 || AckTimeout(0) != 0 {
		t.Fatal("ack timeout", AckTimeout(14))
	}
	if RNRTimer(0).Milliseconds() != 655 || RNRTimer(12).Microseconds() != 640 {
		t.Fatal("rnr timer")
	}
	if MTUBytes(MTU4096) != 4096 || MTUBytes(MTU256) != 256 || MTUBytes(0) != 0 || MTUBytes(6) != 0 {
		t.Fatal("mtu")
	}
}

// TestICRCAnyIdentification checks that a receiver recovers the IPv4 identification of
// every vector (scapy.contrib.roce computed their ICRCs with identifications softrnic did
// not choose) from the ICRC, and that SegmentICRC gives what the ICRC computed with the
// identification gives.
func TestICRCAnyIdentification(t *testing.T) {
	nonzero := 0
	for _, v := range loadVectors(t) {
		pkt, _ := hex.DecodeString(v.BTHToEnd)
		want, _ := hex.DecodeString(v.ICRCWire)
		full := append(append([]byte{}, pkt...), want...)
		f := Flow{Src: netip.MustParseAddr(v.IPSrc), Dst: netip.MustParseAddr(v.IPDst),
			SrcPort: v.UDPSport, DstPort: v.UDPDport, DF: v.IPFlagsDF, IPID: 12345} // IPID is ignored
		id, ok := f.VerifyICRCAnyID(full)
		if !ok || id != v.IPID {
			t.Errorf("%s: VerifyICRCAnyID = %d, %v; the packet's identification is %d", v.Name, id, ok, v.IPID)
		}
		if v.IPID != 0 {
			nonzero++
		}
		// From identification 0 to the vector's, as a GSO segment's trailer is made.
		f.IPID = 0
		var tr [4]byte
		PutICRC(tr[:], f.ICRC(pkt))
		SegmentICRC(tr[:], len(full), v.IPID)
		if !bytes.Equal(tr[:], want) {
			t.Errorf("%s: SegmentICRC to identification %d: %x, want %x", v.Name, v.IPID, tr, want)
		}
	}
	if nonzero == 0 {
		t.Fatal("no vector with a nonzero identification")
	}
}

// TestICRCAnyIdentificationCorruption flips bits of packets with random identifications:
// with 16 bits left for checking, about one corruption in 65,536 may pass.
func TestICRCAnyIdentificationCorruption(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	f := Flow{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 0xC123, DstPort: UDPPort, DF: true}
	passed, trials := 0, 0
	for i := 0; i < 200; i++ {
		pkt := make([]byte, BTHLen+16+rng.IntN(4096)+ICRCLen)
		for j := range pkt {
			pkt[j] = byte(rng.Uint32())
		}
		f.IPID = uint16(rng.Uint32())
		n := len(pkt) - ICRCLen
		PutICRC(pkt[n:], f.ICRC(pkt[:n]))
		if id, ok := f.VerifyICRCAnyID(pkt); !ok || id != f.IPID {
			t.Fatalf("packet %d (%d bytes, identification %d): %d, %v", i, len(pkt), f.IPID, id, ok)
		}
		for k := 0; k < 50; k++ {
			c := append([]byte(nil), pkt...)
			b := rng.IntN(len(c) * 8)
			if b/8 == 4 { // the masked BTH byte
				continue
			}
			c[b/8] ^= 1 << (b % 8)
			trials++
			if _, ok := f.VerifyICRCAnyID(c); ok {
				passed++
			}
		}
	}
	if passed > 2 {
		t.Errorf("%d of %d corrupted packets passed", passed, trials)
	}
	t.Logf("%d of %d corrupted packets passed", passed, trials)
}

func BenchmarkVerifyICRCAnyID(b *testing.B) {
	f := Flow{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 0xC123, DstPort: UDPPort, DF: true, IPID: 4242}
	pkt := make([]byte, BTHLen+4096+ICRCLen)
	n := len(pkt) - ICRCLen
	PutICRC(pkt[n:], f.ICRC(pkt[:n]))
	idTables()
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		if _, ok := f.VerifyICRCAnyID(pkt); !ok {
			b.Fatal("rejected")
		}
	}
}

// crcSmall agrees with hash/crc32 at every length and starting value.
func TestCRCSmall(t *testing.T) {
	b := make([]byte, 100)
	for i := range b {
		b[i] = byte(i*37 + 11)
	}
	for n := 0; n <= len(b); n++ {
		for _, init := range []uint32{0, 0xDEADBEEF} {
			if got, want := crcSmall(init, b[:n]), crc32.Update(init, crc32.IEEETable, b[:n]); got != want {
				t.Fatalf("length %d from %#x: %#x, want %#x", n, init, got, want)
			}
		}
	}
}

// BenchmarkICRCHeader is the ICRC of a packet with no payload (an ACK, a READ request):
// the pseudo-header is all of it.
func BenchmarkICRCHeader(b *testing.B) {
	f := Flow{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 0xC123, DstPort: UDPPort, DF: true}
	pkt := make([]byte, BTHLen+RETHLen)
	b.Run("uncached", func(b *testing.B) {
		for b.Loop() {
			_ = f.ICRC(pkt)
		}
	})
	// With a PrefixCache, as a QP sends and a receive queue verifies.
	b.Run("cached", func(b *testing.B) {
		var pc PrefixCache
		for b.Loop() {
			_ = f.icrc(&pc, pkt)
		}
	})
}

// A PrefixCache gives the ICRC computed without one, whatever flows and lengths follow one
// another through it: IPv4, IPv6 and IPv4-mapped flows, another port, another
// identification or DF, another length, and the same again (a hit).
func TestPrefixCache(t *testing.T) {
	flows := []Flow{
		{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 0xC123, DstPort: UDPPort, DF: true},
		{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 0xC124, DstPort: UDPPort, DF: true},
		{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 0xC123, DstPort: UDPPort, DF: true, IPID: 7},
		{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 0xC123, DstPort: UDPPort},
		{Src: netip.MustParseAddr("::ffff:127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 0xC123, DstPort: UDPPort, DF: true},
		{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), SrcPort: 0xC123, DstPort: UDPPort},
	}
	var pc PrefixCache
	r := rand.New(rand.NewPCG(3, 4))
	pay := make([]byte, 5000)
	for i := range pay {
		pay[i] = byte(r.Uint32())
	}
	for round := range 3 {
		for fi := range flows {
			for _, n := range []int{0, 8, 1024, 4096, 4096, 13} {
				hdr := make([]byte, BTHLen+RETHLen)
				for i := range hdr {
					hdr[i] = byte(r.Uint32())
				}
				f := &flows[fi]
				want := f.ICRCParts(hdr, [][]byte{pay[:n]}, nil)
				if got := f.ICRCPartsCached(&pc, hdr, [][]byte{pay[:n]}, nil); got != want {
					t.Fatalf("round %d flow %d length %d: cached %#x, want %#x", round, fi, n, got, want)
				}
				pkt := append(append([]byte(nil), hdr...), pay[:n]...)
				if got := f.icrc(&pc, pkt); got != want {
					t.Fatalf("round %d flow %d length %d: icrc with cache %#x, want %#x", round, fi, n, got, want)
				}
			}
		}
	}
}
