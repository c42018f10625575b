// Package testutil holds what the project's test suites share: how long a wait may last
// before it is a failure, and how to tell whether the machine is too busy for a test that
// depends on timing.
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
// compete, lower when busier.
func CPUShare(d time.Duration) float64 {
	n := runtime.NumCPU()
	got := make(chan time.Duration, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var r0, r1 unix.Rusage
			if unix.Getrusage(unix.RUSAGE_THREAD, &r0) != nil {
				got <- d
				return
			}
			for time.Since(start) < d {
			}
			if unix.Getrusage(unix.RUSAGE_THREAD, &r1) != nil {
				got <- d
				return
			}
			got <- time.Duration(r1.Utime.Nano()-r0.Utime.Nano()) + time.Duration(r1.Stime.Nano()-r0.Stime.Nano())
		}()
	}
	var cpu time.Duration
	for i := 0; i < n; i++ {
		cpu += <-got
	}
	return float64(cpu) / float64(time.Duration(n)*time.Since(start))
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
