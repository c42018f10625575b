package msg

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// clearLauncher unsets every launcher variable FromEnv reads, for the test's duration.
func clearLauncher(t *testing.T) {
	t.Helper()
	for _, l := range launchers {
		t.Setenv(l.rank, "")
		t.Setenv(l.size, "")
	}
	for _, v := range []string{"SOFTRNIC_ROOT", "SOFTRNIC_ADDR", "SOFTRNIC_JOB", "SOFTRNIC_RENDEZVOUS_TIMEOUT", "SLURM_PROCID", "SLURM_NTASKS",
		"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_RESV_PORTS",
		"PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid", "PMI_JOBID",
		"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_CPUS_PER_TASK"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
}

// A program run without a launcher is a job of one rank: it sends to itself, and every
// collective works.
func TestInitWithoutLauncherIsOneRank(t *testing.T) {
	clearLauncher(t)
	if err := FromEnv(&Config{}); !errors.Is(err, ErrNoLauncher) {
		t.Fatalf("FromEnv without a launcher: %v, want ErrNoLauncher", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Init(ctx, Config{})
	if err != nil {
		t.Fatalf("Init without a launcher: %v", err)
	}
	defer c.Close()
	if c.Rank() != 0 || c.Size() != 1 {
		t.Fatalf("rank %d of %d, want 0 of 1", c.Rank(), c.Size())
	}

	// Point to point, to itself: blocking (the receive posted first) and non-blocking, a
	// small message and one above the largest phase.
	large := bytes.Repeat([]byte{'x'}, 300<<10)
	got := make([]byte, len(large))
	r := c.Irecv(got, 0, 1)
	if err := c.Send(ctx, []byte("to myself"), 0, 1); err != nil {
		t.Fatalf("Send to itself: %v", err)
	}
	if st, err := r.Wait(ctx); err != nil || string(got[:st.Count]) != "to myself" || st.Source != 0 {
		t.Fatalf("Irecv from itself: %+v %v %q", st, err, got[:st.Count])
	}
	s := c.Isend(large, 0, 2)
	if st, err := c.Recv(ctx, got, AnySource, AnyTag); err != nil || !bytes.Equal(got[:st.Count], large) || st.Tag != 2 {
		t.Fatalf("Recv of %d bytes from itself: %+v %v", len(large), st, err)
	}
	if _, err := s.Wait(ctx); err != nil {
		t.Fatalf("Isend to itself: %v", err)
	}

	// Every collective.
	if err := c.Barrier(ctx); err != nil {
		t.Fatalf("Barrier: %v", err)
	}
	b := []int32{7, 8}
	if err := Bcast(ctx, c, b, 0); err != nil || b[0] != 7 || b[1] != 8 {
		t.Fatalf("Bcast: %v %v", b, err)
	}
	sum := make([]float64, 2)
	if err := Allreduce(ctx, c, []float64{1.5, 2}, sum, Sum); err != nil || sum[0] != 1.5 || sum[1] != 2 {
		t.Fatalf("Allreduce: %v %v", sum, err)
	}
	all := make([]int64, 3)
	if err := Allgather(ctx, c, []int64{4, 5, 6}, all); err != nil || all[0] != 4 || all[2] != 6 {
		t.Fatalf("Allgather: %v %v", all, err)
	}
	if n := c.Memory().Connections; n != 0 {
		t.Errorf("a job of one rank made %d connections", n)
	}

	// A rank that is not in the job is named as such.
	if err := c.Send(ctx, nil, 1, 0); err == nil {
		t.Error("Send to rank 1 of a job of 1: no error")
	}
}

// Half a configuration is refused with an error that says what is missing, not taken
// for a job of one rank.
func TestInitHalfConfigFails(t *testing.T) {
	clearLauncher(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if c, err := Init(ctx, Config{Rank: 2}); err == nil {
		c.Close()
		t.Fatal("Init with Rank 2 and no Size: no error")
	} else if !strings.Contains(err.Error(), "Size is 0") {
		t.Errorf("Init with Rank 2 and no Size: %v, want it to name Size", err)
	}
	for _, l := range launchers {
		if l.name == slurm.name {
			continue // a batch script's rank without a step's size: see below
		}
		t.Run(l.rank, func(t *testing.T) {
			clearLauncher(t)
			t.Setenv(l.rank, "1")
			c, err := Init(ctx, Config{})
			if err == nil {
				c.Close()
				t.Fatalf("Init with %s and no %s: no error", l.rank, l.size)
			}
			if !strings.Contains(err.Error(), l.size) || errors.Is(err, ErrNoLauncher) {
				t.Errorf("Init with %s and no %s: %v, want it to name %s", l.rank, l.size, err, l.size)
			}
		})
	}
	// A batch script's environment (sbatch -n 4: SLURM_PROCID 0, SLURM_NTASKS 4, but no
	// step) is not a launcher's: a job of one rank, not rank 0 of 4 waiting for ranks
	// that no srun started.
	t.Setenv("SLURM_PROCID", "0")
	t.Setenv("SLURM_NTASKS", "4")
	c, err := Init(ctx, Config{})
	if err != nil {
		t.Fatalf("Init in a batch script: %v", err)
	}
	defer c.Close()
	if c.Size() != 1 {
		t.Errorf("Init in a batch script: size %d, want 1", c.Size())
	}
}
