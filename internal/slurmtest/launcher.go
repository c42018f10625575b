//go:build linux

package slurmtest

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// A child's parent-death signal fires when the thread that forked it ends, not the
// process, and the Go runtime ends a thread whose goroutine returns while locked to it
// (as the messaging layer's pinned pollers may, in the tests that use this package).
// The daemons are therefore forked from one thread locked for the life of the process,
// which does nothing else, so that they die with the test process and not before.
var launcher struct {
	once  sync.Once
	start chan *exec.Cmd
	err   chan error
}

// startWithParentDeath starts cmd, with SIGKILL as its parent-death signal, from the
// launcher thread.
func startWithParentDeath(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	launcher.once.Do(func() {
		launcher.start = make(chan *exec.Cmd)
		launcher.err = make(chan error)
		go func() {
			runtime.LockOSThread() // for good: the goroutine never returns
			for c := range launcher.start {
				launcher.err <- c.Start()
			}
		}()
	})
	launcher.start <- cmd
	return <-launcher.err
}
