package wiretest

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/pcap"
)

// ScapyICRC has scapy (Debian's python3-scapy, an implementation nobody here wrote) check
// the ICRC of every RoCEv2 packet in the capture file over the IPv4 header it carries,
// and returns how many it checked; it fails the test for any it finds wrong. Packets to or
// from the ports given are RoCEv2 as well as port 4791's. Without python3 and scapy the
// test is skipped, or fails when CI is set (.ci/run installs them).
func ScapyICRC(t testing.TB, file string, ports ...uint16) int {
	t.Helper()
	py := scapyPython(t)
	args := []string{script("scapy_icrc.py"), file}
	for _, p := range ports {
		args = append(args, fmt.Sprint(p))
	}
	out, err := exec.Command(py, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("scapy_icrc.py: %v\n%s", err, out)
	}
	var checked, bad, v6 int
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if _, err := fmt.Sscanf(lines[len(lines)-1], "checked %d bad %d ipv6 %d", &checked, &bad, &v6); err != nil {
		t.Fatalf("scapy_icrc.py said:\n%s", out)
	}
	if bad > 0 {
		t.Errorf("scapy finds %d of %d ICRCs wrong:\n%s", bad, checked, out)
	}
	return checked
}

// scapyPython returns a python3 that has scapy, or skips the test (fails it when CI is set:
// .ci/run installs python3-scapy).
func scapyPython(t testing.TB) string {
	t.Helper()
	for _, c := range []string{"python3", "/usr/bin/python3"} { // Debian's, if another comes first in PATH
		if p, err := exec.LookPath(c); err == nil && exec.Command(p, "-c", "import scapy.contrib.roce").Run() == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("python3 with scapy is not installed (.ci/run installs python3-scapy)")
	}
	t.Skip("python3 with scapy is not installed (apt-get install python3-scapy)")
	return ""
}

// script is the path of one of this package's scripts.
func script(name string) string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), name)
}

// ScapyPacket is a RoCEv2 packet scapy built: its UDP payload (BTH to ICRC) and the IPv4
// identification its ICRC was computed with.
type ScapyPacket struct {
	Payload []byte
	IPID    uint16
}

// ScapySends has scapy (an implementation nobody here wrote) build n RC SEND ONLY requests
// from src to dst for QP destQP, PSNs from psn, payload i of 32 bytes of value i+1, each
// with its ICRC over an IPv4 header with a random nonzero identification and DF. Skipped
// like ScapyICRC without scapy.
func ScapySends(t testing.TB, src, dst netip.AddrPort, destQP, psn uint32, n int) []ScapyPacket {
	t.Helper()
	py := scapyPython(t)
	out, err := exec.Command(py, script("scapy_build.py"), src.Addr().String(), fmt.Sprint(src.Port()),
		dst.Addr().String(), fmt.Sprint(dst.Port()), fmt.Sprint(destQP), fmt.Sprint(psn), fmt.Sprint(n)).CombinedOutput()
	if err != nil {
		t.Fatalf("scapy_build.py: %v\n%s", err, out)
	}
	var pkts []ScapyPacket
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var h string
		var id uint16
		if _, err := fmt.Sscanf(line, "%s %d", &h, &id); err != nil {
			t.Fatalf("scapy_build.py said %q", line)
		}
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		pkts = append(pkts, ScapyPacket{Payload: b, IPID: id})
	}
	if len(pkts) != n {
		t.Fatalf("scapy built %d packets, want %d", len(pkts), n)
	}
	return pkts
}

// ReadCapture reads the raw-IP pcap capture in file (what a device's tap writes) and
// returns its records; it fails the test on anything else.
func ReadCapture(t testing.TB, file string) []pcap.Record {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, lt, err := pcap.ReadAll(f)
	if err != nil || lt != pcap.LinkTypeRaw {
		t.Fatalf("reading the capture %s: link type %d, %v", file, lt, err)
	}
	return recs
}
