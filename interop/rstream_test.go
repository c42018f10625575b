//go:build linux

package interop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/interop/rxevm"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// rstreamPort is rstream's default service port.
const rstreamPort = 7471

// An rstream run as its command line describes it: the tests of each connection, the
// buffer size it sets (SO_SNDBUF and SO_RCVBUF: rsockets make rings of twice that) and
// whether each side checks the bytes it receives (-T v).
//
// rstream (librdmacm/examples/rstream.c) runs each test as sync_test, 16 bytes from the
// client and 16 back, then iterations of: the client sends count transfers of size bytes,
// the server receives them all and sends count transfers back. With -T v every byte a
// process sends is the next value of one byte counter that runs across its transfers,
// tests and connections (common.c: format_buf), and every byte it receives must be the
// next value of another (verify_buf). Without -S, -C and -I it runs the default sizes
// (with -S all, the sizes between them too) on two connections: each size once as a
// latency test (one transfer per iteration), then, on a new connection, each as a
// bandwidth test (one iteration of many transfers).
type rstreamRun struct {
	conns  [][]rstreamTest
	buffer int
	verify bool
}

type rstreamTest struct{ size, count, iters int }

// rstreamSizes are rstream's test sizes, and whether a size runs only with -S all.
var rstreamSizes = func() (s []struct {
	size int
	all  bool
}) {
	for sh := 6; sh <= 22; sh++ {
		s = append(s, struct {
			size int
			all  bool
		}{1 << sh, sh != 6 && sh%4 != 0})
		if sh < 22 {
			s = append(s, struct {
				size int
				all  bool
			}{1<<sh + 1<<(sh-1), true})
		}
	}
	return s
}()

// rstreamCount is how many transfers (or iterations) rstream runs of size bytes
// (common.c: size_to_count).
func rstreamCount(size int) int {
	switch {
	case size >= 1<<20:
		return 100
	case size >= 1<<16:
		return 1000
	case size >= 1<<10:
		return 10000
	}
	return 100000
}

// parseRstream reads rstream's options (those that change what moves; addresses, port,
// inline size and the blocking modes do not).
func parseRstream(args string) (rstreamRun, error) {
	r := rstreamRun{buffer: 1 << 19}
	custom, all := false, false
	size, count, iters := 1000, 1000, 1
	f := strings.Fields(args)
	for i := 0; i < len(f); i++ {
		arg := func() (string, error) {
			if i+1 >= len(f) {
				return "", fmt.Errorf("rstream %s: no value", f[i])
			}
			i++
			return f[i], nil
		}
		num := func() (int, error) {
			s, err := arg()
			if err != nil {
				return 0, err
			}
			return strconv.Atoi(s)
		}
		var err error
		switch f[i] {
		case "-S":
			var s string
			if s, err = arg(); err == nil {
				if strings.EqualFold(s, "all") {
					all = true
				} else {
					custom = true
					size, err = strconv.Atoi(s)
				}
			}
		case "-C":
			custom = true
			count, err = num()
		case "-I":
			custom = true
			iters, err = num()
		case "-B":
			r.buffer, err = num()
		case "-T":
			var s string
			if s, err = arg(); err == nil && (s == "v" || strings.EqualFold(s, "verify")) {
				r.verify = true
			}
		case "-s", "-b", "-f", "-i", "-p", "-k":
			_, err = arg()
		default:
			err = fmt.Errorf("rstream option %q not modelled", f[i])
		}
		if err != nil {
			return r, err
		}
	}
	if custom {
		r.conns = [][]rstreamTest{{{size, count, iters}}}
		return r, nil
	}
	var lat, bw []rstreamTest
	for _, s := range rstreamSizes {
		if s.all && !all {
			continue
		}
		lat = append(lat, rstreamTest{s.size, 1, rstreamCount(s.size)})
		bw = append(bw, rstreamTest{s.size, rstreamCount(s.size), 1})
	}
	r.conns = [][]rstreamTest{lat, bw}
	return r, nil
}

// rstreamPeer is softrnic's side of an rstream run: what rstream does, over
// softrnic's rsockets.
type rstreamPeer struct {
	run    rstreamRun
	client bool
	// The byte counters of -T v, across the run's connections.
	sendSeq, recvSeq byte
	received         int64
	buf              []byte
	log              strings.Builder
}

func (p *rstreamPeer) send(c *rsocket.Conn, n int) error {
	b := p.buf[:n]
	for i := range b {
		b[i] = p.sendSeq
		p.sendSeq++
	}
	if _, err := c.Write(b); err != nil {
		return fmt.Errorf("send %d bytes: %w", n, err)
	}
	return nil
}

func (p *rstreamPeer) recv(c *rsocket.Conn, n int) error {
	b := p.buf[:n]
	if _, err := io.ReadFull(c, b); err != nil {
		return fmt.Errorf("receive %d bytes (%d received before): %w", n, p.received, err)
	}
	if p.run.verify {
		for i, v := range b {
			if v != p.recvSeq {
				return fmt.Errorf("data verification failed at byte %d of the run: %#02x, want %#02x", p.received+int64(i), v, p.recvSeq)
			}
			p.recvSeq++
		}
	}
	p.received += int64(n)
	return nil
}

