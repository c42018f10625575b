//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/slurmtest"

	"github.com/softrnic/softrnic/internal/testutil"
)

// The messaging layer's jobs under Slurm's own launchers, on a one-node cluster that
// slurmtest boots for each test (skipped where Slurm is not installed).

// buildRmsg builds this command for the cluster's tasks to run.
func buildRmsg(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rmsg")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// srun runs srun args... on the cluster with the extra environment env and returns its
// output (stdout and stderr) and error.
func srun(t *testing.T, ctx context.Context, c *slurmtest.Cluster, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := c.Command(ctx, "srun", args...)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	t.Logf("srun %s (%v):\n%s", strings.Join(args, " "), err, out)
	return string(out), err
}

type infoLine struct {
	Rank, Ranks, GOMAXPROCS, CPUs int
	Job, Device                   string
}

// infos reads rmsg info --json's lines, one per rank.
func infos(t *testing.T, out string) map[int]infoLine {
	t.Helper()
	m := map[int]infoLine{}
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var r infoLine
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		m[r.Rank] = r
	}
	return m
}

// Plain srun: every rank learns its rank, the step's size and the job's identity
// (job.step), and takes its share of the node's CPUs from SLURM_STEP_TASKS_PER_NODE;
// the selftest passes, on a rendezvous port drawn from the job.
func TestSrun(t *testing.T) {
	c := slurmtest.Start(t)
	bin := buildRmsg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root := []string{"SOFTRNIC_ROOT=127.0.0.1"}
	out, err := srun(t, ctx, c, root, "-n", "2", "-K", bin, "info", "--json")
	if err != nil {
		t.Fatal(err)
	}
	ranks := infos(t, out)
	if len(ranks) != 2 || ranks[0].Job == "" || ranks[0].Job != ranks[1].Job || !strings.Contains(ranks[0].Job, ".") {
		t.Errorf("the ranks under srun -n 2: %+v", ranks)
	}
	for _, r := range ranks {
		if want := max(1, r.CPUs/2); r.GOMAXPROCS != want || r.Ranks != 2 {
			t.Errorf("rank %d: GOMAXPROCS %d of %d CPUs in a job of %d; want %d, its share", r.Rank, r.GOMAXPROCS, r.CPUs, r.Ranks, want)
		}
	}
	if out, err := srun(t, ctx, c, root, "-n", "4", "-O", "-K", bin, "selftest"); err != nil || !strings.Contains(out, "selftest: 4 ranks OK") {
		t.Errorf("srun -n 4 -O rmsg selftest: %v", err)
	}
	// srun -c: the CPUs each task gets.
	out, err = srun(t, ctx, c, root, "-n", "1", "-c", "1", "-K", bin, "info", "--json")
	if r := infos(t, out)[0]; err != nil || r.GOMAXPROCS != 1 {
		t.Errorf("srun -c 1: GOMAXPROCS %d (%v), want 1", r.GOMAXPROCS, err)
	}
}

// srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE too, and the cluster's MpiParams=ports
// reserves ports for every step (SLURM_STEP_RESV_PORTS), the first of which the
// rendezvous takes: the job runs either way.
func TestSrunPMI2AndReservedPorts(t *testing.T) {
	c := slurmtest.Start(t)
	bin := buildRmsg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root := []string{"SOFTRNIC_ROOT=127.0.0.1"}
	for _, opt := range []string{"--mpi=pmi2", "--resv-ports=2"} {
		if out, err := srun(t, ctx, c, root, "-n", "2", "-K", opt, bin, "selftest"); err != nil || !strings.Contains(out, "selftest: 2 ranks OK") {
			t.Errorf("srun %s rmsg selftest: %v", opt, err)
		}
	}
}

