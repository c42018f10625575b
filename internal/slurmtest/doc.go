// Package slurmtest boots a private Slurm cluster (one node, or several on this host) for
// tests, so that a program can be tested under Slurm's real launchers: srun (plain, with
// --mpi=pmi2, with --resv-ports) and sbatch.
//
// Start builds the cluster from scratch in a temporary directory: a MUNGE key and a
// munged listening on a socket of its own there (so it does not meet the system's
// munged), a slurm.conf naming this host as controller and only node, on ports picked
// free at start (two clusters, in two test processes, do not clash), and slurmctld and
// slurmd as child processes. The cluster uses no cgroups (process tracking by /proc,
// no task binding, no accounting), lets several tasks share a CPU (srun --overcommit),
// and has a range of ports for srun --resv-ports. Tests run srun, sbatch, squeue and
// scancel through Cluster.Command, which gives them the cluster's configuration; when
// the test ends, the daemons, munged and every process of the cluster's jobs are
// killed. StartNodes boots a cluster of several nodes, all on this host: a slurmd for
// each. StartNetNodes boots several nodes that are nodes of a network: each node's
// slurmd, and its tasks, in a network namespace of its own with its own address
// (10.78.0.i), on a bridge that the cluster adds to this host (10.78.0.254); one such
// cluster at a time on a host (a file lock serializes them).
//
// The cluster needs root and Debian's slurm-wlm and munge packages (Slurm 22.05). Tests
// boot one only when asked to, by the environment variable SOFTRNIC_SLURM:
//
//   - "on": the test boots a cluster, or is skipped, saying why, when it cannot (not
//     root, Slurm or munge not installed);
//   - "require": as "on", but a test that cannot boot the cluster fails instead of
//     skipping (CI's Slurm step sets this);
//   - unset or "off": the test is skipped.
//
// A boot takes about a second and a cluster's stop a fraction of one (a package of a
// few such tests, half a minute), which would be cheap in one run of go test ./...;
// but CI runs the messaging tests several times over (as they are, on more receive
// queues, under the race detector), and each test under Slurm would boot its cluster
// in every pass. So they run in a CI step of their own.
//
// What the launchers tell a task, as the package's tests check on Slurm 22.05: every
// task of an srun step has SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS,
// SLURM_STEP_NUM_TASKS, SLURM_STEP_TASKS_PER_NODE, SLURM_JOB_ID, SLURM_STEP_ID (and its
// older name SLURM_STEPID) and SLURM_STEP_NODELIST, plus, with this cluster's port
// range, SLURM_STEP_RESV_PORTS (tasks-per-node + 1 ports, or --resv-ports=N of them; a
// bare --resv-ports reserves none). SLURM_NTASKS_PER_NODE is set only when asked for
// (--ntasks-per-node). With --mpi=pmi2 a task also has PMI_RANK, PMI_SIZE, PMI_FD and
// PMI_JOBID (job ID.step ID); PMIX_NAMESPACE never (no PMIx library). A batch script,
// outside any srun step, has SLURM_JOB_ID, SLURM_NTASKS and SLURM_PROCID=0 too, but no
// SLURM_STEP_ID: a program run there directly must not take itself for task 0 of a job
// of SLURM_NTASKS tasks. srun -K ends every task (SIGTERM) when one exits non-zero;
// without it the others run on, and srun exits with the highest status.
//
// Only Linux has the cluster: on other systems the package is empty.
package slurmtest
