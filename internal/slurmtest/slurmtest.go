//go:build linux

package slurmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
)

// bootLimit bounds the boot (munged's socket, then the node idle in slurmctld's view):
// a second here, and a guard against a hang on a busy machine, not a timing assertion.
const bootLimit = time.Minute

// stopLimit bounds the wait for a daemon to end after SIGTERM, before SIGKILL.
const stopLimit = 10 * time.Second

// pollEvery is how often the harness asks Slurm for a node's or a job's state while it
// waits for a change (Slurm has no way to wait for one).
const pollEvery = 50 * time.Millisecond

// ResvPortCount is the number of ports in the cluster's MpiParams range, from which
// srun reserves a step's SLURM_STEP_RESV_PORTS.
const ResvPortCount = 64

// daemons are the programs the cluster runs; clients those the tests and the harness run.
var (
	daemons = []string{"slurmctld", "slurmd", "munged", "mungekey"}
	clients = []string{"srun", "sbatch", "scontrol", "sinfo", "squeue", "scancel"}
)

// Cluster is a running Slurm cluster, private to one test.
type Cluster struct {
	// Dir holds the cluster's configuration (slurm.conf), state, spool and logs; batch
	// jobs submitted with Sbatch run here and write their output here.
	Dir string
	// Nodes are the nodes' names: this host's short name for a cluster of one node
	// (Start), node1, node2 ... for several (StartNodes, StartNetNodes).
	Nodes []string
	// NodeAddrs are the nodes' addresses (slurm.conf's NodeAddr): 127.0.0.1 for every
	// node on this host's network, 10.78.0.1, 10.78.0.2 ... for nodes of their own
	// (StartNetNodes). CtldAddr is slurmctld's: 127.0.0.1, or 10.78.0.254.
	NodeAddrs []netip.Addr
	CtldAddr  netip.Addr
	// Namespaces are the nodes' network namespaces (for ip netns exec) when they have
	// their own (StartNetNodes), else nil.
	Namespaces []string
	// CPUs is each node's CPU count as Slurm sees it: all of this host's.
	CPUs int
	// CtldPort is slurmctld's TCP port, SlurmdPorts each node's slurmd's.
	CtldPort    int
	SlurmdPorts []int
	// ResvPorts is the first port of the range (ResvPortCount ports) that srun reserves
	// ports from (SLURM_STEP_RESV_PORTS).
	ResvPorts int

	t       testing.TB
	net     nodeNetwork
	conf    string
	munged  *daemon
	ctld    *daemon
	slurmds []*daemon
}

// Available says why a cluster cannot run here, or nil: it needs root and the programs
// of Debian's slurm-wlm and munge packages.
func Available() error {
	for _, p := range append(daemons, clients...) {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("slurmtest: %s not installed (apt-get install slurm-wlm munge)", p)
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("slurmtest: needs root (slurmd starts tasks as any user)")
	}
	return nil
}

// gate says why a test does not boot a cluster here, or nil; see the package comment.
func gate() error {
	switch v := os.Getenv("SOFTRNIC_SLURM"); v {
	case "on", "1", "require":
		return Available()
	case "", "off", "0":
		return errors.New("slurmtest: the tests under Slurm run with SOFTRNIC_SLURM=on (each boots a one-node cluster: about a second; needs root and slurm-wlm)")
	default:
		return fmt.Errorf("slurmtest: SOFTRNIC_SLURM=%q: want on, require or off", v)
	}
}

// Start boots a one-node cluster for t and stops it when t ends. It skips t when the
// cluster cannot run here (fails it instead under SOFTRNIC_SLURM=require), and fails t
// when the boot fails, with the daemons' logs.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return StartNodes(t, 1)
}

// StartNodes boots a cluster of n nodes on this host, as Start does one: a slurmd for
// each node (Debian's Slurm is built to run several on one host), all on 127.0.0.1 and
// each with all of its CPUs. As the nodes share the host's ports, the same reserved
// ports (SLURM_STEP_RESV_PORTS, which is per node) are given to tasks on different
// nodes: a program must not assume that a port reserved for its node is free of other
// nodes' tasks.
func StartNodes(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, hostNetwork{})
}

