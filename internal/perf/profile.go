package perf

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// StartCPUProfile writes the process's CPU profile to path (--cpuprofile of every tool)
// until the returned stop is called, which flushes and closes the file.
func StartCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
