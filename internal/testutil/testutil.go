// Package testutil holds what the project's test suites share, whatever they test (the
// engine's own tests included, which cannot use the verbs rig, internal/verbstest): how
// long a wait may last before it is a failure (WaitLimit, and Context for calls that take
// a context), how to tell whether the machine is too busy for a test that depends on
// timing, whether the race detector is on (Race), and test data (Pattern, Fill).
//
// The rules every test follows: a test waits for a condition, never for a time; the only
// clocks in a test are failure guards (WaitLimit), generous enough for a machine that is
// busy with other work, so that they fire only on a real hang; and a test that measures the
// machine itself — a timing ratio, the order in which threads of different priorities run —
// first checks that it has the CPU it needs (SkipIfBusy) and skips, saying why, when it
// does not.
package testutil

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// WaitLimit bounds every wait in the tests: waiting for completions, events or a state.
// It is a failure guard, not a timing assertion: on an idle machine every wait ends in
// milliseconds, and a machine busy with other work may stretch one by tens of times, which
// the guard allows. A real hang is still caught: by this guard with a message naming what
// was awaited, or by `go test -timeout`.
const WaitLimit = 2 * time.Minute

// CPUShare measures the share of the machine's CPUs that the process can get: one
// thread per CPU spins for d, and the share is the CPU time they got over the time they
// asked for. Close to 1 on an idle machine, about 1/2 when as many busy processes as CPUs
// compete, lower when busier. Where the system reports no per-thread CPU time (darwin,
// NetBSD), the process's CPU time over the same interval stands in for the threads' (the
// process's other threads count too, which overstates the share a little).
func CPUShare(d time.Duration) float64 {
	n := runtime.NumCPU()
	got := make(chan time.Duration, n)
	start := time.Now()
	p0, perr := processCPU()
	for i := 0; i < n; i++ {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			t0, err := threadCPU()
			for time.Since(start) < d {
			}
			t1, err1 := threadCPU()
			if err != nil || err1 != nil {
				got <- -1
				return
			}
			got <- t1 - t0
		}()
	}
	var cpu time.Duration
	perThread := true
	for i := 0; i < n; i++ {
		c := <-got
		perThread = perThread && c >= 0
		cpu += c
	}
	if !perThread {
		p1, err := processCPU()
		if perr != nil || err != nil {
			return 1 // nothing to measure with: as if the machine were idle
		}
		cpu = p1 - p0
	}
	return float64(cpu) / float64(time.Duration(n)*time.Since(start))
}

// processCPU returns the CPU time (user and system) the process has used.
func processCPU() (time.Duration, error) {
	var r unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &r); err != nil {
		return 0, err
	}
	return time.Duration(r.Utime.Nano() + r.Stime.Nano()), nil
}

// MinShare is the CPU share below which SkipIfBusy skips. Measured on the 2-core
// development machine: 0.82–1.0 idle, 0.5–0.75 with one busy process, 0.41–0.51 with two.
const MinShare = 0.8

// Busy reports whether the machine is too busy for a timing-dependent test, and the share
// it measured (the best of up to three 50 ms samples, so that one preemption does not
// count).
func Busy() (bool, float64) {
	best := 0.0
	for i := 0; i < 3 && best < MinShare; i++ {
		best = max(best, CPUShare(50*time.Millisecond))
	}
	return best < MinShare, best
}

// SkipIfBusy skips t when the machine is too busy for a test whose outcome depends on
// the scheduler giving its threads a CPU promptly (what applies is in why).
func SkipIfBusy(t testing.TB, why string) {
	t.Helper()
	if busy, share := Busy(); busy {
		t.Skipf("machine too busy: the test's threads got %.0f%% of the CPUs (need %.0f%%), and %s", share*100, MinShare*100, why)
	}
}
