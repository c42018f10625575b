package osthread

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Linux futex operations (linux/futex.h).
const (
	futexWait        = 0
	futexWake        = 1
	futexPrivateFlag = 128
)

// wait blocks the calling thread in the kernel while *w == val (or until woken).
func wait(w *atomic.Uint32, val uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWait|futexPrivateFlag, uintptr(val), 0, 0, 0)
}

// wake wakes one thread waiting on w.
func wake(w *atomic.Uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake|futexPrivateFlag, 1, 0, 0, 0)
}

// schedFIFO is the SCHED_FIFO policy (linux/sched.h).
const schedFIFO = 1

// Lock locks the calling goroutine to its OS thread and sets the thread up as cfg says:
// CPU affinity first, then SCHED_FIFO or the nice value. The thread is never unlocked: it
// ends with the goroutine, and its affinity and nice value with it. Lock returns the
// thread's ID, also when the setup fails (the goroutine should then return).
func Lock(cfg Config) (tid int, err error) {
	runtime.LockOSThread()
	tid = unix.Gettid()
	if len(cfg.CPUs) > 0 {
		var set unix.CPUSet
		for _, cpu := range cfg.CPUs {
			set.Set(cpu)
		}
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return tid, fmt.Errorf("sched_setaffinity %v: %w", cfg.CPUs, err)
		}
	}
	if cfg.RealTime {
		param := struct{ priority int32 }{int32(cfg.RTPriority)}
		if _, _, e := unix.Syscall(unix.SYS_SCHED_SETSCHEDULER, 0, schedFIFO, uintptr(unsafe.Pointer(&param))); e != 0 {
			return tid, fmt.Errorf("real-time scheduling (SCHED_FIFO %d): %w (needs CAP_SYS_NICE or RLIMIT_RTPRIO)", cfg.RTPriority, e)
		}
	} else if cfg.Nice != 0 {
		// A thread's nice value: lowering priority needs no privilege.
		_ = unix.Setpriority(unix.PRIO_PROCESS, tid, cfg.Nice)
	}
	return tid, nil
}

// ID returns the calling thread's ID.
func ID() int { return unix.Gettid() }

// AllowedCPUs returns the CPUs the calling thread may run on, in increasing order.
func AllowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var l []int
	for i := 0; i < len(set)*64; i++ {
		if set.IsSet(i) {
			l = append(l, i)
		}
	}
	return l, nil
}
