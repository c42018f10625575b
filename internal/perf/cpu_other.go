//go:build !unix

package perf

import "time"

// ProcessCPU is not available here: results carry no CPU figures.
func ProcessCPU() (total, sys time.Duration, ok bool) { return 0, 0, false }
