package mad

import (
	"bytes"
	"testing"
)

// The SIDR_REQ's and SIDR_REP's fields sit at the byte positions of IBTA Tables 119 and
// 120 (as Linux's ibta_vol1_c12.h has them; offsets below count from the start of the
// MAD, the table's plus the 24-byte common header), and the reserved bytes of the reply
// go out as zero.
func TestSIDRLayout(t *testing.T) {
	const h = HeaderLen
	req := SIDRREQ{RequestID: 0x01020304, PKey: 0xFFFF, Reserved: 0xA5A5, ServiceID: UDPServiceID(7174)}
	copy(req.PrivateData[:], "private")
	req.PrivateData[SIDRREQPrivateLen-1] = 0xEE
	var b [Size]byte
	Put(b[:], 0x55, &req)
	want := map[int][]byte{
		0: {1, ClassCM, 2, MethodSend}, 8: {0, 0, 0, 0, 0, 0, 0, 0x55}, 16: {0, 0x17},
		h + 0: {1, 2, 3, 4}, h + 4: {0xFF, 0xFF, 0xA5, 0xA5}, h + 8: {0, 0, 0, 0, 0x01, 0x11, 0x1C, 0x06},
		h + 16: []byte("private"), Size - 1: {0xEE},
	}
	check := func(what string, b []byte, want map[int][]byte) {
		t.Helper()
		for off, w := range want {
			if got := b[off : off+len(w)]; !bytes.Equal(got, w) {
				t.Errorf("%s: bytes at %d: % x, want % x", what, off, got, w)
			}
		}
	}
	check("SIDR_REQ", b[:], want)

	rep := SIDRREP{RequestID: 0x01020304, Status: SIDRReject, InfoLength: 3, QPN: 0xABCDEF, ServiceID: UDPServiceID(7174), QKey: UDPQKey}
	copy(rep.Info[:], "abc")
	copy(rep.PrivateData[:], "reply")
	rep.PrivateData[SIDRREPPrivateLen-1] = 0xEE
	Put(b[:], 0x66, &rep)
	want = map[int][]byte{
		16: {0, 0x18}, h + 0: {1, 2, 3, 4}, h + 4: {SIDRReject, 3, 0, 0}, h + 8: {0xAB, 0xCD, 0xEF, 0},
		h + 12: {0, 0, 0, 0, 0x01, 0x11, 0x1C, 0x06}, h + 20: {0x01, 0x23, 0x45, 0x67}, h + 24: []byte("abc"),
		h + 96: []byte("reply"), Size - 1: {0xEE},
	}
	check("SIDR_REP", b[:], want)

	// What the reply's decoder refuses: more additional information than the field holds.
	b[h+5] = SIDRREPInfoLen + 1
	if _, err := Decode(b[:], &SIDRREP{}); err != ErrField {
		t.Errorf("SIDR_REP with info length 73: %v", err)
	}
	if _, err := Decode(b[:], &SIDRREQ{}); err != ErrAttr {
		t.Errorf("SIDR_REP as SIDR_REQ: %v", err)
	}
}

// The UDP port space's service IDs, which SIDR resolves, apart from the TCP port space's.
func TestUDPServiceID(t *testing.T) {
	if id := UDPServiceID(7174); id != 0x0000000001111C06 {
		t.Errorf("UDPServiceID(7174) = %#x", id)
	}
	if p, ok := UDPServicePort(UDPServiceID(65535)); !ok || p != 65535 {
		t.Errorf("UDPServicePort: %d %v", p, ok)
	}
	if _, ok := UDPServicePort(ServiceID(7174)); ok {
		t.Errorf("a TCP-port-space service ID taken for UDP")
	}
	if _, ok := ServicePort(UDPServiceID(7174)); ok {
		t.Errorf("a UDP-port-space service ID taken for TCP")
	}
	if SIDRPrivateMax != 180 {
		t.Errorf("SIDRPrivateMax %d, want 180 (rdma_cm's UDP private data)", SIDRPrivateMax)
	}
}
