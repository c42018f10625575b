//go:build !linux && !freebsd && !openbsd

package testutil

import (
	"errors"
	"time"
)

// threadCPU fails: Getrusage reports no per-thread CPU time here (no RUSAGE_THREAD), and
// CPUShare measures the process instead.
func threadCPU() (time.Duration, error) { return 0, errors.ErrUnsupported }
