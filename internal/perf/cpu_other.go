//go:build !unix

package perf

import "time"

// processCPU is not available here: results carry no CPU figures.
func processCPU() (total, sys time.Duration, ok bool) { return 0, 0, false }
