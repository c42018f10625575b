package msg

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrNoLauncher is FromEnv's error when the environment names no launcher's rank and
// size. Init then starts a job of one rank.
var ErrNoLauncher = errors.New("msg: no launcher environment (OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID with SLURM_STEP_NUM_TASKS)")

// A launcher is how one kind of launcher tells a process its place in a job: the
// variables of its rank and of the job's size, and where it says how many of the job's
// ranks share the host and what identifies the job.
type launcher struct {
	name       string
	rank, size string
	// localSize is how many of the job's ranks run on this host (0: not said).
	localSize func() int
	// job identifies the job among the others that may run at once ("": not said).
	job func() string
}

// launchers are the launchers FromEnv knows, the innermost first: a launcher started
// inside another's job (mpirun or rmsgrun in a Slurm allocation) sets its own variables
// and leaves the outer one's in place, so the first whose rank is set is the one that
// started this process.
var launchers = []launcher{
	{name: "Open MPI", rank: "OMPI_COMM_WORLD_RANK", size: "OMPI_COMM_WORLD_SIZE",
		localSize: envInt("OMPI_COMM_WORLD_LOCAL_SIZE"),
		job:       firstEnv("PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid")},
	{name: "PMI", rank: "PMI_RANK", size: "PMI_SIZE",
		localSize: envInt("MPI_LOCALNRANKS"),
		job:       firstEnv("SOFTRNIC_JOB", "PMI_JOBID")},
	// Slurm's srun. A batch script (sbatch) sees SLURM_PROCID and SLURM_NTASKS too but
	// is no task of a step: only a step's tasks have SLURM_STEP_NUM_TASKS.
	{name: "Slurm's srun", rank: "SLURM_PROCID", size: "SLURM_STEP_NUM_TASKS",
		localSize: slurmLocalSize, job: slurmJob},
}

// slurm is the Slurm launcher, which also fills in what another launcher started by
// srun leaves unsaid (srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE but neither a local
// size nor, in every version, a job ID).
var slurm = &launchers[len(launchers)-1]

// FromEnv fills Rank, Size, LocalSize, CPUs, Job, Root, Addr and RendezvousTimeout
// from a launcher's environment where they are zero:
//
//   - Open MPI's mpirun: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//     OMPI_COMM_WORLD_LOCAL_SIZE, and the job from PMIX_NAMESPACE (or
//     OMPI_MCA_orte_ess_jobid, OMPI_MCA_ess_base_jobid);
//   - a PMI launcher (rmsgrun, MPICH's mpiexec): PMI_RANK, PMI_SIZE, MPI_LOCALNRANKS,
//     the job from SOFTRNIC_JOB or PMI_JOBID;
//   - Slurm's srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS, the tasks on this node from
//     SLURM_STEP_TASKS_PER_NODE and SLURM_NODEID, the CPUs per task from
//     SLURM_CPUS_PER_TASK (srun -c), the job from SLURM_JOB_ID and SLURM_STEP_ID. A
//     launcher that srun started fills its gaps from these.
//
// and from softrnic's own variables: SOFTRNIC_ROOT, rank 0's rendezvous (host:port; a
// host alone takes the step's first reserved port, SLURM_STEP_RESV_PORTS, or a port
// derived from the job's identity, see RootPort), SOFTRNIC_ADDR, the device's address,
// and SOFTRNIC_RENDEZVOUS_TIMEOUT (a Go duration). It fails with ErrNoLauncher if no
// launcher's rank and size are set, and with an error naming the variable if a rank is
// set without its size or a value cannot be read.
func FromEnv(c *Config) error {
	for i := range launchers {
		l := &launchers[i]
		rs, ss := os.Getenv(l.rank), os.Getenv(l.size)
		if rs == "" {
			continue
		}
		if ss == "" {
			if l == slurm {
				continue // a batch script's environment, not a step's task
			}
			return fmt.Errorf("msg: %w: %s=%q is set but %s is not: a launcher sets both", ErrInvalid, l.rank, rs, l.size)
		}
		r, err1 := strconv.Atoi(rs)
		s, err2 := strconv.Atoi(ss)
		if err1 != nil || err2 != nil || s < 1 || r < 0 || r >= s {
			return fmt.Errorf("msg: %w: %s=%q %s=%q: not a rank and a size", ErrInvalid, l.rank, rs, l.size, ss)
		}
		c.Rank, c.Size = r, s
		// The Slurm step this process is a task of, if another launcher did not start it.
		var step *launcher
		if l != slurm && os.Getenv(slurm.size) == ss && os.Getenv(slurm.rank) == rs {
			step = slurm
		}
		if c.LocalSize == 0 {
			c.LocalSize = l.localSize()
			if c.LocalSize == 0 && step != nil {
				c.LocalSize = step.localSize()
			}
		}
		if c.CPUs == 0 && (l == slurm || step != nil) {
			c.CPUs = envInt("SLURM_CPUS_PER_TASK")()
		}
		if c.Job == "" {
			c.Job = l.job()
			if c.Job == "" && step != nil {
				c.Job = step.job()
			}
		}
		return fromSoftrnicEnv(c, l == slurm || step != nil)
	}
	return ErrNoLauncher
}

