//go:build linux || freebsd || openbsd

package testutil

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU returns the CPU time (user and system) the calling thread has used.
func threadCPU() (time.Duration, error) {
	var r unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &r); err != nil {
		return 0, err
	}
	return time.Duration(r.Utime.Nano() + r.Stime.Nano()), nil
}
