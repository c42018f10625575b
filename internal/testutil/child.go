package testutil

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// StartChild runs the test binary again as a child process that runs only the test named
// test, with env added to this process's environment: the way a test puts a device in a
// process of its own, to kill it (SIGKILL) as a crashed program dies. The child's standard
// error goes to this process's; its standard output is returned, line by line. It is killed
// when the test ends, and after a minute at most.
func StartChild(t testing.TB, test string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 10 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, bufio.NewScanner(stdout)
}