// StartNetNodes boots a cluster of n nodes that are nodes of a network, as StartNodes
// does on this host's: each node's slurmd, and so every task it starts, runs in a
// network namespace of its own (Namespaces), which has its loopback and the address
// 10.78.0.i/24 for node i (NodeAddrs) on a veth pair to a bridge that the cluster adds
// to this host, where slurmctld, srun and sbatch reach the nodes from 10.78.0.254. The
// nodes share everything else with this host: files (MUNGE's socket, the cluster's
// directory), processes, host name (whose address, 127.0.0.1 here, is each node's own
// loopback inside its namespace). Nothing is sent beyond the subnet: it has no route out,
// and IPv6 is off on its links.
//
// There is one such subnet on a host, so one such cluster at a time: a cluster's
// process holds a lock on a file in /run/lock while its network exists, and a second
// cluster, in this test process or another, waits until the first has stopped (a test
// must not boot two at once). The namespaces and links are named after the test
// process (slurmtest-<pid>-node<i>, stnbr<pid>, stn<pid>-<i>) and removed when the test
// ends, pass or fail; those that a killed test process left are removed by the next
// cluster to take the subnet.
//
// It needs iproute2's ip, and a kernel with network namespaces, veth and bridge links;
// the test is skipped (failed under SOFTRNIC_SLURM=require) where they are missing.
func StartNetNodes(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, &bridgedNetwork{})
}

