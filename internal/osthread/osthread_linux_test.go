package osthread

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// onThread runs fn on a goroutine of its own, whose thread ends with it (Lock never
// unlocks), and waits for it.
func onThread(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
}

// AllowedCPUs lists at least one CPU, each once, in increasing order.
func TestAllowedCPUs(t *testing.T) {
	cpus, err := AllowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) == 0 {
		t.Fatal("AllowedCPUs() is empty")
	}
	for i := 1; i < len(cpus); i++ {
		if cpus[i] <= cpus[i-1] {
			t.Fatalf("AllowedCPUs() = %v, not in increasing order", cpus)
		}
	}
}

// Lock pins the thread to its CPUs and sets its nice value, and returns its ID.
func TestLockPinsAndNices(t *testing.T) {
	cpus, err := AllowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	want := cpus[len(cpus)-1]
	onThread(func() {
		tid, err := Lock(Config{CPUs: []int{want}, Nice: 3})
		if err != nil {
			t.Error(err)
			return
		}
		if tid != unix.Gettid() || ID() != tid {
			t.Errorf("Lock returned thread %d, ID() %d; the thread is %d", tid, ID(), unix.Gettid())
		}
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &set); err != nil {
			t.Error(err)
		} else if set.Count() != 1 || !set.IsSet(want) {
			t.Errorf("thread may run on %d CPUs, want only CPU %d", set.Count(), want)
		}
		if p, err := unix.Getpriority(unix.PRIO_PROCESS, 0); err != nil {
			t.Error(err)
		} else if nice := 20 - p; nice != 3 { // the raw syscall returns 20 - nice
			t.Errorf("nice %d, want 3", nice)
		}
	})
}

// A CPU the process may not run on fails Lock with the system's error.
func TestLockBadCPU(t *testing.T) {
	cpus, err := AllowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	bad := len(unix.CPUSet{})*64 - 1
	if slices.Contains(cpus, bad) {
		t.Skipf("CPU %d is allowed here", bad)
	}
	onThread(func() {
		if _, err := Lock(Config{CPUs: []int{bad}}); !errors.Is(err, unix.EINVAL) {
			t.Errorf("Lock on CPU %d: %v, want EINVAL", bad, err)
		}
	})
}

// RealTime gives the thread SCHED_FIFO where the process may, and otherwise says what
// it needs.
func TestLockRealTime(t *testing.T) {
	onThread(func() {
		_, err := Lock(Config{RealTime: true, RTPriority: 1})
		if errors.Is(err, unix.EPERM) {
			if !strings.Contains(err.Error(), "CAP_SYS_NICE") {
				t.Errorf("error %q does not say what is needed", err)
			}
			return
		}
		if err != nil {
			t.Error(err)
			return
		}
		if p, _, _ := unix.Syscall(unix.SYS_SCHED_GETSCHEDULER, 0, 0, 0); p != schedFIFO {
			t.Errorf("policy %d, want SCHED_FIFO", p)
		}
	})
}
