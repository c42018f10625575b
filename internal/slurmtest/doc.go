// Package slurmtest boots a private one-node Slurm cluster for tests, so that a program
// can be tested under Slurm's real launchers: srun (plain, with --mpi=pmi2, with
// --resv-ports) and sbatch.
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
// killed.
//
// The cluster needs root and Debian's slurm-wlm and munge packages (Slurm 22.05). The
// environment variable SOFTRNIC_SLURM says when tests boot one:
//
//   - unset or "on": whenever this is possible; the test is skipped, saying why, when it
//     is not (not root, Slurm or munge not installed);
//   - "require": as "on", but a test that cannot boot the cluster fails instead of
//     skipping (CI sets this);
//   - "off": never.
//
// Booting takes about a second (a test using a cluster takes one or two more), so tests
// run by default wherever Slurm is installed; under -short they are skipped, unless
// SOFTRNIC_SLURM=require.
//
// Only Linux has the cluster: on other systems the package is empty.
package slurmtest
