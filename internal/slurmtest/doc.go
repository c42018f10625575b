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
// killed. StartNodes boots a cluster of several nodes, all on this host: a slurmd for
// each.
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
// Only Linux has the cluster: on other systems the package is empty.
package slurmtest
