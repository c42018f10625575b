package perf

import (
	"encoding/binary"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
	"github.com/softrnic/softrnic/verbs"
)

// TestSuiteCapture runs every test of the suite, short, with the client's packets
// captured (rperf --pcap), and has implementations nobody here wrote read the capture:
// scapy finds every packet's ICRC right over the IPv4 header it carries (GSO segments
// with their identifications), and tshark's InfiniBand dissector finds nothing malformed.
// (Without UDP GSO, as on systems other than Linux, every packet goes alone, with
// identification 0.)
func TestSuiteCapture(t *testing.T) {
	file := filepath.Join(t.TempDir(), "suite.pcap")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	capture, err := verbs.NewPacketCapture(f, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, test := range Tests {
		if raceSkips(test) {
			continue
		}
		c := Config{Test: test, Iters: 50, Capture: capture}
		if test == "write_bw" || test == "read_bw" {
			c.Size = 256 << 10 // several packets per message: GSO batches
		}
		if _, err := RunLoopback(c, DefaultAddrs, false); err != nil {
			t.Fatalf("%s: %v", test, err)
		}
	}
	if err := capture.Close(); err != nil {
		t.Fatal(err)
	}
	if capture.Dropped() != 0 {
		t.Fatalf("%d packets did not fit the capture", capture.Dropped())
	}
	recs := wiretest.ReadCapture(t, file)
	ports := map[uint16]bool{}
	segments := 0
	for _, r := range recs {
		ports[binary.BigEndian.Uint16(r.Data[20:])] = true
		ports[binary.BigEndian.Uint16(r.Data[22:])] = true
		if binary.BigEndian.Uint16(r.Data[4:]) != 0 {
			segments++
		}
	}
	if segments == 0 && systemGSO(t) {
		t.Error("no packet with a nonzero IPv4 identification: no GSO batch in the capture")
	}
	var decode []uint16
	for p := range ports {
		decode = append(decode, p)
	}
	wiretest.NoMalformed(t, wiretest.TsharkFile(t, file, decode...))
	if n := wiretest.ScapyICRC(t, file); n != len(recs) {
		t.Errorf("scapy checked %d of %d packets", n, len(recs))
	}
	t.Logf("%d packets, %d of them GSO segments after the first of their batch", len(recs), segments)
}

// systemGSO reports whether a UDP socket here sends with GSO (Linux's do; netio's portable
// path, which other systems take, does not).
func systemGSO(t *testing.T) bool {
	c, err := netio.Listen(netio.Config{Local: netip.MustParseAddrPort("127.0.0.1:0")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.GSO()
}
