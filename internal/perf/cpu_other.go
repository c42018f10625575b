//go:build !unix

package perf

import "time"

// processCPU is not available here: results carry no CPU figures.
func processCPU() (time.Duration, bool) { return 0, false }
