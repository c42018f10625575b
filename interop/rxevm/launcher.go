//go:build linux

package rxevm

import (
	"bytes"
	"context"
	"os/exec"

	"github.com/softrnic/softrnic/internal/testutil"
)

// HostCmd is a host program run in the VM's namespace: an exec.Cmd whose Start, Run,
// Output and CombinedOutput fork it from the launcher thread (see testutil.StartWithParentDeath).
// Use those methods, not the embedded Cmd's Start.
type HostCmd struct {
	*exec.Cmd
}

// Start starts the program; it gets SIGKILL if the test process dies.
func (c *HostCmd) Start() error { return testutil.StartWithParentDeath(c.Cmd) }

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