// A job on two nodes (two slurmd on this host): each rank takes its share of its own
// node's CPUs (SLURM_STEP_TASKS_PER_NODE "2(x2)" read at its SLURM_NODEID), and the job
// runs across them.
func TestSrunTwoNodes(t *testing.T) {
	c := slurmtest.StartNodes(t, 2)
	bin := buildRmsg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root := []string{"SOFTRNIC_ROOT=127.0.0.1"}
	out, err := srun(t, ctx, c, root, "-N", "2", "-n", "4", "-O", "-K", bin, "info", "--json")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range infos(t, out) {
		if want := max(1, r.CPUs/2); r.GOMAXPROCS != want {
			t.Errorf("rank %d: GOMAXPROCS %d of %d CPUs; want %d, its share of its node's", r.Rank, r.GOMAXPROCS, r.CPUs, want)
		}
	}
	if out, err := srun(t, ctx, c, root, "-N", "2", "-n", "4", "-O", "-K", "--mpi=pmi2", bin, "selftest"); err != nil || !strings.Contains(out, "selftest: 4 ranks OK") {
		t.Errorf("srun -N 2 -n 4 rmsg selftest: %v", err)
	}
}

// A job on two nodes of a network (each node's slurmd, and its ranks, in a network
// namespace of its own, with its own address): given rank 0's node's address as the
// root, each rank takes as its device's address its node's own, the one it reaches the
// root from, and the job runs across the link between the two.
func TestSrunNetNodes(t *testing.T) {
	// The nodes' links have Ethernet's MTU, 1500: the ranks' connections take the path
	// MTU their devices' links carry (1024), not loopback's 4096.
	c := slurmtest.StartNetNodes(t, 2)
	bin := buildRmsg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Block distribution: ranks 0 and 1 on node1, where rank 0 serves the rendezvous.
	root := []string{"SOFTRNIC_ROOT=" + c.NodeAddrs[0].String()}
	out, err := srun(t, ctx, c, root, "-N", "2", "-n", "4", "-O", "-K", bin, "info", "--json")
	if err != nil {
		t.Fatal(err)
	}
	ranks := infos(t, out)
	if len(ranks) != 4 {
		t.Fatalf("%d ranks answered, want 4", len(ranks))
	}
	for r, info := range ranks {
		dev, err := netip.ParseAddrPort(info.Device)
		if want := c.NodeAddrs[r/2]; err != nil || dev.Addr() != want {
			t.Errorf("rank %d: device %q, want %v:port (node%d's address)", r, info.Device, want, r/2+1)
		}
	}
	if out, err := srun(t, ctx, c, root, "-N", "2", "-n", "4", "-O", "-K", "--mpi=pmi2", bin, "selftest"); err != nil || !strings.Contains(out, "selftest: 4 ranks OK") {
		t.Errorf("srun -N 2 -n 4 --mpi=pmi2 rmsg selftest: %v", err)
	}
}

// A batch script: srun inside it starts the job's ranks, with the script's host as the
// root; the script itself, run as a program, is a job of one rank, not rank 0 of 2.
func TestSbatch(t *testing.T) {
	c := slurmtest.Start(t)
	bin := buildRmsg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	script := fmt.Sprintf("SOFTRNIC_ROOT=$(hostname) srun -K %[1]s selftest && %[1]s info", bin)
	id, err := c.Sbatch(ctx, "-n", "2", "--wrap", script)
	if err != nil {
		t.Fatal(err)
	}
	job, err := c.WaitJob(ctx, id)
	out, _ := c.JobOutput(id)
	t.Logf("job %s: %+v, %v\n%s", id, job, err, out)
	if err != nil || job.State != "COMPLETED" {
		t.Fatalf("sbatch: %+v, %v", job, err)
	}
	if !strings.Contains(out, "selftest: 2 ranks OK") || !strings.Contains(out, "rank 0 of 1:") {
		t.Errorf("the batch job's output lacks the selftest's or the script's own rank")
	}
}

