// Command rmsgrun starts a job of the softrnic messaging layer (package msg) on this host,
// as mpirun does: N copies of a program, each told its rank, the job's size and how many
// ranks share the host (PMI_RANK, PMI_SIZE, MPI_LOCALNRANKS as MPICH's launcher sets
// them), where rank 0 serves the rendezvous (SOFTRNIC_ROOT) and the job's identity
// (SOFTRNIC_JOB, drawn at random), with their output prefixed by rank.
//
//	rmsgrun -np 4 ./prog args...
//
// If a rank fails, the others are stopped; rmsgrun exits with the first failure's code.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

func main() {
	np := flag.Int("np", 2, "number of ranks")
	addr := flag.String("addr", "127.0.0.1", "device address of every rank (SOFTRNIC_ADDR)")
	root := flag.String("root", "", "host:port where rank 0 serves the rendezvous (SOFTRNIC_ROOT; default: a free port of -addr)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: rmsgrun -np N program [args...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 || *np < 1 {
		flag.Usage()
		os.Exit(2)
	}
	os.Exit(run(*np, *addr, *root, flag.Args(), os.Stdout, os.Stderr))
}

// run starts the ranks and waits for them; it returns the exit code. Rank 0 serves the
// rendezvous at root, or at a port of addr that is free now if root is "".
func run(np int, addr, root string, args []string, stdout, stderr io.Writer) int {
	if root == "" {
		l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		if err != nil {
			fmt.Fprintln(stderr, "rmsgrun:", err)
			return 1
		}
		root = l.Addr().String()
		l.Close() // rank 0 listens on it
	}
	// The job's identity, which every rank presents at the rendezvous: a rank of another
	// job that reaches this job's rank 0 is refused.
	var token [8]byte
	rand.Read(token[:])
	job := fmt.Sprintf("rmsgrun-%d-%x", os.Getpid(), token)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var outMu sync.Mutex
	var wg sync.WaitGroup
	codes := make([]int, np)
	first := -1
	var firstMu sync.Mutex
	for r := 0; r < np; r++ {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(), fmt.Sprintf("PMI_RANK=%d", r), fmt.Sprintf("PMI_SIZE=%d", np),
			fmt.Sprintf("MPI_LOCALNRANKS=%d", np), "SOFTRNIC_ROOT="+root, "SOFTRNIC_ADDR="+addr, "SOFTRNIC_JOB="+job)
		// Each rank in a process group of its own, so that stopping it stops what it
		// started too; its output prefixed by rank, line by line.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
		cmd.WaitDelay = 5 * time.Second
		prefix := ""
		if np > 1 {
			prefix = fmt.Sprintf("[%d] ", r)
		}
		cmd.Stdout = &lineWriter{mu: &outMu, w: stdout, prefix: prefix}
		cmd.Stderr = &lineWriter{mu: &outMu, w: stderr, prefix: prefix}
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(stderr, "rmsgrun: rank %d: %v\n", r, err)
			stop()
			codes[r] = 127
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := cmd.Wait()
			cmd.Stdout.(*lineWriter).flush()
			cmd.Stderr.(*lineWriter).flush()
			var ee *exec.ExitError
			switch {
			case err == nil:
			case errors.As(err, &ee):
				codes[r] = max(ee.ExitCode(), 1)
			default:
				codes[r] = 1
			}
			if codes[r] != 0 {
				firstMu.Lock()
				if first < 0 {
					first = r
					fmt.Fprintf(stderr, "rmsgrun: rank %d failed (%v); stopping the others\n", r, err)
				}
				firstMu.Unlock()
				stop()
			}
		}()
	}
	wg.Wait()
	if first >= 0 {
		return codes[first]
	}
	for _, c := range codes {
		if c != 0 {
			return c
		}
	}
	return 0
}

// lineWriter writes whole lines to w, each with a prefix.
type lineWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.mu.Lock()
		fmt.Fprintf(l.w, "%s%s\n", l.prefix, l.buf[:i])
		l.mu.Unlock()
		l.buf = l.buf[i+1:]
	}
}

func (l *lineWriter) flush() {
	if len(l.buf) > 0 {
		l.Write([]byte{'\n'})
	}
}
