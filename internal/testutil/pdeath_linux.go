package testutil

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// The kernel sends a child's parent-death signal when the thread that forked it ends,
// not the process; and the Go runtime ends any thread whose goroutine returns while
// locked to it (a goroutine that entered a network namespace, a pinned poller). A child
// started from an ordinary goroutine can therefore be killed in the middle of a test,
// when the idle thread that forked it is later taken by such a goroutine. Children that
// should die with the test process are forked from the launcher: one thread, locked for
// the life of the process, that does nothing else.
var launcher struct {
	once sync.Once
	reqs chan launchReq
}

type launchReq struct {
	cmd  *exec.Cmd
	done chan<- error
}

// StartWithParentDeath starts cmd with SIGKILL as its parent-death signal, forked from
// the launcher thread, so that it dies when the test process does and not before. It
// keeps the rest of cmd.SysProcAttr.
func StartWithParentDeath(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	launcher.once.Do(func() {
		launcher.reqs = make(chan launchReq)
		go func() {
			runtime.LockOSThread() // never unlocked, and the goroutine never returns
			for r := range launcher.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	launcher.reqs <- launchReq{cmd, done}
	return <-done
}