// Two steps given one rendezvous address, at once: neither takes the other's ranks;
// either both run, or one runs and the other fails at once, saying why (with -K, srun
// then ends the failed step's other ranks).
func TestSrunTwoJobsOneRoot(t *testing.T) {
	c := slurmtest.Start(t)
	bin := buildRmsg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root := []string{"SOFTRNIC_ROOT=" + testutil.FreeTCPAddr(t), "SOFTRNIC_RENDEZVOUS_TIMEOUT=10m"}
	type result struct {
		out string
		err error
	}
	done := make(chan result)
	for range 2 {
		go func() {
			out, err := srun(t, ctx, c, root, "-n", "2", "-O", "-K", bin, "selftest")
			done <- result{out, err}
		}()
	}
	ok := 0
	for range 2 {
		r := <-done
		if r.err == nil && strings.Contains(r.out, "selftest: 2 ranks OK") {
			ok++
			continue
		}
		if !strings.Contains(r.out, "refused by rank 0's rendezvous") && !strings.Contains(r.out, "another job's rank 0") {
			t.Errorf("a step failed without saying why")
		}
	}
	if ok == 0 {
		t.Error("neither step ran")
	}
}

// Without rank 0 (it fails before the rendezvous) and without -K, the other ranks end
// when the rendezvous deadline passes, saying rank 0 never answered.
func TestSrunMissingRank0(t *testing.T) {
	c := slurmtest.Start(t)
	bin := buildRmsg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env := []string{"SOFTRNIC_ROOT=127.0.0.1", "SOFTRNIC_RENDEZVOUS_TIMEOUT=2s"}
	out, err := srun(t, ctx, c, env, "-n", "3", "-O", "sh", "-c", `[ "$SLURM_PROCID" = 0 ] && exit 3; exec `+bin+` selftest`)
	if err == nil {
		t.Fatal("srun succeeded without rank 0")
	}
	if n := strings.Count(out, "did not answer"); n != 2 {
		t.Errorf("%d ranks said rank 0 did not answer, want 2", n)
	}
}

// BenchmarkSrunBandwidth measures what a rank's share of the CPUs is worth under plain
// srun: `srun -n 2 rmsg bw -s 1M` as msg sets it up (each rank's GOMAXPROCS its share of
// the node, from SLURM_STEP_TASKS_PER_NODE) against the same with GOMAXPROCS set to every
// CPU (what a rank took when only SLURM_NTASKS_PER_NODE was read), the two interleaved,
// one pair per iteration; it reports each one's median MB/s and their ratio.
//
//	SOFTRNIC_SLURM=on go test -run '^$' -bench SrunBandwidth -benchtime 5x ./cmd/rmsg/
func BenchmarkSrunBandwidth(b *testing.B) {
	c := slurmtest.Start(b)
	bin := filepath.Join(b.TempDir(), "rmsg")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	bw := func(env ...string) float64 {
		cmd := c.Command(ctx, "srun", "-n", "2", "-K", bin, "bw", "-s", "1048576", "--json")
		cmd.Env = append(cmd.Env, append(env, "SOFTRNIC_ROOT=127.0.0.1")...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("srun rmsg bw: %v\n%s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			var r struct {
				MBps float64 `json:"mb_per_s"`
			}
			if json.Unmarshal([]byte(line), &r) == nil && r.MBps > 0 {
				return r.MBps
			}
		}
		b.Fatalf("no bandwidth in:\n%s", out)
		return 0
	}
	var share, all []float64
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			share, all = append(share, bw()), append(all, bw("GOMAXPROCS="+strconv.Itoa(runtime.NumCPU())))
		} else {
			all, share = append(all, bw("GOMAXPROCS="+strconv.Itoa(runtime.NumCPU()))), append(share, bw())
		}
	}
	b.ReportMetric(median(share), "MB/s-share")
	b.ReportMetric(median(all), "MB/s-allcpus")
	b.ReportMetric(median(share)/median(all), "ratio")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
