//go:build linux

package slurmtest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
)

// watched are the variables a program launched by Slurm may read to learn its rank, the
// job's size and identity, and its reserved ports; each test logs which are set.
var watched = []string{
	"SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS_PER_NODE",
	"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_LOCALID", "SLURM_NODEID",
	"SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_RESV_PORTS",
	"SLURM_STEP_NODELIST", "PMI_JOBID", "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMIX_NAMESPACE",
}

var envLine = regexp.MustCompile(`^(?:(\d+): )?([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)

// parseEnv reads env output, labelled with the task's rank as srun -l does ("1: K=V")
// or not (rank -1), into the variables of each rank.
func parseEnv(out string) map[int]map[string]string {
	tasks := map[int]map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		m := envLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		rank := -1
		if m[1] != "" {
			rank, _ = strconv.Atoi(m[1])
		}
		if tasks[rank] == nil {
			tasks[rank] = map[string]string{}
		}
		tasks[rank][m[2]] = m[3]
	}
	return tasks
}

// logWatched logs the watched variables of each task: a table, one row a variable.
func logWatched(t *testing.T, title string, tasks map[int]map[string]string) {
	t.Helper()
	ranks := slices.Sorted(func(yield func(int) bool) {
		for r := range tasks {
			if !yield(r) {
				return
			}
		}
	})
	var b strings.Builder
	fmt.Fprintf(&b, "%s:\n  %-26s", title, "variable")
	for _, r := range ranks {
		fmt.Fprintf(&b, " %-14s", "task "+strconv.Itoa(r))
	}
	for _, v := range watched {
		fmt.Fprintf(&b, "\n  %-26s", v)
		for _, r := range ranks {
			val, ok := tasks[r][v]
			if !ok {
				val = "-"
			}
			fmt.Fprintf(&b, " %-14s", val)
		}
	}
	t.Log(b.String())
}

// srunEnv runs srun -l args env and returns the variables of each task.
func srunEnv(t *testing.T, c *Cluster, args ...string) map[int]map[string]string {
	t.Helper()
	args = append(append([]string{"--label"}, args...), "env")
	out, err := c.Command(testutil.Context(t), "srun", args...).Output()
	if err != nil {
		t.Fatalf("srun %s: %v: %s", strings.Join(args, " "), err, stderrOf(err))
	}
	return parseEnv(string(out))
}

func stderrOf(err error) []byte {
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return ee.Stderr
	}
	return nil
}

// want checks the variables of each task: for each, the value it must have, "" for
// unset; the value may depend on the task's rank (%d in it is the rank).
func want(t *testing.T, tasks map[int]map[string]string, n int, vars map[string]string) {
	t.Helper()
	if len(tasks) != n {
		t.Fatalf("got the environment of %d tasks, want %d", len(tasks), n)
	}
	for r := range n {
		env, ok := tasks[r]
		if !ok {
			t.Fatalf("no task %d", r)
		}
		for k, v := range vars {
			if strings.Contains(v, "%d") {
				v = fmt.Sprintf(v, r)
			}
			got, set := env[k]
			switch {
			case v == "" && set:
				t.Errorf("task %d: %s=%s, want it unset", r, k, got)
			case v != "" && got != v:
				t.Errorf("task %d: %s=%q, want %q", r, k, got, v)
			}
		}
	}
}

// sameInAll checks that the variable has one value, set, in every task, and returns it.
func sameInAll(t *testing.T, tasks map[int]map[string]string, k string) string {
	t.Helper()
	v, ok := tasks[0][k]
	if !ok {
		t.Fatalf("task 0: %s unset", k)
	}
	for r, env := range tasks {
		if env[k] != v {
			t.Errorf("task %d: %s=%q, task 0 has %q", r, k, env[k], v)
		}
	}
	return v
}

// portRange parses SLURM_STEP_RESV_PORTS ("27031-27033" or "27031") into its first and
// last port.
func portRange(t *testing.T, s string) (first, last int) {
	t.Helper()
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		b = a
	}
	first, err1 := strconv.Atoi(a)
	last, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || last < first {
		t.Fatalf("SLURM_STEP_RESV_PORTS=%q: not a port range", s)
	}
	return first, last
}

func TestSrun(t *testing.T) {
	c := Start(t)
	tasks := srunEnv(t, c, "-n", "2")
	logWatched(t, "srun -n 2 env", tasks)
	want(t, tasks, 2, map[string]string{
		"SLURM_PROCID": "%d", "SLURM_LOCALID": "%d", "SLURM_NODEID": "0",
		"SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
		"SLURM_TASKS_PER_NODE": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NTASKS_PER_NODE": "",
		"SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NODELIST": c.Nodes[0],
		"PMI_RANK": "", "PMI_SIZE": "", "PMI_FD": "", "PMI_JOBID": "", "PMIX_NAMESPACE": "",
	})
	sameInAll(t, tasks, "SLURM_JOB_ID")
	// With MpiParams=ports in slurm.conf, Slurm 22.05 reserves ports for every step,
	// tasks-on-the-node + 1 of them, without --resv-ports.
	first, last := portRange(t, sameInAll(t, tasks, "SLURM_STEP_RESV_PORTS"))
	t.Logf("reserved without --resv-ports: %d ports", last-first+1)
	if first < c.ResvPorts || last >= c.ResvPorts+ResvPortCount {
		t.Errorf("reserved ports %d-%d: outside the cluster's range", first, last)
	}
}

func TestSrunOvercommit(t *testing.T) {
	c := Start(t)
	n := max(4, c.CPUs+2) // more tasks than CPUs
	tasks := srunEnv(t, c, "-n", strconv.Itoa(n), "--overcommit")
	logWatched(t, fmt.Sprintf("srun -n %d --overcommit env (%d CPUs)", n, c.CPUs), tasks)
	ns := strconv.Itoa(n)
	want(t, tasks, n, map[string]string{
		"SLURM_PROCID": "%d", "SLURM_LOCALID": "%d", "SLURM_NODEID": "0",
		"SLURM_NTASKS": ns, "SLURM_STEP_NUM_TASKS": ns, "SLURM_STEP_TASKS_PER_NODE": ns,
		"SLURM_STEP_ID": "0",
	})
}

func TestSrunPMI2(t *testing.T) {
	c := Start(t)
	tasks := srunEnv(t, c, "-n", "2", "--mpi=pmi2")
	logWatched(t, "srun -n 2 --mpi=pmi2 env", tasks)
	want(t, tasks, 2, map[string]string{
		"SLURM_PROCID": "%d", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "0",
		"PMI_RANK": "%d", "PMI_SIZE": "2", "PMIX_NAMESPACE": "",
	})
	job := sameInAll(t, tasks, "SLURM_JOB_ID")
	if got := sameInAll(t, tasks, "PMI_JOBID"); got != job+".0" {
		t.Errorf("PMI_JOBID=%q, want %q (job ID.step ID)", got, job+".0")
	}
	for r, env := range tasks {
		if _, err := strconv.Atoi(env["PMI_FD"]); err != nil {
			t.Errorf("task %d: PMI_FD=%q, want a file descriptor", r, env["PMI_FD"])
		}
	}
}

func TestSrunResvPorts(t *testing.T) {
	c := Start(t)
	tasks := srunEnv(t, c, "-n", "2", "--resv-ports=2")
	logWatched(t, "srun -n 2 --resv-ports=2 env", tasks)
	first, last := portRange(t, sameInAll(t, tasks, "SLURM_STEP_RESV_PORTS"))
	if last-first+1 != 2 || first < c.ResvPorts || last >= c.ResvPorts+ResvPortCount {
		t.Errorf("--resv-ports=2: reserved %d-%d, want 2 ports in %d-%d", first, last, c.ResvPorts, c.ResvPorts+ResvPortCount-1)
	}

	// --resv-ports without a count: in Slurm 22.05 it asks for none (the count it
	// stands for is 0), unlike no option at all (TestSrun).
	tasks = srunEnv(t, c, "-n", "2", "--resv-ports")
	logWatched(t, "srun -n 2 --resv-ports env", tasks)
	for r, env := range tasks {
		if v, ok := env["SLURM_STEP_RESV_PORTS"]; ok {
			t.Logf("task %d: --resv-ports without a count reserved %s (Slurm 22.05 reserves none)", r, v)
		}
	}
}

func TestSbatch(t *testing.T) {
	c := Start(t)
	ctx := testutil.Context(t)
	id, err := c.Sbatch(ctx, "-n", "2", "--wrap", "env; echo '== step'; srun --label env")
	if err != nil {
		t.Fatal(err)
	}
	job, err := c.WaitJob(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.JobOutput(id)
	if err != nil {
		t.Fatal(err)
	}
	if job.State != "COMPLETED" || job.ExitCode != "0:0" {
		t.Fatalf("job %s: %s, exit code %s; output:\n%s", id, job.State, job.ExitCode, out)
	}
	script, step, ok := strings.Cut(out, "== step\n")
	if !ok {
		t.Fatalf("job %s: no srun step in the output:\n%s", id, out)
	}

	// The batch script itself: a program run there, not under srun, sees the job's
	// size and SLURM_PROCID=0 although it is no task of a step; what tells it apart
	// is that no step variable is set.
	batch := parseEnv(script)
	batch = map[int]map[string]string{0: batch[-1]}
	logWatched(t, "the batch script of sbatch -n 2 (not an srun step)", batch)
	want(t, batch, 1, map[string]string{
		"SLURM_JOB_ID": id, "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_TASKS_PER_NODE": "2",
		"SLURM_STEP_ID": "", "SLURM_STEPID": "", "SLURM_STEP_NUM_TASKS": "", "SLURM_STEP_RESV_PORTS": "",
		"PMI_RANK": "",
	})

	tasks := parseEnv(step)
	logWatched(t, "srun env in the batch script of sbatch -n 2", tasks)
	want(t, tasks, 2, map[string]string{
		"SLURM_JOB_ID": id, "SLURM_PROCID": "%d", "SLURM_LOCALID": "%d", "SLURM_NTASKS": "2",
		"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
	})
}

// killScript is a task of srun -n 2: task 1 exits with status 1 at once; task 0 waits
// (a minute at most) for the file release, then says so.
const killScript = `if [ "$SLURM_PROCID" = 1 ]; then exit 1; fi
i=0; while [ ! -e release ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
[ -e release ] && echo "task 0 released"`

// srunKill starts srun -n 2 args killScript and returns it and its standard error,
// line by line.
func srunKill(t *testing.T, c *Cluster, args ...string) (*exec.Cmd, *strings.Builder, *bufio.Scanner) {
	t.Helper()
	args = append(append([]string{"-n", "2"}, args...), "sh", "-c", killScript)
	cmd := c.Command(testutil.Context(t), "srun", args...)
	stdout := new(strings.Builder)
	cmd.Stdout = stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, stdout, bufio.NewScanner(stderr)
}

func TestKillOnBadExit(t *testing.T) {
	c := Start(t)
	t.Run("default", func(t *testing.T) {
		// Without -K, a task's failure ends no other task: srun reports it, and task 0
		// runs on until it ends by itself; srun's status is the highest of the tasks'.
		os.Remove(filepath.Join(c.Dir, "release"))
		cmd, stdout, stderr := srunKill(t, c)
		var log []string
		for stderr.Scan() {
			log = append(log, stderr.Text())
			if strings.Contains(stderr.Text(), "task 1: Exited with exit code 1") {
				if err := os.WriteFile(filepath.Join(c.Dir, "release"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		err := cmd.Wait()
		t.Logf("srun -n 2 (task 1 exits 1): %v; stdout %q; stderr:\n%s", err, stdout, strings.Join(log, "\n"))
		if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() != 1 {
			t.Errorf("srun: %v, want exit status 1", err)
		}
		if !strings.Contains(stdout.String(), "task 0 released") {
			t.Errorf("task 0 did not run to its end")
		}
	})
	t.Run("K", func(t *testing.T) {
		// With -K (--kill-on-bad-exit), srun terminates the step (SIGTERM to every
		// task) when one task exits with a non-zero status.
		os.Remove(filepath.Join(c.Dir, "release"))
		cmd, stdout, stderr := srunKill(t, c, "-K")
		var log []string
		for stderr.Scan() {
			log = append(log, stderr.Text())
		}
		err := cmd.Wait()
		t.Logf("srun -K -n 2 (task 1 exits 1): %v; stdout %q; stderr:\n%s", err, stdout, strings.Join(log, "\n"))
		if ee, ok := errors.AsType[*exec.ExitError](err); !ok || ee.ExitCode() == 0 {
			t.Errorf("srun -K: %v, want a failure", err)
		}
		if strings.Contains(stdout.String(), "task 0 released") {
			t.Errorf("task 0 ran to its end under -K")
		}
		if !slices.ContainsFunc(log, func(l string) bool { return strings.Contains(l, "task 0: Terminated") }) {
			t.Errorf("srun -K did not report task 0 terminated")
		}
	})
}

// Two clusters run side by side, each with its own ports, munged and jobs.
func TestTwoClusters(t *testing.T) {
	a, b := Start(t), Start(t)
	if a.CtldPort == b.CtldPort {
		t.Fatalf("both clusters on port %d", a.CtldPort)
	}
	ctx := testutil.Context(t)
	for _, c := range []*Cluster{a, b} {
		out, err := c.Command(ctx, "srun", "-n", "1", "sh", "-c", "echo $SLURM_CONF").Output()
		if err != nil {
			t.Fatalf("srun: %v: %s", err, stderrOf(err))
		}
		if got := strings.TrimSpace(string(out)); got != c.Env()[0][len("SLURM_CONF="):] {
			t.Errorf("task's SLURM_CONF=%s, want its cluster's %s", got, c.Env()[0])
		}
	}
}

// A job still running when the test ends is killed with the cluster.
func TestStopKillsJobs(t *testing.T) {
	var c *Cluster
	t.Run("leave a job running", func(t *testing.T) {
		c = Start(t)
		ctx := testutil.Context(t)
		id, err := c.Sbatch(ctx, "-n", "1", "--wrap", "srun sh -c 'echo started; exec sleep 600'")
		if err != nil {
			t.Fatal(err)
		}
		// Wait until the step's task runs (its "started" line is in the job's output).
		ready := func() bool {
			out, _ := c.JobOutput(id)
			return strings.Contains(out, "started")
		}
		if err := c.await(ctx, "job "+id+"'s step", ready, c.daemons()...); err != nil {
			t.Fatal(err)
		}
	})
	if c == nil {
		t.Skip("no cluster")
	}
	if pids := withEnv(t, c.Env()[0]); len(pids) != 0 {
		t.Errorf("processes left with %s after the test: %v", c.Env()[0], pids)
	}
}

// withEnv lists the processes whose environment holds kv.
func withEnv(t *testing.T, kv string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err == nil && slices.Contains(strings.Split(string(env), "\x00"), kv) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestStartNodes(t *testing.T) {
	c := StartNodes(t, 2)
	// Two tasks a node, block distribution: tasks 0, 1 on node1, tasks 2, 3 on node2.
	for _, mpi := range []string{"none", "pmi2"} {
		tasks := srunEnv(t, c, "-N", "2", "-n", "4", "--mpi="+mpi)
		logWatched(t, "srun -N 2 -n 4 --mpi="+mpi+" env", tasks)
		vars := map[string]string{
			"SLURM_PROCID": "%d", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
			"SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "node[1-2]",
		}
		if mpi == "pmi2" {
			vars["PMI_RANK"], vars["PMI_SIZE"] = "%d", "4"
		}
		want(t, tasks, 4, vars)
		// Ports are reserved per node, and the nodes share this host: tasks on both
		// nodes get the same ones.
		sameInAll(t, tasks, "SLURM_STEP_RESV_PORTS")
		for r, env := range tasks {
			node, local := strconv.Itoa(r/2), strconv.Itoa(r%2)
			if env["SLURM_NODEID"] != node || env["SLURM_LOCALID"] != local || env["SLURMD_NODENAME"] != c.Nodes[r/2] {
				t.Errorf("task %d: SLURM_NODEID=%s SLURM_LOCALID=%s SLURMD_NODENAME=%s, want %s, %s, %s",
					r, env["SLURM_NODEID"], env["SLURM_LOCALID"], env["SLURMD_NODENAME"], node, local, c.Nodes[r/2])
			}
		}
	}
}

// Nodes of a network: each node's tasks are in its namespace, with its address; when
// the test ends, the namespaces and links are gone.
func TestStartNetNodes(t *testing.T) {
	var c *Cluster
	t.Run("tasks", func(t *testing.T) {
		c = StartNetNodes(t, 2)
		script := `echo "host $(hostname)"; echo "netns $(ip netns identify)"; ip -br addr`
		out, err := c.Command(testutil.Context(t), "srun", "--label", "-N", "2", "-n", "2", "sh", "-c", script).Output()
		t.Logf("srun -N 2 -n 2 (%v):\n%s", err, out)
		if err != nil {
			t.Fatalf("srun: %v: %s", err, stderrOf(err))
		}
		tasks := map[int][]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			r, text, ok := strings.Cut(line, ": ")
			rank, err := strconv.Atoi(strings.TrimSpace(r))
			if !ok || err != nil {
				t.Fatalf("%q: not a labelled line", line)
			}
			tasks[rank] = append(tasks[rank], text)
		}
		for r := range 2 {
			lines := tasks[r]
			if !slices.Contains(lines, "netns "+c.Namespaces[r]) {
				t.Errorf("task %d: not in node %d's namespace %s: %q", r, r+1, c.Namespaces[r], lines)
			}
			// ip -br addr: "eth0@if7  UP  10.78.0.1/24"; no other address of the subnet.
			var addrs []string
			for _, l := range lines {
				f := strings.Fields(l)
				if len(f) >= 3 && strings.HasPrefix(f[0], "eth0") {
					addrs = append(addrs, f[2:]...)
				}
			}
			if want := c.NodeAddrs[r].String() + "/24"; !slices.Equal(addrs, []string{want}) {
				t.Errorf("task %d: eth0 has %q, want %s", r, addrs, want)
			}
			if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "lo ") && strings.Contains(l, "127.0.0.1/8") }) {
				t.Errorf("task %d: no loopback up in its namespace: %q", r, lines)
			}
		}
	})
	if c == nil {
		t.Skip("no cluster")
	}
	ns, err := os.ReadDir("/run/netns")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range ns {
		if slices.Contains(c.Namespaces, e.Name()) {
			t.Errorf("namespace %s left after the test", e.Name())
		}
	}
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifs {
		if leftLink.MatchString(i.Name) {
			t.Errorf("link %s left after the test", i.Name)
		}
	}
	if pids := withEnv(t, c.Env()[0]); len(pids) != 0 {
		t.Errorf("processes left with %s after the test: %v", c.Env()[0], pids)
	}
}
