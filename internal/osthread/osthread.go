// Package osthread runs a goroutine as an OS thread of its own, scheduled by the kernel
// rather than by the Go runtime's processors, as an interrupt thread is: Lock locks the
// calling goroutine to its thread for good and pins it to CPUs, gives it a nice value or
// the SCHED_FIFO real-time policy; Parker puts such a thread to sleep in the kernel so
// that waking it is one system call; AddProcs gives the runtime a processor for each such
// thread, so that one that works for a long time never keeps goroutines from running.
//
// The system-specific parts are in osthread_linux.go; osthread_other.go is what other
// systems get (threads cannot be set up there: Lock fails).
package osthread

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Config says how Lock sets up the calling goroutine's thread.
type Config struct {
	// CPUs are the CPUs the thread may run on (nil: wherever the process may).
	CPUs []int
	// RealTime runs the thread under the SCHED_FIFO policy at RTPriority (1 to 99). It
	// needs CAP_SYS_NICE or an RLIMIT_RTPRIO allowance: Lock fails otherwise.
	RealTime   bool
	RTPriority int
	// Nice is the thread's nice value when it is not real-time (0: left as it is). Raising
	// it needs no privilege; a refusal is ignored.
	Nice int
}

// Parker makes a thread sleep until another one wakes it. Unpark before Park makes the
// next Park return at once (one wake-up is remembered, not more). Its zero value is ready;
// one thread parks on it at a time.
type Parker struct {
	state atomic.Uint32 // running, wakePending or sleeping
}

// States of Parker.state.
const (
	running     = 0
	wakePending = 1
	sleeping    = 2
)

// Unpark wakes the thread parked on p, or makes its next Park return at once.
func (p *Parker) Unpark() {
	if p.state.Swap(wakePending) == sleeping {
		wake(&p.state)
	}
}

// Park blocks the calling thread until p is unparked (at once if it was since the last
// Park).
func (p *Parker) Park() {
	if p.state.CompareAndSwap(running, sleeping) {
		for p.state.Load() == sleeping {
			wait(&p.state, sleeping)
		}
	}
	p.state.Store(running)
}

// procsMu serialises AddProcs's read-modify-write of GOMAXPROCS.
var procsMu sync.Mutex

// AddProcs adds n (which may be negative) to GOMAXPROCS, which stays at least 1.
func AddProcs(n int) {
	procsMu.Lock()
	runtime.GOMAXPROCS(max(1, runtime.GOMAXPROCS(0)+n))
	procsMu.Unlock()
}
