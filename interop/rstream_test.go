//go:build linux

package interop

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
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
		}{1 << sh, sh != 6 && sh != 12 && sh != 16 && sh != 20})
		if sh > 6 {
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
	// skip, if set, is why the cell does not run.
	skip string
}

func (c rstreamCell) run(t *testing.T, vm *rxevm.VM) {
	record(t, "rstream", c.guestServer, "rsocket; "+c.args)
	if c.skip != "" {
		t.Skip(c.skip)
	}
	plan, err := parseRstream(c.args)
	if err != nil {
		t.Fatal(err)
	}
	peer := &rstreamPeer{run: plan, client: c.guestServer}
	rc := rsocketCell{guestServer: c.guestServer, conns: len(plan.conns), timeout: c.timeout,
		// rstream's SO_SNDBUF and SO_RCVBUF of n make rings of 2n.
		options: rsocket.Options{RecvBuffer: 2 * plan.buffer, SendBuffer: 2 * plan.buffer},
		host: func(ctx context.Context, conn *rsocket.Conn, i int) error {
			return peer.conn(ctx, conn, plan.conns[i])
		}}
	if c.guestServer {
		rc.guest = "rstream -b $GUEST " + c.args
	} else {
		rc.guest = "rstream -s $HOST " + c.args
	}
	res := rc.run(t, vm)
	t.Logf("host (rsocket, %d-byte rings):\n%s", rc.options.RecvBuffer, peer.log.String())
	if res.hostErr != nil {
		t.Errorf("softrnic's side: %v", res.hostErr)
	}
	if res.guestRC != 0 {
		t.Errorf("rstream exited %d", res.guestRC)
	}
	// rstream prints a line per test (its name, the size, transfers, iterations, bytes)
	// and an error message (perror) for a failed call; a test that failed has no line.
	tests := 0
	for _, ts := range plan.conns {
		tests += len(ts)
	}
	lines := 0
	for _, l := range strings.Split(res.guestOut, "\n") {
		if f := strings.Fields(l); len(f) == 8 && f[0] != "name" {
			lines++
		}
	}
	if lines != tests {
		t.Errorf("rstream printed %d result lines, want %d", lines, tests)
	}
	if strings.Contains(res.guestOut+res.guestErr, "failed") || strings.TrimSpace(res.guestErr) != "" {
		t.Errorf("rstream reported an error")
	}
}

// rsocketCell runs a librdmacm program in the guest (guest, with $GUEST and $HOST for
// the addresses) against softrnic's rsocket package on the host: a softrnic device at the
// host's address in the VM's namespace, which dials the guest's listener at rstreamPort
// (guestServer) or listens there, and runs host on each of conns connections in turn.
type rsocketCell struct {
	guestServer bool
	guest       string
	conns       int
	options     rsocket.Options
	host        func(ctx context.Context, c *rsocket.Conn, i int) error
	timeout     time.Duration
}

