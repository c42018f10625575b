//go:build linux

package rxevm

import (
	"bytes"
	"context"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// The kernel sends a child's parent-death signal when the thread that forked it ends,
// not the process; and the Go runtime ends any thread whose goroutine returns while
// locked to it, as InNamespace's do (and softrnic's pinned pollers). A child started
// from an ordinary goroutine can therefore be killed in the middle of a test, when the
// idle thread that forked it is later taken by such a goroutine. Every child that
// should die with the test process is started on the launcher: one thread, locked for
// the life of the process, that does nothing else.
var launcher struct {
	once sync.Once
	reqs chan launchReq
}

type launchReq struct {
	cmd  *exec.Cmd
	done chan<- error
}

// startWithParentDeath starts cmd with SIGKILL as its parent-death signal, forked from
// the launcher thread, so that it dies when the test process does and not before.
func startWithParentDeath(cmd *exec.Cmd) error {
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

// HostCmd is a host program run in the VM's namespace: an exec.Cmd whose Start, Run,
// Output and CombinedOutput fork it from the launcher thread (see startWithParentDeath).
// Use those methods, not the embedded Cmd's Start.
type HostCmd struct {
	*exec.Cmd
}

// Start starts the program; it gets SIGKILL if the test process dies.
func (c *HostCmd) Start() error { return startWithParentDeath(c.Cmd) }

// Run starts the program and waits for it to end.
func (c *HostCmd) Run() error {
	if err := c.Start(); err != nil {
		return err
	}
	return c.Wait()
}

// Output runs the program and returns its standard output; as exec.Cmd.Output, an
// *exec.ExitError carries its standard error unless Stderr is set.
func (c *HostCmd) Output() ([]byte, error) {
	var stdout, stderr bytes.Buffer
	c.Stdout = &stdout
	captureErr := c.Stderr == nil
	if captureErr {
		c.Stderr = &stderr
	}
	err := c.Run()
	if ee, ok := err.(*exec.ExitError); ok && captureErr {
		ee.Stderr = stderr.Bytes()
	}
	return stdout.Bytes(), err
}

// CombinedOutput runs the program and returns its standard output and error together.
func (c *HostCmd) CombinedOutput() ([]byte, error) {
	var b bytes.Buffer
	c.Stdout, c.Stderr = &b, &b
	err := c.Run()
	return b.Bytes(), err
}

// hostCommand is exec.CommandContext wrapped as a HostCmd.
func hostCommand(ctx context.Context, name string, args ...string) *HostCmd {
	return &HostCmd{exec.CommandContext(ctx, name, args...)}
}
