package mad

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// fill sets every field of m to random values within its bit width.
func fill(rng *rand.Rand, m Message) {
	r8 := func(bits uint) uint8 { return uint8(rng.UintN(1 << bits)) }
	r32 := func(bits uint) uint32 { return uint32(rng.Uint64N(1 << bits)) }
	path := func(p *Path) {
		p.LocalLID, p.RemoteLID = uint16(rng.UintN(1<<16)), uint16(rng.UintN(1<<16))
		for i := range p.LocalGID {
			p.LocalGID[i], p.RemoteGID[i] = r8(8), r8(8)
		}
		p.FlowLabel, p.PacketRate, p.TrafficClass, p.HopLimit = r32(20), r8(6), r8(8), r8(8)
		p.SL, p.SubnetLocal, p.LocalACKTimeout = r8(4), rng.IntN(2) == 1, r8(5)
	}
	priv := func(b []byte) {
		for i := range b {
			b[i] = r8(8)
		}
	}
	switch m := m.(type) {
	case *REQ:
		*m = REQ{LocalCommID: r32(32), ServiceID: rng.Uint64(), LocalCAGUID: rng.Uint64(), LocalQKey: r32(32), LocalQPN: r32(24),
			ResponderResources: r8(8), LocalEECN: r32(24), InitiatorDepth: r8(8), RemoteEECN: r32(24), RemoteCMResponseTimeout: r8(5),
			TransportType: r8(2), EndToEndFlowControl: rng.IntN(2) == 1, StartingPSN: r32(24), LocalCMResponseTimeout: r8(5),
			RetryCount: r8(3), PKey: uint16(rng.UintN(1 << 16)), PathMTU: r8(4), RDCExists: rng.IntN(2) == 1, RNRRetryCount: r8(3),
			MaxCMRetries: r8(4), SRQ: rng.IntN(2) == 1, ExtendedTransportType: r8(3)}
		path(&m.Primary)
		path(&m.Alternate)
		priv(m.PrivateData[:])
	case *MRA:
		*m = MRA{LocalCommID: r32(32), RemoteCommID: r32(32), MessageMRAed: r8(2), ServiceTimeout: r8(5)}
		priv(m.PrivateData[:])
	case *REJ:
		*m = REJ{LocalCommID: r32(32), RemoteCommID: r32(32), MessageRejected: r8(2), InfoLength: uint8(rng.IntN(REJInfoLen + 1)), Reason: uint16(rng.UintN(1 << 16))}
		priv(m.Info[:])
		priv(m.PrivateData[:])
	case *REP:
		*m = REP{LocalCommID: r32(32), RemoteCommID: r32(32), LocalQKey: r32(32), LocalQPN: r32(24), LocalEECN: r32(24), StartingPSN: r32(24),
			ResponderResources: r8(8), InitiatorDepth: r8(8), TargetACKDelay: r8(5), FailoverAccepted: r8(2), EndToEndFlowControl: rng.IntN(2) == 1,
			RNRRetryCount: r8(3), SRQ: rng.IntN(2) == 1, LocalCAGUID: rng.Uint64()}
		priv(m.PrivateData[:])
	case *RTU:
		*m = RTU{LocalCommID: r32(32), RemoteCommID: r32(32)}
		priv(m.PrivateData[:])
	case *DREQ:
		*m = DREQ{LocalCommID: r32(32), RemoteCommID: r32(32), RemoteQPN: r32(24)}
		priv(m.PrivateData[:])
	case *DREP:
		*m = DREP{LocalCommID: r32(32), RemoteCommID: r32(32)}
		priv(m.PrivateData[:])
	case *SIDRREQ:
		*m = SIDRREQ{RequestID: r32(32), PKey: uint16(rng.UintN(1 << 16)), Reserved: uint16(rng.UintN(1 << 16)), ServiceID: rng.Uint64()}
		priv(m.PrivateData[:])
	case *SIDRREP:
		*m = SIDRREP{RequestID: r32(32), Status: r8(8), InfoLength: uint8(rng.IntN(SIDRREPInfoLen + 1)), QPN: r32(24), ServiceID: rng.Uint64(), QKey: r32(32)}
		priv(m.Info[:])
		priv(m.PrivateData[:])
	}
}