// rsocketResult is what a cell's two sides did.
type rsocketResult struct {
	guestOut, guestErr string
	guestRC            int
	hostErr            error // the first error of host, a dial, an accept or a Close
	stats              []rsocket.Stats
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

// run runs the cell and checks what every cell must show whatever the programs did:
// every RoCEv2 packet on the bridge with a valid ICRC and to port 4791, no error counted
// by rxe or by softrnic's device, and no protocol violation seen by softrnic's side. The
// caller judges the programs' results.
func (c rsocketCell) run(t *testing.T, vm *rxevm.VM) rsocketResult {
	in := vm.Info()
	timeout := c.timeout
	if timeout == 0 {
		timeout = 90 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	dev := hostRsocketDevice(t, vm)
	var res rsocketResult

	before, err := vm.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	capPath := filepath.Join(t.TempDir(), "rsocket.pcap")
	// The capture outlives the cell's context, so that a cell that timed out keeps it.
	capCtx, capCancel := context.WithTimeout(context.Background(), timeout+2*time.Minute)
	defer capCancel()
	stopCapture, err := ppCapture(capCtx, vm, capPath)
	if err != nil {
		t.Fatal(err)
	}

	guestCmd := expand(c.guest, in)
	var l *rsocket.Listener
	if !c.guestServer {
		if l, err = (&rsocket.ListenConfig{Options: c.options}).Listen(dev, rstreamPort); err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	job, err := vm.Spawn(guestCmd)
	if err != nil {
		t.Fatal(err)
	}
	if c.guestServer {
		if err := vm.WaitUntil(ctx, cmListening); err != nil {
			_ = job.Signal("TERM")
			t.Fatalf("guest server not listening: %v", err)
		}
	}
	d := rsocket.Dialer{Options: c.options}
	for i := range c.conns {
		var conn *rsocket.Conn
		if c.guestServer {
			conn, res.hostErr = d.Dial(ctx, dev, netip.AddrPortFrom(in.GuestAddr, rstreamPort))
		} else {
			conn, res.hostErr = acceptUntil(ctx, l, job.Done())
		}
		if res.hostErr != nil {
			res.hostErr = fmt.Errorf("connection %d: %w", i+1, res.hostErr)
			break
		}
		stalled := watchProgress(conn, stallLimit)
		res.hostErr = c.host(ctx, conn, i)
		if stalled() && res.hostErr != nil {
			res.hostErr = fmt.Errorf("%w (nothing arrived for %v: the connection was given up)", res.hostErr, stallLimit)
		}
		res.stats = append(res.stats, conn.Stats())
		if err := conn.Close(); err != nil && res.hostErr == nil {
			res.hostErr = fmt.Errorf("close: %w", err)
		}
		if res.hostErr != nil {
			res.hostErr = fmt.Errorf("connection %d: %w", i+1, res.hostErr)
			break
		}
	}
	if res.hostErr != nil {
		select {
		case <-job.Done():
		default:
			// Where the guest's program waits, for the report.
			gctx, gcancel := context.WithTimeout(context.Background(), time.Minute)
			out, _, _, _ := vm.Exec(gctx, "command -v gdb >/dev/null && for p in $(pidof "+strings.Fields(guestCmd)[0]+
				"); do gdb -p $p -batch -ex 'thread apply all bt' 2>&1 | grep '^#'; done")
			gcancel()
			t.Logf("the guest's program, still running:\n%s", out)
		}
		_ = job.Signal("TERM")
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	res.guestOut, res.guestErr, res.guestRC, err = job.Wait(wctx)
	wcancel()
	if err != nil {
		t.Errorf("guest: %v", err)
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
	t.Logf("guest: %s (exit %d)\n%s%s", guestCmd, res.guestRC, res.guestOut, res.guestErr)
	t.Logf("softrnic's side: %v; rsocket stats: %+v", res.hostErr, res.stats)
	t.Logf("softrnic device:\n%s", devc.Lines("  "))
	t.Logf("rxe counters: %v", rxe)
	if res.hostErr != nil || res.guestRC != 0 {
		if lost := int64(rxe["sent_pkts"]) - int64(devc.Device.RxPackets); lost > 0 {
			t.Logf("rxe sent %d packets more than softrnic's device received: lost between the guest's "+
				"stack and the host's socket (the host's UDP counters follow)", lost)
		}
		if snmp, err := vm.HostCommand(ctx, "grep", "^Udp:", "/proc/net/snmp").CombinedOutput(); err == nil {
			t.Logf("host namespace UDP counters:\n%s", snmp)
		}
		if dm, _, _, err := vm.Exec(ctx, "dmesg | tail -n 20"); err == nil {
			t.Logf("guest dmesg (tail):\n%s", dm)
		}
	}
	if len(devc.Errors) > 0 {
		t.Errorf("softrnic's device counted errors: %s", cmtool.ErrorsLine(devc.Errors))
	}
	for i, s := range res.stats {
		if s.Violations != 0 {
			t.Errorf("connection %d: %d protocol violations", i+1, s.Violations)
		}
	}
	checkRxe(t, rxe, false)
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
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("capture kept at %s", keepCapture(t, capPath))
		}
	})
	return res
}

// stallLimit is how long a cell's connection may go without receiving a message or a
// grant before the cell gives it up, rather than waiting out the cell's whole timeout.
const stallLimit = time.Minute

// watchProgress watches what c receives until the returned function is called; when
// nothing arrives for limit, it ends c's blocked calls (a deadline in the past). The
// function stops the watch and says whether it gave up.
func watchProgress(c *rsocket.Conn, limit time.Duration) (stop func() (stalled bool)) {
	done := make(chan struct{})
	var gaveUp atomic.Bool
	go func() {
		tick := time.NewTicker(limit / 12)
		defer tick.Stop()
		last, since := c.Stats(), time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				s := c.Stats()
				if s.Messages != last.Messages || s.Grants != last.Grants {
					last, since = s, now
				} else if now.Sub(since) >= limit {
					gaveUp.Store(true)
					c.SetDeadline(time.Unix(1, 0))
					return
				}
			}
		}
	}()
	return func() bool {
		close(done)
		return gaveUp.Load()
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

// TestParseRstream: the tests an rstream command line runs (no VM).
func TestParseRstream(t *testing.T) {
	r, err := parseRstream("-T v")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]rstreamTest{
		{{64, 1, 100000}, {4096, 1, 10000}, {65536, 1, 1000}, {1 << 20, 1, 100}},
		{{64, 100000, 1}, {4096, 10000, 1}, {65536, 1000, 1}, {1 << 20, 100, 1}},
	}
	if !r.verify || r.buffer != 1<<19 || fmt.Sprint(r.conns) != fmt.Sprint(want) {
		t.Errorf("default: %+v, want %v", r, want)
	}
	if r, _ := parseRstream("-S all"); len(r.conns) != 2 || len(r.conns[0]) != 33 || r.conns[0][2].size != 192 || r.conns[1][32].size != 6<<20 || r.verify {
		t.Errorf("-S all: %+v", r)
	}
	if r, _ := parseRstream("-S 100 -C 7 -B 4096"); fmt.Sprint(r.conns) != "[[{100 7 1}]]" || r.buffer != 4096 {
		t.Errorf("custom: %+v", r)
	}
}

// TestRstream: librdmacm's rstream (rsockets over rxe) against softrnic's rsocket
// package, both ways: the connect data in rdma_cm's private data, data as RDMA WRITE
// WITH IMMEDIATE into the peer's ring, grants and credits, shutdown; every byte checked
// by both sides (-T v).
func TestRstream(t *testing.T) {
	sharedVM(t) // skips the whole test where the VM cannot run
	for _, c := range []rstreamCell{
		{name: "guest-server/64x100", guestServer: true, args: "-S 64 -C 100 -T v"},
		{name: "host-server/64x100", args: "-S 64 -C 100 -T v"},
		{name: "guest-server/64Kx100", guestServer: true, args: "-S 65536 -C 100 -T v"},
		{name: "host-server/64Kx100", args: "-S 65536 -C 100 -T v"},
		{name: "guest-server/1Mx10", guestServer: true, args: "-S 1048576 -C 10 -T v"},
		{name: "host-server/1Mx10", args: "-S 1048576 -C 10 -T v"},
		// Rings of 10000 bytes: grants of 5000, which 1000-byte transfers written in
		// chunks of up to 2048 bytes cross, and many of them.
		{name: "guest-server/small-ring", guestServer: true, args: "-S 1000 -C 300 -B 5000 -T v"},
		{name: "host-server/small-ring", args: "-S 1000 -C 300 -B 5000 -T v"},
		// Keep-alives every second: zero-length RDMA WRITEs (no immediate) with a zero
		// address and R_Key.
		{name: "guest-server/keepalive", guestServer: true, args: "-S 65536 -C 300 -k 1 -T v"},
		{name: "host-server/keepalive", args: "-S 65536 -C 300 -k 1 -T v"},
		{name: "guest-server/default", guestServer: true, args: "-T v", timeout: 10 * time.Minute, skip: longCell("rstream's " +
			"default set as the server: twice in CI, 67 packets rxe counted as sent never reached softrnic, rxe stopped " +
			"sending, the guest lost its network and its kernel warned in rxe's QP teardown (see docs/interop.md); 2.5 minutes")},
		{name: "host-server/default", args: "-T v", timeout: 10 * time.Minute, skip: longCell("rstream's default set as " +
			"the client: stalled in two runs of four before softrnic's waiting calls polled, passed five of five since " +
			"(see docs/interop.md, rsockets); 2.5 minutes")},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, sharedVM(t)) })
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

