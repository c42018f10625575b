package verbs

import (
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

// futexSleep blocks the calling thread in the kernel while *w == val (or until woken).
func futexSleep(w *atomic.Uint32, val uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWait|futexPrivateFlag, uintptr(val), 0, 0, 0)
}

// futexWakeOne wakes one thread sleeping on w.
func futexWakeOne(w *atomic.Uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake|futexPrivateFlag, 1, 0, 0, 0)
}