// fromSoftrnicEnv reads softrnic's own variables into c; inStep says whether the
// process is a Slurm step's task (whose reserved ports a rendezvous may take).
func fromSoftrnicEnv(c *Config, inStep bool) error {
	if err := addrFromEnv(c); err != nil {
		return err
	}
	if c.RendezvousTimeout == 0 {
		if v := os.Getenv("SOFTRNIC_RENDEZVOUS_TIMEOUT"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return fmt.Errorf("msg: %w: SOFTRNIC_RENDEZVOUS_TIMEOUT=%q: not a positive duration such as 2m", ErrInvalid, v)
			}
			c.RendezvousTimeout = d
		}
	}
	if c.Root != "" || c.Size == 1 {
		return nil
	}
	root := os.Getenv("SOFTRNIC_ROOT")
	if root == "" {
		return fmt.Errorf("msg: SOFTRNIC_ROOT (the host of rank 0's rendezvous, with or without a port) is not set")
	}
	if _, _, err := net.SplitHostPort(root); err == nil {
		c.Root = root
		return nil
	}
	host := strings.TrimSuffix(strings.TrimPrefix(root, "["), "]")
	if _, err := netip.ParseAddr(host); err != nil && strings.Contains(host, ":") {
		return fmt.Errorf("msg: %w: SOFTRNIC_ROOT=%q: not host or host:port", ErrInvalid, root)
	}
	port := 0
	if inStep {
		if v := os.Getenv("SLURM_STEP_RESV_PORTS"); v != "" {
			first, _, _ := strings.Cut(v, "-")
			if p, err := strconv.Atoi(first); err == nil && p > 0 && p < 1<<16 {
				port = p
			}
		}
	}
	if port == 0 {
		if c.Job == "" {
			return fmt.Errorf("msg: SOFTRNIC_ROOT=%q has no port, and the launcher names no job to derive one from: give host:port", root)
		}
		port = RootPort(c.Job)
	}
	c.Root = net.JoinHostPort(host, strconv.Itoa(port))
	return nil
}

// RootPort is the rendezvous port of a job whose SOFTRNIC_ROOT names a host without a
// port and whose launcher reserves none: a port from 20000 to 29999 (below Linux's
// ephemeral ports) drawn from the job's identity, so that jobs started at once on one
// host almost always take different ports. When two do meet on one port, the second
// rank 0 cannot listen and fails at once, and the rendezvous refuses the other job's
// ranks (ErrRefused): no job runs with another's ranks.
func RootPort(job string) int {
	h := fnv.New32a()
	h.Write([]byte(job))
	return 20000 + int(h.Sum32()%10000)
}

// addrTowards is the address this host sends from to reach root (host:port): the
// device address a rank takes when none is given, so that the ranks of a job on several
// nodes each take their node's address on the network that reaches rank 0, and the
// ranks of a job on one host whose root is a loopback address take that. It sends
// nothing (connecting a UDP socket only picks the route). Invalid if root is unroutable.
func addrTowards(root string) netip.Addr {
	c, err := net.Dial("udp", root)
	if err != nil {
		return netip.Addr{}
	}
	defer c.Close()
	a, _ := netip.AddrFromSlice(c.LocalAddr().(*net.UDPAddr).IP)
	return a.Unmap()
}