// start boots a cluster of n nodes placed on nn.
func start(t testing.TB, n int, nn nodeNetwork) *Cluster {
	t.Helper()
	if err := gate(); err != nil {
		skipUnlessRequired(t, err)
	}
	if err := nn.available(); err != nil {
		skipUnlessRequired(t, err)
	}
	if n < 1 {
		t.Fatalf("slurmtest: a cluster of %d nodes", n)
	}
	c := &Cluster{t: t, Dir: clusterDir(t), net: nn}
	// Cleanups run last registered first: the network goes after the daemons.
	t.Cleanup(func() {
		if err := nn.teardown(); err != nil {
			t.Error(err)
		}
	})
	begin := time.Now()
	if err := nn.build(t, n); err != nil {
		if errors.Is(err, errNoNetwork) {
			skipUnlessRequired(t, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(c.stop)
	if err := c.boot(n); err != nil {
		c.logTails()
		t.Fatal(err)
	}
	where := ""
	if c.Namespaces != nil {
		where = fmt.Sprintf(" in namespaces %s", strings.Join(c.Namespaces, ","))
	}
	t.Logf("slurmtest: nodes %s (%d CPUs each) idle after %v at %v%s; slurmctld at %v port %d, slurmd ports %v, reserved ports %d-%d; SLURM_CONF=%s",
		strings.Join(c.Nodes, ","), c.CPUs, time.Since(begin).Round(time.Millisecond), c.NodeAddrs, where,
		c.CtldAddr, c.CtldPort, c.SlurmdPorts, c.ResvPorts, c.ResvPorts+ResvPortCount-1, c.conf)
	return c
}

// skipUnlessRequired skips t, saying why (err), or fails it under
// SOFTRNIC_SLURM=require.
func skipUnlessRequired(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("SOFTRNIC_SLURM") == "require" {
		t.Fatalf("SOFTRNIC_SLURM=require: %v", err)
	}
	t.Skip(err)
}

// clusterDir returns the test's temporary directory, readable and searchable by all as
// munged requires of its socket's directory, or a shorter one when the test's is too
// long for the UNIX socket paths that slurmd makes in it.
func clusterDir(t testing.TB) string {
	dir := t.TempDir()
	if len(dir) > 60 {
		d, err := os.MkdirTemp("", "slurmtest")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	// munged checks that every directory above its socket is searchable by all.
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o011 != 0o011 && strings.HasPrefix(d, os.TempDir()+"/") {
			if err := os.Chmod(d, fi.Mode().Perm()|0o055); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// boot starts munged, slurmctld and a slurmd for each of n nodes, and waits until every
// node is idle.
func (c *Cluster) boot(n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), bootLimit)
	defer cancel()
	for _, sub := range []string{"munge", "munge-key", "state", "spool", "log"} {
		if err := os.Mkdir(filepath.Join(c.Dir, sub), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(c.Dir, "munge-key"), 0o700); err != nil {
		return err
	}
	host, err := os.Hostname()
	if err != nil {
		return err
	}
	host, _, _ = strings.Cut(host, ".")
	c.Nodes = []string{host}
	if n > 1 {
		c.Nodes = nil
		for i := range n {
			c.Nodes = append(c.Nodes, "node"+strconv.Itoa(i+1))
		}
	}
	c.CPUs = nodeCPUs()
	c.CtldAddr = c.net.ctldAddr()
	for i := range n {
		c.NodeAddrs = append(c.NodeAddrs, c.net.nodeAddr(i))
		if ns := c.net.namespace(i); ns != "" {
			c.Namespaces = append(c.Namespaces, ns)
		}
	}
	base, err := freePortBlock(1 + n + ResvPortCount)
	if err != nil {
		return err
	}
	c.CtldPort = base
	for i := range n {
		c.SlurmdPorts = append(c.SlurmdPorts, base+1+i)
	}
	c.ResvPorts = base + 1 + n

	// MUNGE: a key of the cluster's own, and munged on a socket in Dir.
	key := filepath.Join(c.Dir, "munge-key", "munge.key")
	if out, err := exec.CommandContext(ctx, "mungekey", "--create", "--keyfile", key).CombinedOutput(); err != nil {
		return fmt.Errorf("slurmtest: mungekey: %v: %s", err, out)
	}
	sock := filepath.Join(c.Dir, "munge", "munge.socket")
	c.munged, err = c.startDaemon("munged", "munged", "--foreground", "--socket", sock,
		"--key-file", key, "--pid-file", filepath.Join(c.Dir, "munge", "munged.pid"),
		"--seed-file", filepath.Join(c.Dir, "munge", "munged.seed"),
		"--log-file", filepath.Join(c.Dir, "log", "munged.log"))
	if err != nil {
		return err
	}
	if err := c.await(ctx, "munged's socket", func() bool {
		conn, err := net.Dial("unix", sock)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}, c.munged); err != nil {
		return err
	}

	// Slurm.
	c.conf = filepath.Join(c.Dir, "slurm.conf")
	if err := os.WriteFile(c.conf, []byte(c.slurmConf(host, sock)), 0o644); err != nil {
		return err
	}
	// An empty plugin stack, rather than the system's /etc/slurm/plugstack.conf.d.
	if err := os.WriteFile(filepath.Join(c.Dir, "plugstack.conf"), nil, 0o644); err != nil {
		return err
	}
	if c.ctld, err = c.startDaemon("slurmctld", "slurmctld", "-D"); err != nil {
		return err
	}
	for i, node := range c.Nodes {
		if err := os.Mkdir(filepath.Join(c.Dir, "spool", node), 0o755); err != nil {
			return err
		}
		prog, args := c.net.nodeCommand(i, "slurmd", "-D", "-N", node)
		d, err := c.startDaemon("slurmd-"+node, prog, args...)
		if err != nil {
			return err
		}
		c.slurmds = append(c.slurmds, d)
	}
	want := strings.Repeat("idle\n", n)
	return c.await(ctx, "nodes "+strings.Join(c.Nodes, ",")+" idle", func() bool {
		out, err := c.Command(ctx, "sinfo", "--noheader", "--Node", "--format=%T").Output()
		return err == nil && string(out) == want
	}, c.daemons()...)
}

// daemons are the cluster's daemons that have started.
func (c *Cluster) daemons() []*daemon {
	var ds []*daemon
	for _, d := range append([]*daemon{c.munged, c.ctld}, c.slurmds...) {
		if d != nil {
			ds = append(ds, d)
		}
	}
	return ds
}

// slurmConf is the cluster's slurm.conf, for this host (host) and MUNGE on socket sock.
func (c *Cluster) slurmConf(host, sock string) string {
	d := c.Dir
	var nodes strings.Builder
	for i, node := range c.Nodes {
		fmt.Fprintf(&nodes, "NodeName=%s NodeHostname=%s NodeAddr=%v Port=%d CPUs=%d State=UNKNOWN\n",
			node, host, c.NodeAddrs[i], c.SlurmdPorts[i], c.CPUs)
	}
	return fmt.Sprintf(`# A cluster for tests (internal/slurmtest).
ClusterName=slurmtest
SlurmctldHost=%[2]s(%[9]v)
SlurmctldPort=%[3]d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%[5]s
CredType=cred/munge
StateSaveLocation=%[1]s/state
SlurmdSpoolDir=%[1]s/spool/%%n
SlurmctldPidFile=%[1]s/slurmctld.pid
SlurmdPidFile=%[1]s/slurmd-%%n.pid
SlurmctldLogFile=%[1]s/log/slurmctld.log
SlurmdLogFile=%[1]s/log/slurmd-%%n.log
PlugStackConfig=%[1]s/plugstack.conf
MailProg=/bin/true
# No cgroups: processes tracked through /proc, tasks not bound, no accounting.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
MpiParams=ports=%[6]d-%[7]d
# CPUs as the unit, and tasks may share them (srun --overcommit, sbatch -n 4 on 2 CPUs).
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# A batch job is scheduled when submitted, not up to 3 s later (batch_sched_delay's
# default). The first job after slurmctld starts still waits about 2 s.
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
KillWait=2
%[4]sPartitionName=test Nodes=%[8]s Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
`, d, host, c.CtldPort, nodes.String(), sock, c.ResvPorts, c.ResvPorts+ResvPortCount-1, strings.Join(c.Nodes, ","), c.CtldAddr)
}

// nodeCPUs is the CPU count slurmd -C reports, else runtime.NumCPU.
func nodeCPUs() int {
	out, err := exec.Command("slurmd", "-C").Output()
	if err == nil {
		if m := regexp.MustCompile(`\bCPUs=(\d+)`).FindSubmatch(out); m != nil {
			if n, err := strconv.Atoi(string(m[1])); err == nil && n > 0 {
				return n
			}
		}
	}
	return runtime.NumCPU()
}

// freePortBlock returns the first of n consecutive TCP ports that nothing listens on,
// picked at random below the kernel's ephemeral range (so that no outgoing connection
// takes one meanwhile), so that clusters in two test processes do not pick the same.
func freePortBlock(n int) (int, error) {
	lo, hi := 20000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if e, err := strconv.Atoi(f[0]); err == nil && e-n > lo {
				hi = e
			}
		}
	}
	for range 100 {
		base := lo + rand.IntN(hi-lo-n)
		free := true
		for p := base; p < base+n && free; p++ {
			l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			return base, nil
		}
	}
	return 0, fmt.Errorf("slurmtest: no %d free consecutive ports in %d-%d", n, lo, hi-1)
}

// await polls ready until it holds, failing when ctx ends or one of the daemons exits.
func (c *Cluster) await(ctx context.Context, what string, ready func() bool, ds ...*daemon) error {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for !ready() {
		for _, d := range ds {
			select {
			case <-d.done:
				return fmt.Errorf("slurmtest: waiting for %s: %s exited: %v", what, d.name, d.err)
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("slurmtest: waiting for %s: %w", what, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// Env is what a command needs in its environment to use the cluster: SLURM_CONF.
func (c *Cluster) Env() []string {
	return []string{"SLURM_CONF=" + c.conf}
}

// Command returns a command (srun, sbatch, squeue, scancel ...) that uses the cluster:
// this process's environment without the Slurm and PMI variables it may have from an
// enclosing job, plus Env; run in Dir.
func (c *Cluster) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = c.environ()
	cmd.Dir = c.Dir
	cmd.WaitDelay = stopLimit
	return cmd
}

// environ is the environment of the cluster's programs: this process's, without the
// Slurm and PMI variables it may have from an enclosing job, plus Env once the
// configuration is written (munged, started before, has no use for it; and a process
// with SLURM_CONF is one of the cluster's, that stop kills).
func (c *Cluster) environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") && !strings.HasPrefix(kv, "PMI_") && !strings.HasPrefix(kv, "PMIX_") {
			env = append(env, kv)
		}
	}
	if c.conf != "" {
		env = append(env, c.Env()...)
	}
	return env
}

// Sbatch submits a batch job (sbatch args...) and returns its ID. The job runs in Dir;
// unless args say otherwise, its output goes to OutputPath(id).
func (c *Cluster) Sbatch(ctx context.Context, args ...string) (string, error) {
	out, err := c.Command(ctx, "sbatch", append([]string{"--parsable"}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("slurmtest: sbatch %s: %v: %s", strings.Join(args, " "), err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	id, _, _ := strings.Cut(lines[len(lines)-1], ";") // "id" or "id;cluster"
	if _, err := strconv.Atoi(id); err != nil {
		return "", fmt.Errorf("slurmtest: sbatch %s: no job ID in its output: %s", strings.Join(args, " "), out)
	}
	return id, nil
}

// Job is a job's state as scontrol shows it.
type Job struct {
	ID string
	// State is the job's state: PENDING, RUNNING, COMPLETING ... and, once it has
	// ended, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY ...
	State string
	// ExitCode is "status:signal": the batch script's exit status, and the signal that
	// ended it (0 if none).
	ExitCode string
}

// Ended says whether the job has ended (its processes are gone).
func (j Job) Ended() bool {
	switch j.State {
	case "PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED",
		"REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED":
		return false
	}
	return true
}

var jobField = regexp.MustCompile(`\b(JobState|ExitCode)=(\S+)`)

// ShowJob returns the job's state.
func (c *Cluster) ShowJob(ctx context.Context, id string) (Job, error) {
	out, err := c.Command(ctx, "scontrol", "--oneliner", "show", "job", id).CombinedOutput()
	if err != nil {
		return Job{}, fmt.Errorf("slurmtest: scontrol show job %s: %v: %s", id, err, out)
	}
	j := Job{ID: id}
	for _, m := range jobField.FindAllStringSubmatch(string(out), -1) {
		switch m[1] {
		case "JobState":
			j.State = m[2]
		case "ExitCode":
			j.ExitCode = m[2]
		}
	}
	if j.State == "" {
		return Job{}, fmt.Errorf("slurmtest: scontrol show job %s: no JobState: %s", id, out)
	}
	return j, nil
}

// WaitJob waits until the job has ended and returns its final state; it fails when ctx
// ends first.
func (c *Cluster) WaitJob(ctx context.Context, id string) (Job, error) {
	var j Job
	var err error
	werr := c.await(ctx, "job "+id+" to end", func() bool {
		j, err = c.ShowJob(ctx, id)
		return err != nil || j.Ended()
	}, c.daemons()...)
	if werr != nil {
		return j, fmt.Errorf("%w (last state %s)", werr, j.State)
	}
	return j, err
}

// OutputPath is the file a batch job writes its output to by default (slurm-<id>.out
// in the directory it was submitted from, Dir).
func (c *Cluster) OutputPath(id string) string {
	return filepath.Join(c.Dir, "slurm-"+id+".out")
}

// JobOutput returns what the job wrote to OutputPath(id).
func (c *Cluster) JobOutput(id string) (string, error) {
	b, err := os.ReadFile(c.OutputPath(id))
	return string(b), err
}

// daemon is a child process of the cluster: munged, slurmctld or slurmd.
type daemon struct {
	name string
	cmd  *exec.Cmd
	log  string        // its standard output and error
	done chan struct{} // closed when it has exited
	err  error         // how it exited, once done is closed
}

// startDaemon starts the program with the cluster's configuration, its standard output
// and error going to log/<name>.out, forked with SIGKILL as parent-death signal (see
// testutil.StartWithParentDeath) so that it does not outlive a test process that is killed.
func (c *Cluster) startDaemon(name, prog string, args ...string) (*daemon, error) {
	d := &daemon{name: name, log: filepath.Join(c.Dir, "log", name+".out"), done: make(chan struct{})}
	f, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d.cmd = exec.Command(prog, args...)
	d.cmd.Env = c.environ()
	d.cmd.Dir = c.Dir
	d.cmd.Stdout, d.cmd.Stderr = f, f
	if err := testutil.StartWithParentDeath(d.cmd); err != nil {
		return nil, fmt.Errorf("slurmtest: starting %s: %v", name, err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	return d, nil
}

// stop ends the daemon: SIGTERM, then SIGKILL if it has not exited within stopLimit.
func (d *daemon) stop() {
	if d == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(stopLimit):
		d.cmd.Process.Kill()
		<-d.done
	}
}

// stop stops the cluster: slurmd and slurmctld, then every process left of its jobs
// (slurmstepd outlives slurmd by design, and with it the job's tasks), then munged.
func (c *Cluster) stop() {
	if c.t.Failed() {
		c.logTails()
	}
	for _, d := range c.slurmds {
		d.stop()
	}
	c.ctld.stop()
	if c.conf != "" {
		if err := killByEnv("SLURM_CONF=" + c.conf); err != nil {
			c.t.Error(err)
		}
	}
	c.munged.stop()
}

// killByEnv kills (SIGKILL) every process whose environment holds kv, but this one,
// until there is none left: the processes of a cluster's jobs (the slurmstepd of each
// step, the tasks, an srun in a batch script) are those with its SLURM_CONF.
func killByEnv(kv string) error {
	want := []byte(kv)
	deadline := time.Now().Add(stopLimit)
	for {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return err
		}
		found := 0
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
			if err != nil {
				continue // gone, or not ours to read
			}
			for _, v := range bytes.Split(env, []byte{0}) {
				if bytes.Equal(v, want) {
					syscall.Kill(pid, syscall.SIGKILL)
					found++
					break
				}
			}
		}
		if found == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slurmtest: %d processes with %s still there after SIGKILL", found, kv)
		}
		time.Sleep(pollEvery) // SIGKILL takes effect asynchronously
	}
}

// logTails logs the end of each log the cluster has written.
func (c *Cluster) logTails() {
	logs, _ := filepath.Glob(filepath.Join(c.Dir, "log", "*"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil || len(b) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		c.t.Logf("slurmtest: end of %s:\n%s", filepath.Base(l), strings.Join(lines, "\n"))
	}
}
