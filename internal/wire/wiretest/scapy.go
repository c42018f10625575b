package wiretest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// ScapyICRC has scapy (Debian's python3-scapy, an implementation nobody here wrote) check
// the ICRC of every RoCEv2 packet in the capture file over the IPv4 header it carries,
// and returns how many it checked; it fails the test for any it finds wrong. Packets to or
// from the ports given are RoCEv2 as well as port 4791's. Without python3 and scapy the
// test is skipped, or fails when CI is set (.ci/run installs them).
func ScapyICRC(t testing.TB, file string, ports ...uint16) int {
	t.Helper()
	py := ""
	for _, c := range []string{"python3", "/usr/bin/python3"} { // Debian's, if another comes first in PATH
		if p, err := exec.LookPath(c); err == nil && exec.Command(p, "-c", "import scapy.contrib.roce").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("python3 with scapy is not installed (.ci/run installs python3-scapy)")
		}
		t.Skip("python3 with scapy is not installed (apt-get install python3-scapy)")
	}
	_, self, _, _ := runtime.Caller(0)
	args := []string{filepath.Join(filepath.Dir(self), "scapy_icrc.py"), file}
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
