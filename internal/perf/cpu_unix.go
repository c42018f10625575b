//go:build unix

package perf

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time the process has used, user and system together, and the
// system part (getrusage).
func ProcessCPU() (total, sys time.Duration, ok bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), time.Duration(ru.Stime.Nano()), true
}