func messages() []func() Message {
	return []func() Message{
		func() Message { return new(REQ) }, func() Message { return new(MRA) }, func() Message { return new(REJ) },
		func() Message { return new(REP) }, func() Message { return new(RTU) }, func() Message { return new(DREQ) },
		func() Message { return new(DREP) }, func() Message { return new(SIDRREQ) }, func() Message { return new(SIDRREP) },
	}
}

// Every field of every message survives Put and Decode, and the header says what it is.
func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, mk := range messages() {
		for range 200 {
			in, out := mk(), mk()
			fill(rng, in)
			var b [Size]byte
			tid := rng.Uint64()
			Put(b[:], tid, in)
			h, err := Decode(b[:], out)
			if err != nil || h.TID != tid || h.Method != MethodSend || h.AttrID != in.Attr() {
				t.Fatalf("%v: header %+v, %v", in.Attr(), h, err)
			}
			if !equal(in, out) {
				t.Fatalf("%v: %+v decodes as %+v", in.Attr(), in, out)
			}
		}
	}
}

func equal(a, b Message) bool {
	var x, y [Size]byte
	Put(x[:], 0, a)
	Put(y[:], 0, b)
	return bytes.Equal(x[:], y[:])
}

// The REQ's fields sit at the byte and bit positions of IBTA Table 106 (offsets below
// count from the start of the MAD, the table's plus the 24-byte common header).
func TestREQLayout(t *testing.T) {
	m := REQ{LocalCommID: 0x01020304, ServiceID: ServiceID(7471), LocalQKey: 0xAABBCCDD, LocalQPN: 0xABCDEF, ResponderResources: 0x10,
		InitiatorDepth: 0x20, RemoteCMResponseTimeout: 20, TransportType: TransportRC, StartingPSN: 0x123456,
		LocalCMResponseTimeout: 0x1F, RetryCount: 7, PKey: 0xFFFF, PathMTU: 5, RNRRetryCount: 6, MaxCMRetries: 15, SRQ: true}
	m.Primary.LocalGID = GID(netip.MustParseAddr("127.0.0.1"))
	m.Primary.FlowLabel, m.Primary.PacketRate, m.Primary.SL, m.Primary.LocalACKTimeout = 0xABCDE, 0x3F, 0xF, 0x12
	copy(m.PrivateData[:], "private")
	var b [Size]byte
	Put(b[:], 0x55, &m)
	const h = HeaderLen
	want := map[int][]byte{
		0: {1, ClassCM, 2, MethodSend}, 8: {0, 0, 0, 0, 0, 0, 0, 0x55}, 16: {0, 0x10},
		h + 0: {1, 2, 3, 4}, h + 8: {0, 0, 0, 0, 0x01, 0x06, 0x1D, 0x2F}, h + 28: {0xAA, 0xBB, 0xCC, 0xDD},
		h + 32: {0xAB, 0xCD, 0xEF, 0x10}, h + 39: {0x20}, h + 43: {20 << 3}, h + 44: {0x12, 0x34, 0x56, 0xFF},
		h + 48: {0xFF, 0xFF, 5<<4 | 6, 15<<4 | 1<<3}, h + 56: {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 127, 0, 0, 1},
		h + 88: {0xAB, 0xCD, 0xE0, 0x3F}, h + 94: {0xF0, 0x12 << 3}, h + 140: []byte("private"),
	}
	for off, w := range want {
		if got := b[off : off+len(w)]; !bytes.Equal(got, w) {
			t.Errorf("bytes at %d: % x, want % x", off, got, w)
		}
	}
}

