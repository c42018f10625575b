package wiretest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Tshark writes frames (see Frame) to a pcap file and returns a function that runs
// Wireshark's tshark over it with args and returns its output (see TsharkFile).
func Tshark(t testing.TB, frames [][]byte, decodeAs ...uint16) func(args ...string) string {
	t.Helper()
	var pcap bytes.Buffer
	if err := WritePCAP(&pcap, frames); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "capture.pcap")
	if err := os.WriteFile(file, pcap.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return TsharkFile(t, file, decodeAs...)
}

// TsharkFile returns a function that runs Wireshark's tshark over the capture in file with
// args and returns its output. UDP port 4791 is decoded as RoCEv2 (InfiniBand), and so
// are the ports in decodeAs (devices on ephemeral ports). Without tshark the test is
// skipped, or fails when CI is set (.ci/run installs it).
func TsharkFile(t testing.TB, file string, decodeAs ...uint16) func(args ...string) string {
	t.Helper()
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("tshark is not installed (.ci/run installs it)")
		}
		t.Skip("tshark is not installed (apt-get install tshark)")
	}
	base := []string{"-n", "-r", file}
	// What a SEND carries is the application's: Wireshark's guesses at upper-layer
	// protocols in it (RPC-over-RDMA, iSER, NVMe, SMB Direct...) find random bytes
	// "malformed". The transport is what is checked here.
	for _, h := range payloadProtocols {
		base = append(base, "--disable-protocol", h)
	}
	for _, p := range decodeAs {
		base = append(base, "-d", fmt.Sprintf("udp.port==%d,infiniband", p))
	}
	return func(args ...string) string {
		t.Helper()
		cmd := exec.Command(tshark, append(base[:len(base):len(base)], args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("tshark %v: %v\n%s", args, err, stderr.Bytes())
		}
		return string(out)
	}
}

// NoMalformed fails the test if tshark finds a malformed packet or a warning in the
// capture run reads.
func NoMalformed(t testing.TB, run func(args ...string) string) {
	t.Helper()
	if out := run("-Y", "_ws.malformed || _ws.expert.severity >= warning"); strings.TrimSpace(out) != "" {
		t.Errorf("tshark finds malformed packets:\n%s", out)
	}
}

// payloadProtocols are the protocols whose dissectors guess at what an InfiniBand payload
// carries (tshark -G heuristic-decodes).
var payloadProtocols = []string{"smc", "smb_direct", "rpcordma", "nvme-rdma", "lnet", "iser",
	"eoib", "infiniband_sdp", "fcoib"}
