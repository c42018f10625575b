//go:build !unix

package main

import "time"

// processCPU reports no CPU time where getrusage is missing.
func processCPU() (total, sys time.Duration, ok bool) { return 0, 0, false }
