package testutil

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestChildOutlivesTheThreadThatAsked: a child started by a goroutine whose thread then
// ends keeps running; it ends by the signal the test sends, not by its parent-death
// SIGKILL.
func TestChildOutlivesTheThreadThatAsked(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep(1)")
	}
	cmd := exec.Command("sleep", "600")
	type started struct {
		tid int
		err error
	}
	c := make(chan started)
	hold := make(chan struct{})
	defer close(hold)
	var s started
	for s.tid = os.Getpid(); s.tid == os.Getpid(); {
		go func() {
			runtime.LockOSThread() // never unlocked: the runtime ends the thread when this returns
			if tid := unix.Gettid(); tid == os.Getpid() {
				// The main thread outlives its goroutines: keep it busy and try another.
				c <- started{tid: tid}
				<-hold
				runtime.UnlockOSThread()
				return
			}
			c <- started{unix.Gettid(), StartWithParentDeath(cmd)}
		}()
		s = <-c
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	defer cmd.Process.Kill()
	// Wait until the thread is gone from /proc: then a parent-death signal tied to it
	// would have been sent.
	task := "/proc/self/task/" + strconv.Itoa(s.tid)
	for {
		if _, err := os.Stat(task); errors.Is(err, os.ErrNotExist) {
			break
		}
		runtime.Gosched()
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("sleep ended with %v", err)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("sleep ended (%v), not by the test's SIGTERM", err)
	}
}
