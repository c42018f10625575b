//go:build linux

package rxevm

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
)

// Capture is a tcpdump running on the VM's bridge (see VM.Capture).
type Capture struct {
	vm   *VM
	cmd  *exec.Cmd
	path string
	done chan struct{} // closed when tcpdump has been reaped

	mu     sync.Mutex
	stderr strings.Builder
	once   sync.Once
	n      int
	err    error
}

// Capture starts tcpdump on the bridge (every packet between host and guest), writing to
// the pcap file path, with an optional filter ("udp", "port", "4791", ...). It returns once
// tcpdump is capturing. Stop it with Stop; Close stops it too.
func (v *VM) Capture(ctx context.Context, path string, filter ...string) (*Capture, error) {
	if _, err := exec.LookPath("tcpdump"); err != nil {
		return nil, fmt.Errorf("rxevm: tcpdump not installed (apt-get install tcpdump)")
	}
	args := append([]string{"netns", "exec", v.cfg.Name, "tcpdump", "-i", bridgeDev, "-n", "--immediate-mode", "-U", "-Z", "root", "-w", path}, filter...)
	cmd := exec.Command("ip", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := testutil.StartWithParentDeath(cmd); err != nil {
		return nil, fmt.Errorf("rxevm: tcpdump: %w", err)
	}
	c := &Capture{vm: v, cmd: cmd, path: path, done: make(chan struct{})}
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pipe)
		signalled := false
		for sc.Scan() {
			c.mu.Lock()
			c.stderr.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
			if !signalled && strings.Contains(sc.Text(), "listening on") {
				close(listening)
				signalled = true
			}
		}
		io.Copy(io.Discard, pipe)
		cmd.Wait()
		close(c.done)
	}()
	select {
	case <-listening:
	case <-c.done:
		return nil, fmt.Errorf("rxevm: tcpdump exited: %s", strings.TrimSpace(c.stderrText()))
	case <-ctx.Done():
		cmd.Process.Kill()
		<-c.done
		return nil, fmt.Errorf("rxevm: tcpdump not capturing: %w", ctx.Err())
	}
	v.mu.Lock()
	v.caps[c] = struct{}{}
	v.mu.Unlock()
	return c, nil
}

func (c *Capture) stderrText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

// Path is the pcap file.
func (c *Capture) Path() string { return c.path }

var capturedRE = regexp.MustCompile(`(?m)^(\d+) packets? captured`)

// Stop ends the capture (SIGTERM, so tcpdump writes out everything) and returns the number
// of packets captured. Calling it again returns the same.
func (c *Capture) Stop() (packets int, err error) {
	c.once.Do(func() {
		c.cmd.Process.Signal(syscall.SIGTERM) // our child, by its pid
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			c.cmd.Process.Kill()
			<-c.done
		}
		c.vm.mu.Lock()
		delete(c.vm.caps, c)
		c.vm.mu.Unlock()
		m := capturedRE.FindStringSubmatch(c.stderrText())
		if m == nil {
			c.err = fmt.Errorf("rxevm: tcpdump gave no packet count: %s", strings.TrimSpace(c.stderrText()))
			return
		}
		c.n, _ = strconv.Atoi(m[1])
	})
	return c.n, c.err
}
