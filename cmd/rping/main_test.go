package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/internal/cmtool/cmtooltest"
	"github.com/softrnic/softrnic/verbs"
)

// collector is an output whose results and text are kept.
type collector struct {
	mu       sync.Mutex
	out, log cmtooltest.Buffer
	results  []*Result
	emitted  chan struct{} // one token per result
}

func (c *collector) output() *output {
	c.emitted = make(chan struct{}, 16)
	return &output{Out: &c.out, Log: &c.log,
		Emit: func(r *Result) {
			c.mu.Lock()
			c.results = append(c.results, r)
			c.mu.Unlock()
			c.emitted <- struct{}{}
		}}
}

// pair runs a server on srvIP and a client on cliIP in this process (ephemeral UDP ports;
// the client dials once the server listens) and returns both collectors.
func pair(t *testing.T, srvIP, cliIP string, srv, cli Config) (cs, cc *collector) {
	t.Helper()
	cs, cc = &collector{}, &collector{}
	serr, cerr := cmtooltest.Pair(t, srvIP, cliIP,
		func(ctx context.Context, dev *verbs.Device, listening func(netip.AddrPort)) error {
			srv.Server, srv.Device, srv.Listening = true, dev, listening
			return run(ctx, &srv, cs.output())
		},
		func(ctx context.Context, dev *verbs.Device, la netip.AddrPort, peerPort int) error {
			cli.Device, cli.Addr, cli.Port, cli.PeerPort = dev, la.Addr(), int(la.Port()), peerPort
			return run(ctx, &cli, cc.output())
		})
	if cerr != nil || serr != nil {
		t.Fatalf("client: %v\n%s%s\nserver: %v\n%s%s", cerr, cc.out.String(), cc.log.String(), serr, cs.out.String(), cs.log.String())
	}
	return cs, cc
}

// ping returns rping's data for ping n of size bytes, as the C tool prints it.
func ping(n, size int) string {
	b := make([]byte, size)
	start := byte(65)
	for range n {
		start = nextStart(start)
	}
	fillPing(b, n, start)
	return string(cstring(b))
}

// Both roles both ways round (server on 127.0.0.2 and on 127.0.0.1), one-packet and
// multi-packet pings, -v -V: every ping's data comes back, the client compares it and
// prints it, the server prints what it read and checks it against rping's pattern.
func TestLoopback(t *testing.T) {
	for _, size := range []int{64, 10000} {
		for _, ips := range [][2]string{{"127.0.0.2", "127.0.0.1"}, {"127.0.0.1", "127.0.0.2"}} {
			t.Run(fmt.Sprintf("S%d/server=%s", size, ips[0]), func(t *testing.T) {
				t.Parallel()
				const count = 10
				c := Config{Count: count, Size: size, Verbose: true, Validate: true, Port: 7174}
				cs, cc := pair(t, ips[0], ips[1], c, c)
				var wantC, wantS strings.Builder
				for i := range count {
					fmt.Fprintf(&wantC, "ping data: %s\n", ping(i, size))
					fmt.Fprintf(&wantS, "server ping data: %s\n", ping(i, size))
				}
				if got := cc.out.String(); got != wantC.String() {
					t.Errorf("client printed\n%s\nwant\n%s", got, wantC.String())
				}
				if got := cs.out.String(); got != wantS.String() {
					t.Errorf("server printed\n%s\nwant\n%s", got, wantS.String())
				}
				if !strings.Contains(cs.log.String(), "server DISCONNECT EVENT...") || !strings.Contains(cc.log.String(), "client DISCONNECT EVENT...") {
					t.Errorf("stderr: server %q client %q", cs.log.String(), cc.log.String())
				}
				if len(cs.results) != 1 || len(cc.results) != 1 {
					t.Fatalf("%d server and %d client results", len(cs.results), len(cc.results))
				}
				for _, r := range []*Result{cs.results[0], cc.results[0]} {
					if !r.OK || r.Pings != count || r.Mismatches != 0 || r.Errors != nil || r.CM.Established != 1 {
						t.Errorf("%s: %+v", r.Role, r)
					}
				}
				if r := cs.results[0]; r.Ended != "disconnected by the peer" {
					t.Errorf("server: ended %q", r.Ended)
				}
				if r := cc.results[0]; r.Ended != "disconnected" || r.PeerQPN != cs.results[0].QPN {
					t.Errorf("client: ended %q, peer QPN %#x (the server's %#x)", r.Ended, r.PeerQPN, cs.results[0].QPN)
				}
			})
		}
	}
}

// rping's data: the format, the letters from 'A' + ping, the wrap after 'z', snprintf's
// truncation at the smallest size, the NUL at the end.
func TestPattern(t *testing.T) {
	if got, want := ping(0, 30), "rdma-ping-0: ABCDEFGHIJKLMNOP"; got != want {
		t.Errorf("ping 0: %q, want %q", got, want)
	}
	if got, want := ping(1, 30), "rdma-ping-1: BCDEFGHIJKLMNOPQ"; got != want {
		t.Errorf("ping 1: %q, want %q", got, want)
	}
	// Ping 57 starts at 'z' (65 + 57 = 122); ping 58 at 'A' again.
	if got, want := ping(57, 20), "rdma-ping-57: zABCD"; got != want {
		t.Errorf("ping 57: %q, want %q", got, want)
	}
	if got, want := ping(58, 20), "rdma-ping-58: ABCDE"; got != want {
		t.Errorf("ping 58: %q, want %q", got, want)
	}
	// Letters run to 'z' and start over at 'A' within one ping.
	if got := ping(0, 13+58+3+1); !strings.HasSuffix(got, "xyzABC") {
		t.Errorf("ping 0: %q does not wrap after 'z'", got)
	}
	b := make([]byte, minSize)
	fillPing(b, 1234567890, 'A')
	if got, want := string(b), "rdma-ping-1234567890: \x00"; got != want {
		t.Errorf("size %d: %q, want %q", minSize, got, want)
	}
}