// TestRspreload: a plain TCP program in the guest, curl, under
// LD_PRELOAD=librspreload.so (librdmacm's interposer, which turns a program's TCP
// sockets into rsockets) fetches a page that softrnic's side serves with net/http's
// request and response code over an rsocket. (The program must create its socket as
// plain SOCK_STREAM: the rsocket() of the rdma-core here (44) refuses a type with
// SOCK_CLOEXEC, which perl and python pass, and the interposer then falls back to TCP.)
func TestRspreload(t *testing.T) {
	vm := sharedVM(t)
	const lib = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so"
	execOK(t, vm, time.Minute, "test -e "+lib)
	const body = "served by net/http over softrnic's rsockets\n"
	guest := fmt.Sprintf("LD_PRELOAD=%s curl -sS --max-time 60 http://$HOST:%d/rsocket", lib, rstreamPort)
	c := rsocketCell{guest: guest, conns: 1,
		host: func(ctx context.Context, conn *rsocket.Conn, i int) error {
			if dl, ok := ctx.Deadline(); ok {
				conn.SetDeadline(dl)
			}
			req, err := http.ReadRequest(bufio.NewReader(conn))
			if err != nil {
				return err
			}
			if req.URL.Path != "/rsocket" {
				return fmt.Errorf("request for %q", req.URL.Path)
			}
			resp := &http.Response{StatusCode: 200, ProtoMajor: 1, ProtoMinor: 1, Request: req,
				ContentLength: int64(len(body)), Body: io.NopCloser(strings.NewReader(body)), Header: http.Header{}}
			if err := resp.Write(conn); err != nil {
				return err
			}
			var one [1]byte
			if n, err := conn.Read(one[:]); n != 0 || err != io.EOF {
				return fmt.Errorf("after the response: read %d bytes, %v (want the peer's end of stream)", n, err)
			}
			return nil
		}}
	record(t, "curl (rspreload)", false, "LD_PRELOAD=librspreload.so; HTTP GET")
	res := c.run(t, vm)
	if res.hostErr != nil || res.guestRC != 0 || res.guestOut != body {
		t.Errorf("softrnic: %v; guest exit %d, output %q", res.hostErr, res.guestRC, res.guestOut)
	}
}
