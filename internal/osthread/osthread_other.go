//go:build !linux

package osthread

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
)

// wait lets the calling thread wait while *w == val. Without a futex it sleeps briefly
// and lets the caller look again (Parker loops).
func wait(w *atomic.Uint32, val uint32) {
	if w.Load() == val {
		time.Sleep(50 * time.Microsecond)
	}
}

// wake has nothing to do: a waiter sees the change within one sleep of wait.
func wake(*atomic.Uint32) {}

// Lock locks the calling goroutine to its OS thread and fails: pinning, priorities and
// thread IDs are implemented for Linux only, so no thread is set up elsewhere.
func Lock(Config) (tid int, err error) {
	runtime.LockOSThread()
	return 0, fmt.Errorf("kernel-scheduled threads on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

// ID returns 0: thread IDs are implemented for Linux only (and Lock fails elsewhere).
func ID() int { return 0 }

// AllowedCPUs returns CPUs 0 to runtime.NumCPU()-1.
func AllowedCPUs() ([]int, error) {
	l := make([]int, runtime.NumCPU())
	for i := range l {
		l[i] = i
	}
	return l, nil
}