// conn runs one connection's tests, then waits for the peer's end of stream (rstream
// shuts its socket down after its last test) and closes.
func (p *rstreamPeer) conn(ctx context.Context, c *rsocket.Conn, tests []rstreamTest) error {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	first, second := p.recv, p.send
	if p.client {
		first, second = p.send, p.recv
	}
	for _, t := range tests {
		if len(p.buf) < t.size {
			p.buf = make([]byte, t.size)
		}
		if err := first(c, 16); err != nil {
			return fmt.Errorf("sync: %w", err)
		}
		if err := second(c, 16); err != nil {
			return fmt.Errorf("sync: %w", err)
		}
		start := time.Now()
		for range t.iters {
			for range t.count {
				if err := first(c, t.size); err != nil {
					return err
				}
			}
			for range t.count {
				if err := second(c, t.size); err != nil {
					return err
				}
			}
		}
		d := time.Since(start)
		fmt.Fprintf(&p.log, "%d bytes × %d transfers × %d iterations each way: %v (%.1f µs/transfer)\n",
			t.size, t.count, t.iters, d.Round(time.Millisecond), float64(d.Microseconds())/float64(2*t.count*t.iters))
	}
	var one [1]byte
	if n, err := c.Read(one[:]); n != 0 || err != io.EOF {
		return fmt.Errorf("after the last test: read %d bytes, %v (want the peer's end of stream)", n, err)
	}
	return nil
}

// rstreamCell is one cell: rstream in the guest with args (besides its address
// options), softrnic's side on the host in the other role.
type rstreamCell struct {
	name        string
	guestServer bool
	args        string
	timeout     time.Duration
}