// What a decoder refuses, with the error that says why.
func TestDecodeErrors(t *testing.T) {
	var b [Size]byte
	Put(b[:], 1, &RTU{})
	if _, err := Decode(b[:Size-1], &RTU{}); err != ErrSize {
		t.Errorf("short: %v", err)
	}
	if _, err := Decode(b[:], &REP{}); err != ErrAttr {
		t.Errorf("RTU as REP: %v", err)
	}
	c := b
	c[1] = 0x81
	if _, err := Decode(c[:], &RTU{}); err != ErrVersion {
		t.Errorf("other class: %v", err)
	}
	c = b
	c[2] = 1
	if _, err := Decode(c[:], &RTU{}); err != ErrVersion {
		t.Errorf("class version 1: %v", err)
	}
	Put(b[:], 1, &REJ{InfoLength: 72})
	b[HeaderLen+9] = 73 << 1
	if _, err := Decode(b[:], &REJ{}); err != ErrField {
		t.Errorf("REJ info length 73: %v", err)
	}
}

// The rdma_cm addressing header, IPv4 and IPv6, and the TCP port space's service IDs.
func TestCMAHeader(t *testing.T) {
	for _, h := range []CMAHeader{
		{SrcPort: 4791, Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2")},
		{SrcPort: 1, Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2")},
	} {
		var b [CMAHeaderLen]byte
		h.Put(b[:])
		got, err := DecodeCMAHeader(b[:])
		if err != nil || got != h {
			t.Errorf("%+v: %+v, %v", h, got, err)
		}
	}
	var b [CMAHeaderLen]byte
	(&CMAHeader{SrcPort: 0x1234, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")}).Put(b[:])
	if want := []byte{0, 0x40, 0x12, 0x34}; !bytes.Equal(b[:4], want) || b[19] != 1 || b[35] != 2 || b[15] != 0 {
		t.Errorf("IPv4 header % x", b)
	}
	b[1] = 0x50
	if _, err := DecodeCMAHeader(b[:]); err != ErrCMAHeader {
		t.Errorf("IP version 5: %v", err)
	}
	if p, ok := ServicePort(ServiceID(18515)); !ok || p != 18515 || ServiceID(1) != 0x0000000001060001 {
		t.Errorf("service ID")
	}
	if _, ok := ServicePort(0x0000000001070001); ok {
		t.Errorf("another port space taken for TCP")
	}
}

// FuzzDecodeCM: no input makes a decoder panic; whatever a decoder accepts re-encodes to
// a MAD that decodes to the same message.
func FuzzDecodeCM(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, mk := range messages() {
		m := mk()
		fill(rng, m)
		var b [Size]byte
		Put(b[:], 9, m)
		f.Add(b[:])
	}
	f.Add(make([]byte, Size))
	f.Add([]byte{1, 7, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = DecodeHeader(b)
		_, _ = DecodeCMAHeader(b)
		for _, mk := range messages() {
			m := mk()
			h, err := Decode(b, m)
			if err != nil {
				continue
			}
			var again [Size]byte
			Put(again[:], h.TID, m)
			m2 := mk()
			if _, err := Decode(again[:], m2); err != nil || !equal(m, m2) {
				t.Fatalf("%v re-encodes to something else (%v)", m.Attr(), err)
			}
		}
	})
}

// The incarnation rides after ClassPortInfo's 72 bytes, in the reserved tail: a Get or
// GetResp without it reads as carrying none, and the attribute's fields are untouched.
func TestIncarnation(t *testing.T) {
	var b [Size]byte
	PutClassPortInfoResp(b[:], 5, 16)
	if _, ok := Incarnation(b[:]); ok {
		t.Fatal("a plain GetResp carries an incarnation")
	}
	plain := b
	PutIncarnation(b[:], 0x1234567890abcdef)
	if inc, ok := Incarnation(b[:]); !ok || inc != 0x1234567890abcdef {
		t.Fatalf("Incarnation = %#x, %v", inc, ok)
	}
	if !bytes.Equal(b[:incarnationOff], plain[:incarnationOff]) {
		t.Error("PutIncarnation changed the header or the ClassPortInfo attribute")
	}
	if _, ok := Incarnation(b[:100]); ok {
		t.Error("a short MAD read as carrying an incarnation")
	}
}
