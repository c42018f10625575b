//go:build linux

package rxevm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Job is a shell command running in the guest (see Spawn).
type Job struct {
	vm   *VM
	id   string
	cmd  string
	done chan struct{}

	mu     sync.Mutex
	rc     int
	err    error // the VM went away before the job ended
	read   bool  // stdout/stderr below are read
	stdout string
	stderr string
}

// Exec runs shellCmd with sh in the guest and waits for it: its output and exit code. A
// non-zero exit code is not an error; err is set when the command could not be run or
// waited for. When ctx is done first, the command is killed (SIGTERM, then SIGKILL, to its
// whole process group) and err wraps ctx.Err(); stdout and stderr hold what it wrote.
//
// In the guest the command runs as root in /root with stdin from /dev/null, in a session of
// its own, with $SOFTRNIC_GID_INDEX, $GUEST_IP and $HOST_IP set. The host's root is the
// guest's (read-only under a tmpfs overlay: writes are the guest's own).
func (v *VM) Exec(ctx context.Context, shellCmd string) (stdout, stderr string, rc int, err error) {
	j, err := v.Spawn(shellCmd)
	if err != nil {
		return "", "", -1, err
	}
	return j.Wait(ctx)
}

// Spawn starts shellCmd in the guest in the background (a server, say) and returns at once.
// Wait for it with Wait (which also kills it when its context is done), or stop it with
// Signal; Close ends it with the VM.
func (v *VM) Spawn(shellCmd string) (*Job, error) {
	v.mu.Lock()
	if v.dead != nil || v.jobs == nil || !v.up {
		err := v.dead
		v.mu.Unlock()
		if err == nil {
			err = fmt.Errorf("rxevm: VM %s is not running", v.cfg.Name)
		}
		return nil, err
	}
	v.nextID++
	j := &Job{vm: v, id: "j" + strconv.FormatUint(v.nextID, 10), cmd: shellCmd, done: make(chan struct{}), rc: -1}
	v.mu.Unlock()

	if err := os.WriteFile(j.path(".sh"), []byte(shellCmd+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("rxevm: %w", err)
	}
	v.mu.Lock()
	if v.dead != nil {
		v.mu.Unlock()
		return nil, v.dead
	}
	v.jobs[j.id] = j
	v.mu.Unlock()
	if err := v.send("run " + j.id); err != nil {
		v.mu.Lock()
		delete(v.jobs, j.id)
		v.mu.Unlock()
		return nil, fmt.Errorf("rxevm: sending job %s: %w", j.id, err)
	}
	return j, nil
}

func (j *Job) path(ext string) string { return filepath.Join(j.vm.share, "jobs", j.id+ext) }

// finish records the end of the job: its exit code, or err if the VM went away.
func (j *Job) finish(rc int, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	select {
	case <-j.done:
		return
	default:
	}
	j.rc, j.err = rc, err
	close(j.done)
}

// ID returns the job's name in the VM's share (its files are jobs/ID.sh, .out, .err).
func (j *Job) ID() string { return j.id }

// Done is closed when the job has ended.
func (j *Job) Done() <-chan struct{} { return j.done }

// Output returns what the job has written to stdout and stderr so far (all of it once the
// job has ended).
func (j *Job) Output() (stdout, stderr string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.read {
		return j.stdout, j.stderr
	}
	o, _ := os.ReadFile(j.path(".out"))
	e, _ := os.ReadFile(j.path(".err"))
	select {
	case <-j.done: // complete: the guest has closed the files
		j.read, j.stdout, j.stderr = true, string(o), string(e)
	default:
	}
	return string(o), string(e)
}

// Signal sends a signal ("TERM", "KILL", "INT", ...) to the job's process group.
func (j *Job) Signal(sig string) error {
	if strings.ContainsAny(sig, " \n") || sig == "" {
		return fmt.Errorf("rxevm: bad signal name %q", sig)
	}
	select {
	case <-j.done:
		return nil
	default:
	}
	return j.vm.send("kill " + j.id + " " + sig)
}

// Wait waits for the job to end and returns its output and exit code (128+n when a signal
// n ended it). When ctx is done first, Wait kills the job (SIGTERM to its process group,
// SIGKILL 3 s later), waits up to 10 s more for it to end, and returns its output with an
// error wrapping ctx.Err(). err is also set when the VM stopped before the job ended.
func (j *Job) Wait(ctx context.Context) (stdout, stderr string, rc int, err error) {
	select {
	case <-j.done:
	case <-ctx.Done():
		j.Signal("TERM")
		t := time.NewTimer(3 * time.Second)
		select {
		case <-j.done:
		case <-t.C:
			j.Signal("KILL")
		}
		t.Stop()
		t = time.NewTimer(10 * time.Second)
		select {
		case <-j.done:
		case <-t.C:
		}
		t.Stop()
		stdout, stderr = j.Output()
		j.mu.Lock()
		rc = j.rc
		j.mu.Unlock()
		return stdout, stderr, rc, fmt.Errorf("rxevm: guest command %q (job %s) killed: %w", short(j.cmd), j.id, ctx.Err())
	}
	stdout, stderr = j.Output()
	j.mu.Lock()
	rc, err = j.rc, j.err
	j.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("guest command %q (job %s): %w", short(j.cmd), j.id, err)
	}
	return stdout, stderr, rc, err
}

func short(s string) string {
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}

// WaitUntil runs the shell condition cond in the guest until it succeeds (every 50 ms, in
// the guest), for readiness checks such as a guest server listening:
//
//	vm.WaitUntil(ctx, "ss -Hltn 'sport = :18515' | grep -q .")      // TCP listener
//	vm.WaitUntil(ctx, "rdma res show cm_id | grep -q LISTEN")         // rdma_cm listener
//
// It returns an error wrapping ctx.Err() if ctx is done first.
func (v *VM) WaitUntil(ctx context.Context, cond string) error {
	_, _, rc, err := v.Exec(ctx, "until { "+cond+"\n} >/dev/null 2>&1; do sleep 0.05; done")
	if err == nil && rc != 0 {
		err = fmt.Errorf("rxevm: waiting for %q: exit code %d", short(cond), rc)
	}
	return err
}