// -P: the server serves two clients, one after the other, and ends when interrupted.
func TestPersistent(t *testing.T) {
	ds := cmtooltest.OpenDevice(t, "127.0.0.2")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	listening := make(chan netip.AddrPort, 1)
	srv := Config{Server: true, Persistent: true, Validate: true,
		Local: cmtool.Local{Device: ds, Listening: func(a netip.AddrPort) { listening <- a }}}
	cs := &collector{}
	srvErr := make(chan error, 1)
	go func() { srvErr <- run(sctx, &srv, cs.output()) }()
	la := <-listening
	for i := range 2 {
		cc := &collector{}
		cli := Config{Addr: la.Addr(), Port: int(la.Port()), Count: 3 + i, Validate: true,
			Local: cmtool.Local{Device: cmtooltest.OpenDevice(t, "127.0.0.1"), PeerPort: int(ds.Addr().Port())}}
		if err := run(ctx, &cli, cc.output()); err != nil {
			t.Fatalf("client %d: %v\n%s", i, err, cc.log.String())
		}
	}
	// Each connection's result is emitted when the server has seen it end.
	for range 2 {
		select {
		case <-cs.emitted:
		case <-ctx.Done():
			t.Fatal("the server did not report both connections")
		}
	}
	stop()
	if err := <-srvErr; err != nil {
		t.Fatalf("server: %v", err)
	}
	if len(cs.results) != 2 {
		t.Fatalf("%d results, want 2", len(cs.results))
	}
	pings := map[int]bool{}
	for _, r := range cs.results {
		if !r.OK {
			t.Errorf("server: %+v", r)
		}
		pings[r.Pings] = true
	}
	if !pings[3] || !pings[4] {
		t.Errorf("server pings %v, want 3 and 4", pings)
	}
}

// A client without a count pings until the server goes away: the server's disconnect
// ends it cleanly.
func TestServerDisconnects(t *testing.T) {
	ds, dc := cmtooltest.OpenDevice(t, "127.0.0.2"), cmtooltest.OpenDevice(t, "127.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sctx, stopServer := context.WithCancel(ctx)
	listening := make(chan netip.AddrPort, 1)
	srv := Config{Server: true, Local: cmtool.Local{Device: ds, Listening: func(a netip.AddrPort) { listening <- a }}}
	cs := &collector{}
	srvErr := make(chan error, 1)
	go func() { srvErr <- run(sctx, &srv, cs.output()) }()
	la := <-listening
	cc := &collector{}
	cli := Config{Addr: la.Addr(), Port: int(la.Port()), Validate: true, Local: cmtool.Local{Device: dc, PeerPort: int(ds.Addr().Port())}}
	// Stop the server once the client has printed a few pings.
	w := &triggerWriter{n: 5, fn: stopServer}
	o := cc.output()
	o.Out = w
	cli.Verbose = true
	cerr := run(ctx, &cli, o)
	<-srvErr // the server's error is the interruption
	if cerr != nil {
		t.Fatalf("client: %v\n%s", cerr, cc.log.String())
	}
	if len(cc.results) != 1 || cc.results[0].Ended != "disconnected by the peer" || cc.results[0].Pings < 5 || !cc.results[0].OK {
		t.Fatalf("client: %+v", cc.results)
	}
}

// triggerWriter calls fn once it has seen n lines.
type triggerWriter struct {
	mu    sync.Mutex
	n     int
	lines int
	fn    func()
}

func (w *triggerWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines += bytes.Count(p, []byte("\n"))
	if w.lines >= w.n && w.fn != nil {
		w.fn()
		w.fn = nil
	}
	return len(p), nil
}

// The command line as rping's getopt reads it.
func TestArgs(t *testing.T) {
	var stderr bytes.Buffer
	cfg, o, err := parseArgs(strings.Fields("-svVC10 -a 10.77.0.1 -S100 -p 7000 --json --udp-port 4792"), &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Server || !cfg.Verbose || !cfg.Validate || cfg.Count != 10 || cfg.Addr != netip.MustParseAddr("10.77.0.1") ||
		cfg.Size != 100 || cfg.Port != 7000 || !o.JSON || cfg.UDPPort != 4792 {
		t.Errorf("%+v %+v", cfg, o)
	}
	cfg, _, err = parseArgs(strings.Fields("-c -a 10.77.0.6 -v -V -C 10 -I 10.77.0.1"), &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server || cfg.Count != 10 || cfg.Source != netip.MustParseAddr("10.77.0.1") || cfg.Size != defaultSize || cfg.Port != defaultPort {
		t.Errorf("%+v", cfg)
	}
	for _, bad := range []string{"-s -S 22 -a 1.2.3.4", "-s -S 65536 -a 1.2.3.4", "-a 1.2.3.4", "-s -c -a 1.2.3.4", "-c -a 1.2.3.4 extra", "-c -t 3 -a 1.2.3.4"} {
		if _, _, err := parseArgs(strings.Fields(bad), &stderr); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	c := &Config{Count: -1}
	c.defaults()
	if c.validate() == nil {
		t.Error("count -1 accepted")
	}
}
