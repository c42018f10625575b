package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildRmsg builds cmd/rmsg, the job these tests launch.
func buildRmsg(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rmsg")
	out, err := exec.Command("go", "build", "-o", bin, "../rmsg").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ../rmsg: %v\n%s", err, out)
	}
	return bin
}

// rmsgrun starts 4 ranks of rmsg's selftest (every pair of ranks: eager, enlargement,
// rendezvous; collectives), all of which pass.
func TestRmsgrunSelftest(t *testing.T) {
	bin := buildRmsg(t)
	var out, errb bytes.Buffer
	if code := run(4, "127.0.0.1", []string{bin, "selftest"}, &out, &errb); code != 0 {
		t.Fatalf("rmsgrun -np 4 rmsg selftest: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "[0] selftest: 4 ranks OK") {
		t.Errorf("output:\n%s", out.String())
	}
}

// A failing rank stops the job, and rmsgrun exits with its code.
func TestRmsgrunFailure(t *testing.T) {
	var out, errb bytes.Buffer
	start := time.Now()
	code := run(3, "127.0.0.1", []string{"sh", "-c", `if [ "$PMI_RANK" = 1 ]; then exit 3; fi; sleep 60`}, &out, &errb)
	if code != 3 {
		t.Errorf("exit %d, want 3\n%s", code, errb.String())
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the other ranks were not stopped (%v)", d)
	}
}

// The same job under the real mpirun (Open MPI, Debian's openmpi-bin): ranks take their
// rank and size from OMPI_COMM_WORLD_RANK / _SIZE.
func TestMpirunSelftest(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("mpirun is not installed (.ci/run installs openmpi-bin)")
		}
		t.Skip("mpirun is not installed (apt-get install openmpi-bin)")
	}
	bin := buildRmsg(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	root := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, mpirun, "--oversubscribe", "-np", "4", "-x", "SOFTRNIC_ROOT="+root, bin, "selftest")
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mpirun -np 4 rmsg selftest: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "selftest: 4 ranks OK") {
		t.Errorf("output:\n%s", out)
	}
}