// addrFromEnv sets c.Addr from SOFTRNIC_ADDR, unless it is set already.
func addrFromEnv(c *Config) error {
	if a := os.Getenv("SOFTRNIC_ADDR"); a != "" && !c.Addr.IsValid() {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("msg: %w: SOFTRNIC_ADDR=%q: %v", ErrInvalid, a, err)
		}
		c.Addr = ip
	}
	return nil
}

// fromEnvOrAlone fills a Config whose Size is 0: from the launcher's environment, or,
// with no launcher, as the one rank of a job of one (MPI's singleton). A Rank without a
// Size is refused: the program meant to name its place in a larger job.
func fromEnvOrAlone(c *Config) error {
	if c.Rank != 0 {
		return fmt.Errorf("msg: %w: Config.Rank is %d but Size is 0: set both, or neither to take them from the launcher", ErrInvalid, c.Rank)
	}
	err := FromEnv(c)
	if !errors.Is(err, ErrNoLauncher) {
		return err
	}
	c.Rank, c.Size = 0, 1
	return addrFromEnv(c)
}

// envInt reads a positive count from the variable v (0 if unset or not one).
func envInt(v string) func() int {
	return func() int {
		n, err := strconv.Atoi(os.Getenv(v))
		if err != nil || n < 0 {
			return 0
		}
		return n
	}
}

// firstEnv reads the first of the variables vs that is set.
func firstEnv(vs ...string) func() string {
	return func() string {
		for _, v := range vs {
			if s := os.Getenv(v); s != "" {
				return s
			}
		}
		return ""
	}
}

// slurmJob is a Slurm step's identity, "job.step" (SLURM_JOB_ID, SLURM_STEP_ID): every
// task of one srun has it, and two sruns of one allocation have different ones.
func slurmJob() string {
	job := os.Getenv("SLURM_JOB_ID")
	if job == "" {
		job = os.Getenv("SLURM_JOBID")
	}
	step := os.Getenv("SLURM_STEP_ID")
	if step == "" {
		step = os.Getenv("SLURM_STEPID")
	}
	if job == "" {
		return ""
	}
	return job + "." + step
}

// slurmLocalSize is how many of the step's tasks run on this node: SLURM_NODEID's entry
// of SLURM_STEP_TASKS_PER_NODE, which srun always sets ("2(x3),1": 2 tasks on each of
// the first three nodes, 1 on the fourth), unlike SLURM_NTASKS_PER_NODE.
func slurmLocalSize() int {
	node, err := strconv.Atoi(os.Getenv("SLURM_NODEID"))
	if err != nil {
		node = -1
	}
	return tasksOnNode(os.Getenv("SLURM_STEP_TASKS_PER_NODE"), node)
}

// tasksOnNode reads Slurm's compressed tasks-per-node list ("2(x3),1") and returns the
// count of node (0 when the list cannot be read). A node outside the list, or unknown
// (negative), gets the count every node has if all have the same, else 0.
func tasksOnNode(spec string, node int) int {
	if spec == "" {
		return 0
	}
	i, same := 0, -1
	for _, part := range strings.Split(spec, ",") {
		count, reps := part, "1"
		if k := strings.IndexByte(part, '('); k >= 0 {
			if !strings.HasPrefix(part[k:], "(x") || !strings.HasSuffix(part, ")") {
				return 0
			}
			count, reps = part[:k], part[k+2:len(part)-1]
		}
		n, err1 := strconv.Atoi(count)
		r, err2 := strconv.Atoi(reps)
		if err1 != nil || err2 != nil || n < 0 || r < 1 {
			return 0
		}
		if node >= i && node < i+r {
			return n
		}
		i += r
		if same == -1 {
			same = n
		} else if same != n {
			same = -2
		}
	}
	return max(same, 0)
}