// hostRsocketDevice opens a softrnic device at the host's address in the VM's namespace.
func hostRsocketDevice(t *testing.T, vm *rxevm.VM) *verbs.Device {
	var dev *verbs.Device
	err := vm.InNamespace(func() (err error) {
		dev, err = verbs.OpenDevice(verbs.DeviceConfig{Addr: vm.Info().HostAddr})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

func (c rstreamCell) run(t *testing.T, vm *rxevm.VM) {
	record(t, "rstream", c.guestServer, "rsocket; "+c.args)
	plan, err := parseRstream(c.args)
	if err != nil {
		t.Fatal(err)
	}
	in := vm.Info()
	timeout := c.timeout
	if timeout == 0 {
		timeout = 90 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	dev := hostRsocketDevice(t, vm)
	// rstream's SO_SNDBUF and SO_RCVBUF of n make rings of 2n.
	o := rsocket.Options{RecvBuffer: 2 * plan.buffer, SendBuffer: 2 * plan.buffer}
	peer := &rstreamPeer{run: plan, client: c.guestServer}

	before, err := vm.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	capPath := filepath.Join(t.TempDir(), "rstream.pcap")
	// The capture outlives the cell's context, so that a cell that timed out keeps it.
	capCtx, capCancel := context.WithTimeout(context.Background(), timeout+2*time.Minute)
	defer capCancel()
	stopCapture, err := ppCapture(capCtx, vm, capPath)
	if err != nil {
		t.Fatal(err)
	}

	var stats []rsocket.Stats
	var hostErr error
	var guestCmd, guestOut, guestErr string
	var guestRC int
	if c.guestServer {
		guestCmd = "rstream -b " + in.GuestAddr.String() + " " + c.args
		srv, err := vm.Spawn(guestCmd)
		if err != nil {
			t.Fatal(err)
		}
		if err := vm.WaitUntil(ctx, cmListening); err != nil {
			_ = srv.Signal("TERM")
			t.Fatalf("guest server not listening: %v", err)
		}
		d := rsocket.Dialer{Options: o}
		for _, tests := range plan.conns {
			var conn *rsocket.Conn
			conn, hostErr = d.Dial(ctx, dev, netip.AddrPortFrom(in.GuestAddr, rstreamPort))
			if hostErr != nil {
				break
			}
			hostErr = peer.conn(ctx, conn, tests)
			stats = append(stats, conn.Stats())
			if err := conn.Close(); err != nil && hostErr == nil {
				hostErr = fmt.Errorf("close: %w", err)
			}
			if hostErr != nil {
				break
			}
		}
		if hostErr != nil {
			_ = srv.Signal("TERM")
		}
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		guestOut, guestErr, guestRC, err = srv.Wait(wctx)
		wcancel()
		if err != nil {
			t.Errorf("guest server: %v", err)
		}
	} else {
		l, err := (&rsocket.ListenConfig{Options: o}).Listen(dev, rstreamPort)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		guestCmd = "rstream -s " + in.HostAddr.String() + " " + c.args
		cli, err := vm.Spawn(guestCmd)
		if err != nil {
			t.Fatal(err)
		}
		for _, tests := range plan.conns {
			var conn *rsocket.Conn
			conn, hostErr = acceptUntil(ctx, l, cli.Done())
			if hostErr != nil {
				break
			}
			hostErr = peer.conn(ctx, conn, tests)
			stats = append(stats, conn.Stats())
			if err := conn.Close(); err != nil && hostErr == nil {
				hostErr = fmt.Errorf("close: %w", err)
			}
			if hostErr != nil {
				break
			}
		}
		if hostErr != nil {
			_ = cli.Signal("TERM")
		}
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		guestOut, guestErr, guestRC, err = cli.Wait(wctx)
		wcancel()
		if err != nil {
			t.Errorf("guest client: %v", err)
		}
	}
	capErr := stopCapture()
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	after, err := vm.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rxe := after.Sub(before)
	devc := cmtool.Read(dev)
	t.Logf("guest: %s (exit %d)\n%s%s", guestCmd, guestRC, guestOut, guestErr)
	t.Logf("host (rsocket, %d-byte rings):\n%s", o.RecvBuffer, peer.log.String())
	t.Logf("rsocket stats: %+v", stats)
	t.Logf("softrnic device:\n%s", devc.Lines("  "))
	t.Logf("rxe counters: %v", rxe)
	if hostErr != nil {
		t.Errorf("softrnic's side: %v", hostErr)
		if dm, _, _, err := vm.Exec(ctx, "dmesg | tail -n 30"); err == nil {
			t.Logf("guest dmesg:\n%s", dm)
		}
	}
	if guestRC != 0 {
		t.Errorf("rstream exited %d", guestRC)
	}
	// rstream prints a line per test (its name, the size, transfers, iterations, bytes)
	// and an error message (perror) for a failed call; a test that failed has no line.
	tests := 0
	for _, ts := range plan.conns {
		tests += len(ts)
	}
	lines := 0
	for _, l := range strings.Split(guestOut, "\n") {
		if f := strings.Fields(l); len(f) == 8 && f[0] != "name" {
			lines++
		}
	}
	if lines != tests {
		t.Errorf("rstream printed %d result lines, want %d", lines, tests)
	}
	if strings.Contains(guestOut+guestErr, "failed") || strings.TrimSpace(guestErr) != "" {
		t.Errorf("rstream reported an error")
	}
	if len(devc.Errors) > 0 {
		t.Errorf("softrnic's device counted errors: %s", cmtool.ErrorsLine(devc.Errors))
	}
	for i, s := range stats {
		if s.Violations != 0 {
			t.Errorf("connection %d: %d protocol violations", i+1, s.Violations)
		}
	}
	for _, name := range []string{"rcvd_seq_err", "out_of_seq_request", "retry_exceeded_err", "retry_rnr_exceeded_err", "send_err"} {
		if rxe[name] != 0 {
			t.Errorf("rxe counter %s = %d", name, rxe[name])
		}
	}
	var drop *captureDropError
	if errors.As(capErr, &drop) {
		t.Logf("capture incomplete (the checks below cover what it holds): %v", capErr)
	} else if capErr != nil {
		t.Fatalf("capture: %v", capErr)
	}
	r, err := CheckCapture(capPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bridge: %v", r)
	if err := r.Err(); err != nil {
		t.Error(err)
	}
	if r.Packets == 0 {
		t.Error("no RoCEv2 packet on the bridge")
	}
	if t.Failed() {
		t.Logf("capture kept at %s", keepCapture(t, capPath))
	}
}

// acceptUntil accepts the next connection, giving up when ctx ends or the guest's
// client exits.
func acceptUntil(ctx context.Context, l *rsocket.Listener, exited <-chan struct{}) (*rsocket.Conn, error) {
	type result struct {
		c   *rsocket.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := l.AcceptRsocket()
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		l.Close()
		return nil, ctx.Err()
	case <-exited:
		l.Close()
		r := <-ch
		if r.err == nil {
			return r.c, nil
		}
		return nil, errors.New("the guest's client exited before it connected")
	}
}

// TestRstream: librdmacm's rstream (rsockets over rxe) against softrnic's rsocket
// package, both ways: the connect data in rdma_cm's private data, data as RDMA WRITE
// WITH IMMEDIATE into the peer's ring, grants and credits, shutdown; every byte checked
// by both sides (-T v).
func TestRstream(t *testing.T) {
	vm := sharedVM(t)
	for _, c := range []rstreamCell{
		{name: "guest-server/64x100", guestServer: true, args: "-S 64 -C 100 -T v"},
		{name: "host-server/64x100", args: "-S 64 -C 100 -T v"},
		{name: "guest-server/64Kx100", guestServer: true, args: "-S 65536 -C 100 -T v"},
		{name: "host-server/64Kx100", args: "-S 65536 -C 100 -T v"},
		{name: "guest-server/1Mx10", guestServer: true, args: "-S 1048576 -C 10 -T v"},
		{name: "host-server/1Mx10", args: "-S 1048576 -C 10 -T v"},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, vm) })
	}
}

// keepCapture copies a failed cell's capture out of its test's temporary directory, for
// tshark (its InfiniBand dissector decodes RoCEv2 on port 4791), and returns the copy's path.
func keepCapture(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	dst := filepath.Join(os.TempDir(), "softrnic-interop-"+name+".pcap")
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		return err.Error()
	}
	return dst
}
