package msg

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestTasksOnNode(t *testing.T) {
	for _, c := range []struct {
		spec string
		node int
		want int
	}{
		{"2", 0, 2},
		{"2", -1, 2},       // node unknown: every node has 2
		{"4(x2)", 1, 4},    // two nodes of 4
		{"2(x3),1", 2, 2},  // three nodes of 2, one of 1
		{"2(x3),1", 3, 1},  //
		{"2(x3),1", -1, 0}, // unknown node, counts differ
		{"2(x3),1", 9, 0},  // past the list
		{"3,3", 7, 3},      // past the list, every node alike
		{"", 0, 0},         // not a step
		{"2(3)", 0, 0},     // unreadable
		{"x", 0, 0},        //
		{"2(x0)", 0, 0},    //
		{"1(x1000),2", 1000, 2},
	} {
		if got := tasksOnNode(c.spec, c.node); got != c.want {
			t.Errorf("tasksOnNode(%q, %d) = %d, want %d", c.spec, c.node, got, c.want)
		}
	}
}

// setEnv sets the variables kv ("NAME=value", ...) for the test, after clearing every
// launcher variable.
func setEnv(t *testing.T, kv ...string) {
	t.Helper()
	clearLauncher(t)
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		t.Setenv(k, v)
	}
}

// FromEnv reads each launcher's environment as that launcher sets it (the variables
// recorded from Slurm 22.05's srun and sbatch, Open MPI's mpirun, rmsgrun).
func TestFromEnvLaunchers(t *testing.T) {
	srun := []string{"SLURM_JOB_ID=50", "SLURM_STEP_ID=0", "SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_STEP_NUM_TASKS=4",
		"SLURM_STEP_TASKS_PER_NODE=4", "SLURM_NODEID=0", "SLURM_LOCALID=1"}
	for _, c := range []struct {
		name string
		env  []string
		want Config
	}{
		{"plain srun -n 4", append(srun, "SOFTRNIC_ROOT=10.0.0.1:29500"),
			Config{Rank: 1, Size: 4, LocalSize: 4, Job: "50.0", Root: "10.0.0.1:29500"}},
		{"srun, root without a port", append(srun, "SOFTRNIC_ROOT=10.0.0.1"),
			Config{Rank: 1, Size: 4, LocalSize: 4, Job: "50.0", Root: "10.0.0.1:" + strconv.Itoa(RootPort("50.0"))}},
		{"srun --resv-ports, root without a port", append(srun, "SOFTRNIC_ROOT=node1", "SLURM_STEP_RESV_PORTS=12000-12001"),
			Config{Rank: 1, Size: 4, LocalSize: 4, Job: "50.0", Root: "node1:12000"}},
		{"srun on two nodes of 2 and one of 1", []string{"SLURM_JOB_ID=7", "SLURM_STEP_ID=3", "SLURM_PROCID=4", "SLURM_STEP_NUM_TASKS=5",
			"SLURM_STEP_TASKS_PER_NODE=2(x2),1", "SLURM_NODEID=2", "SOFTRNIC_ROOT=[fd00::1]"},
			Config{Rank: 4, Size: 5, LocalSize: 1, Job: "7.3", Root: "[fd00::1]:" + strconv.Itoa(RootPort("7.3"))}},
		{"srun -c 2", append(srun, "SLURM_CPUS_PER_TASK=2", "SOFTRNIC_ROOT=h:1"),
			Config{Rank: 1, Size: 4, LocalSize: 4, CPUs: 2, Job: "50.0", Root: "h:1"}},
		{"srun --mpi=pmi2", append(srun, "PMI_RANK=1", "PMI_SIZE=4", "PMI_JOBID=50.0", "SOFTRNIC_ROOT=10.0.0.1:1"),
			Config{Rank: 1, Size: 4, LocalSize: 4, Job: "50.0", Root: "10.0.0.1:1"}},
		{"srun --mpi=pmi2 without PMI_JOBID", append(srun, "PMI_RANK=1", "PMI_SIZE=4", "SOFTRNIC_ROOT=10.0.0.1:1"),
			Config{Rank: 1, Size: 4, LocalSize: 4, Job: "50.0", Root: "10.0.0.1:1"}},
		{"mpirun in a batch script", []string{"SLURM_JOB_ID=50", "SLURM_PROCID=0", "SLURM_NTASKS=2", "OMPI_COMM_WORLD_RANK=3",
			"OMPI_COMM_WORLD_SIZE=8", "OMPI_COMM_WORLD_LOCAL_SIZE=8", "PMIX_NAMESPACE=prterun-host-1234@1", "SOFTRNIC_ROOT=127.0.0.1:2"},
			Config{Rank: 3, Size: 8, LocalSize: 8, Job: "prterun-host-1234@1", Root: "127.0.0.1:2"}},
		{"mpirun of Open MPI 4", []string{"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "OMPI_MCA_orte_ess_jobid=2512322561",
			"SOFTRNIC_ROOT=127.0.0.1:2"},
			Config{Rank: 0, Size: 2, Job: "2512322561", Root: "127.0.0.1:2"}},
		{"rmsgrun", []string{"PMI_RANK=0", "PMI_SIZE=2", "MPI_LOCALNRANKS=2", "SOFTRNIC_JOB=rmsgrun-5f1e", "SOFTRNIC_ROOT=127.0.0.1:3",
			"SOFTRNIC_RENDEZVOUS_TIMEOUT=5s"},
			Config{Rank: 0, Size: 2, LocalSize: 2, Job: "rmsgrun-5f1e", Root: "127.0.0.1:3", RendezvousTimeout: 5 * time.Second}},
		{"rmsgrun in an srun step", append(srun, "PMI_RANK=3", "PMI_SIZE=6", "MPI_LOCALNRANKS=6", "SOFTRNIC_JOB=t", "SOFTRNIC_ROOT=127.0.0.1:4"),
			Config{Rank: 3, Size: 6, LocalSize: 6, Job: "t", Root: "127.0.0.1:4"}},
		{"a job of one needs no root", []string{"SLURM_JOB_ID=9", "SLURM_STEP_ID=0", "SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=1"},
			Config{Rank: 0, Size: 1, Job: "9.0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			setEnv(t, c.env...)
			var got Config
			if err := FromEnv(&got); err != nil {
				t.Fatal(err)
			}
			if got.Rank != c.want.Rank || got.Size != c.want.Size || got.LocalSize != c.want.LocalSize || got.CPUs != c.want.CPUs || got.Job != c.want.Job ||
				got.Root != c.want.Root || got.RendezvousTimeout != c.want.RendezvousTimeout {
				t.Errorf("FromEnv: rank %d size %d local %d cpus %d job %q root %q timeout %v\nwant rank %d size %d local %d cpus %d job %q root %q timeout %v",
					got.Rank, got.Size, got.LocalSize, got.CPUs, got.Job, got.Root, got.RendezvousTimeout,
					c.want.Rank, c.want.Size, c.want.LocalSize, c.want.CPUs, c.want.Job, c.want.Root, c.want.RendezvousTimeout)
			}
		})
	}
}

