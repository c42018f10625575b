//go:build unix

package perf

import (
	"syscall"
	"time"
)

// processCPU returns the user and system CPU time the process has used (getrusage).
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
