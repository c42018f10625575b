package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
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
	if code := run(4, "127.0.0.1", "", []string{bin, "selftest"}, &out, &errb); code != 0 {
		t.Fatalf("rmsgrun -np 4 rmsg selftest: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "[0] selftest: 4 ranks OK") {
		t.Errorf("output:\n%s", out.String())
	}
}

// Every rank of a job gets the same identity, and two jobs different ones.
func TestRmsgrunJobIdentity(t *testing.T) {
	jobs := map[string]bool{}
	for range 2 {
		var out, errb bytes.Buffer
		if code := run(3, "127.0.0.1", "", []string{"sh", "-c", `echo "job=$SOFTRNIC_JOB"`}, &out, &errb); code != 0 {
			t.Fatalf("exit %d\n%s", code, errb.String())
		}
		ids := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			_, id, _ := strings.Cut(line, "job=")
			ids[id] = true
		}
		if len(ids) != 1 || ids[""] {
			t.Fatalf("the ranks' SOFTRNIC_JOB:\n%s", out.String())
		}
		for id := range ids {
			jobs[id] = true
		}
	}
	if len(jobs) != 2 {
		t.Errorf("two jobs share an identity: %v", jobs)
	}
}

// A failing rank stops the job, and rmsgrun exits with its code.
func TestRmsgrunFailure(t *testing.T) {
	var out, errb bytes.Buffer
	start := time.Now()
	code := run(3, "127.0.0.1", "", []string{"sh", "-c", `if [ "$PMI_RANK" = 1 ]; then exit 3; fi; sleep 60`}, &out, &errb)
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
	root := testutil.FreeTCPAddr(t)
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
	// Every rank takes the job's identity from Open MPI's environment.
	cmd = exec.CommandContext(ctx, mpirun, "--oversubscribe", "-np", "2", "-x", "SOFTRNIC_ROOT="+root, bin, "info", "--json")
	cmd.Env = append(os.Environ(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	if out, err = cmd.Output(); err != nil {
		t.Fatalf("mpirun -np 2 rmsg info: %v\n%s", err, out)
	}
	jobs := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r struct{ Job string }
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		jobs[r.Job]++
	}
	if len(jobs) != 1 || jobs[""] != 0 {
		t.Errorf("the ranks' jobs under mpirun: %v", jobs)
	}
}

// Two jobs given one rendezvous address (rmsgrun -root), started at once: either both
// run (one job's rendezvous was over before the other's began), or one runs and the
// other fails at once, saying why: its rank 0 finds the port taken, or its other ranks
// are refused by the other job's rank 0; and its launcher stops the rest.
func TestTwoJobsOneRoot(t *testing.T) {
	bin := buildRmsg(t)
	root := testutil.FreeTCPAddr(t)
	t.Setenv("SOFTRNIC_RENDEZVOUS_TIMEOUT", "10m") // failing at once, not by the deadline
	type job struct {
		out, errb bytes.Buffer
		code      int
	}
	var jobs [2]job
	done := make(chan int)
	for i := range jobs {
		go func() {
			jobs[i].code = run(2, "127.0.0.1", root, []string{bin, "selftest"}, &jobs[i].out, &jobs[i].errb)
			done <- i
		}()
	}
	ok := 0
	for range jobs {
		j := &jobs[<-done]
		t.Logf("exit %d\n%s%s", j.code, j.out.String(), j.errb.String())
		if j.code == 0 {
			ok++
			continue
		}
		if s := j.errb.String(); !strings.Contains(s, "refused by rank 0's rendezvous") && !strings.Contains(s, "another job's rank 0") {
			t.Errorf("a job failed without saying why:\n%s", s)
		}
	}
	if ok == 0 {
		t.Error("neither job ran")
	}
}