func TestFromEnvRefuses(t *testing.T) {
	srun := []string{"SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=2"}
	for _, c := range []struct {
		name    string
		env     []string
		invalid bool
		says    string
	}{
		{"no root", srun, false, "SOFTRNIC_ROOT"},
		{"a host without a port and no job", append(srun, "SOFTRNIC_ROOT=10.0.0.1"), false, "has no port"},
		{"a root that is no address", append(srun, "SOFTRNIC_JOB=x", "SOFTRNIC_ROOT=a:b:c"), true, "not host or host:port"},
		{"a timeout that is no duration", append(srun, "SOFTRNIC_ROOT=h:1", "SOFTRNIC_RENDEZVOUS_TIMEOUT=60"), true, "SOFTRNIC_RENDEZVOUS_TIMEOUT"},
		{"a negative timeout", append(srun, "SOFTRNIC_ROOT=h:1", "SOFTRNIC_RENDEZVOUS_TIMEOUT=-1s"), true, "SOFTRNIC_RENDEZVOUS_TIMEOUT"},
		{"a rank past the size", []string{"SLURM_PROCID=2", "SLURM_STEP_NUM_TASKS=2"}, true, "not a rank and a size"},
	} {
		t.Run(c.name, func(t *testing.T) {
			setEnv(t, c.env...)
			err := FromEnv(&Config{})
			if err == nil || errors.Is(err, ErrInvalid) != c.invalid || !strings.Contains(err.Error(), c.says) {
				t.Errorf("FromEnv: %v; want an error saying %q (wrapping ErrInvalid: %v)", err, c.says, c.invalid)
			}
		})
	}
}

func TestRootPort(t *testing.T) {
	seen := map[int]bool{}
	for _, job := range []string{"50.0", "50.1", "51.0", "prterun-host-1234@1"} {
		p := RootPort(job)
		if p < 20000 || p > 29999 {
			t.Errorf("RootPort(%q) = %d, outside 20000-29999", job, p)
		}
		if p != RootPort(job) {
			t.Errorf("RootPort(%q) differs between calls", job)
		}
		seen[p] = true
	}
	if len(seen) < 3 {
		t.Errorf("four jobs share %d ports", len(seen))
	}
}

// A rank with no device address takes the one its host reaches rank 0's host from.
func TestAddrTowards(t *testing.T) {
	if a := addrTowards("127.0.0.1:9"); a.String() != "127.0.0.1" {
		t.Errorf("towards 127.0.0.1: %v", a)
	}
	if a := addrTowards("127.0.0.1:no-port"); a.IsValid() {
		t.Errorf("towards an unusable root: %v, want none", a)
	}
}
