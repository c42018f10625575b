package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/internal/cmtool/cmtooltest"
	"github.com/softrnic/softrnic/internal/streamtool"
	"github.com/softrnic/softrnic/verbs"
)

// collector is an output whose results and text are kept.
type collector struct {
	mu       sync.Mutex
	out, log cmtooltest.Buffer
	results  []*Result
}

func (c *collector) output() *output {
	return &output{Out: &c.out, Log: &c.log, Emit: func(r *Result) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.results = append(c.results, r)
	}}
}

// transports are the two a run may use: rsockets on softrnic devices, and Go's TCP.
var transports = []struct {
	name    string
	sockets bool
}{{"rsocket", false}, {"tcp", true}}

// pair runs a server on 127.0.0.2 and a client on 127.0.0.1 in this process: rsockets on
// devices with ephemeral UDP ports, or TCP on an ephemeral port (-T s). The client dials
// once the server listens.
func pair(t *testing.T, srv, cli Config) (cs, cc *collector) {
	t.Helper()
	cs, cc = &collector{}, &collector{}
	serr, cerr := cmtooltest.Pair(t, "127.0.0.2", "127.0.0.1",
		func(ctx context.Context, dev *verbs.Device, listening func(netip.AddrPort)) error {
			srv.Bind, srv.Listening = netip.MustParseAddr("127.0.0.2"), listening
			if srv.Sockets {
				srv.Port = 0
			} else {
				srv.Device, srv.Port = dev, defaultPort
			}
			return run(ctx, &srv, cs.output())
		},
		func(ctx context.Context, dev *verbs.Device, la netip.AddrPort, peerPort int) error {
			cli.ServerAddr, cli.Port = la.Addr(), int(la.Port())
			if !cli.Sockets {
				cli.Device, cli.PeerPort = dev, peerPort
			}
			return run(ctx, &cli, cc.output())
		})
	if cerr != nil || serr != nil {
		t.Fatalf("client: %v\n%s%s\nserver: %v\n%s%s", cerr, cc.out.String(), cc.log.String(), serr, cs.out.String(), cs.log.String())
	}
	return cs, cc
}

// checkResults checks that both sides reported the tests named, on the connections given,
// each with its size, transfers and iterations, and clean counters.
func checkResults(t *testing.T, transport string, cs, cc *collector, want []Result) {
	t.Helper()
	for _, side := range []struct {
		role string
		c    *collector
	}{{"server", cs}, {"client", cc}} {
		rs := side.c.results
		if len(rs) != len(want) {
			t.Fatalf("%s: %d results, want %d\n%s", side.role, len(rs), len(want), side.c.out.String())
		}
		lines := strings.Split(strings.TrimSuffix(side.c.out.String(), "\n"), "\n")
		if len(lines) != len(want)+1 || lines[0]+"\n" != streamtool.Header() {
			t.Errorf("%s printed\n%s", side.role, side.c.out.String())
		}
		for i, w := range want {
			r := rs[i]
			if r.Test != w.Test || r.Connection != w.Connection || r.Size != w.Size || r.Xfers != w.Xfers || r.Iters != w.Iters ||
				r.Bytes != int64(w.Size)*int64(w.Xfers)*int64(w.Iters)*2 || r.Role != side.role || r.Transport != transport ||
				r.Verified != w.Verified {
				t.Errorf("%s result %d: %+v, want %+v", side.role, i, r, w)
			}
			if i+1 < len(lines) && lines[i+1]+"\n" != r.Row() {
				t.Errorf("%s line %d: %q, want %q", side.role, i+1, lines[i+1], r.Row())
			}
			if transport == "rsocket" {
				if r.Rsocket == nil || r.Rsocket.Violations != 0 || r.Counters == nil || len(r.Counters.Errors) != 0 {
					t.Errorf("%s %s: rsocket stats %+v, counters %+v", side.role, r.Test, r.Rsocket, r.Counters)
				}
			}
		}
	}
}

// One custom test (-S -C -I) on one connection, every byte checked on both sides (-T v),
// over rsockets and over TCP.
func TestCustom(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			c := Config{Custom: true, Size: 10000, Count: 20, Iters: 3, Verify: true, Sockets: tr.sockets}
			cs, cc := pair(t, c, c)
			checkResults(t, tr.name, cs, cc, []Result{{Test: "custom", Connection: 1, Size: 10000, Xfers: 20, Iters: 3, Verified: true}})
		})
	}
}

// The default run, with short counts: the latency set on a first connection, then the
// bandwidth set on a second, every byte checked.
func TestSizeSets(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			short := func(size int) int { return max(2, 8<<10/size) }
			c := Config{Verify: true, Sockets: tr.sockets, CountFor: short}
			cs, cc := pair(t, c, c)
			var want []Result
			for _, kind := range []string{"lat", "bw"} {
				for _, size := range []int{64, 4096, 65536, 1 << 20} {
					r := Result{Test: streamtool.TestName(size, kind), Size: size, Xfers: 1, Iters: short(size), Connection: 1, Verified: true}
					if kind == "bw" {
						r.Xfers, r.Iters, r.Connection = short(size), 1, 2
					}
					want = append(want, r)
				}
			}
			checkResults(t, tr.name, cs, cc, want)
		})
	}
}

// -S all runs every size of rstream's table, in its order, in both sets.
func TestAllSizes(t *testing.T) {
	one := func(int) int { return 1 }
	c := Config{AllSizes: true, Sockets: true, CountFor: one}
	cs, cc := pair(t, c, c)
	var want []Result
	for _, kind := range []string{"lat", "bw"} {
		for _, s := range streamtool.Sizes {
			conn := 1
			if kind == "bw" {
				conn = 2
			}
			want = append(want, Result{Test: streamtool.TestName(s.Size, kind), Size: s.Size, Xfers: 1, Iters: 1, Connection: conn})
		}
	}
	checkResults(t, "tcp", cs, cc, want)
	if got := cc.results[len(want)-1].Test; got != "6m_bw" {
		t.Errorf("last test %q, want 6m_bw", got)
	}
	if got := cc.results[2].Test; got != "192_lat" {
		t.Errorf("third test %q, want 192_lat", got)
	}
}

// -T v on one side only, one transfer per iteration: the other side sends back what it
// received, which is the pattern. (With more transfers per iteration it sends the last
// one received again and again, as rstream's one buffer does, and the check fails.)
func TestVerifyOneSide(t *testing.T) {
	srv := Config{Custom: true, Size: 3000, Count: 1, Iters: 5}
	cli := srv
	cli.Verify = true
	cs, cc := pair(t, srv, cli)
	if !cc.results[0].Verified || cs.results[0].Verified {
		t.Errorf("verified: client %v server %v", cc.results[0].Verified, cs.results[0].Verified)
	}
}

// scriptedServer accepts connections on a TCP listener and runs each through serve, in
// order; it returns the listener's address and the errors of serve, one per connection.
func scriptedServer(t *testing.T, serve ...func(c net.Conn) error) (netip.AddrPort, <-chan error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	errs := make(chan error, len(serve))
	go func() {
		for _, s := range serve {
			c, err := l.Accept()
			if err != nil {
				errs <- err
				return
			}
			err = s(c)
			c.Close()
			errs <- err
		}
	}()
	return l.Addr().(*net.TCPAddr).AddrPort(), errs
}

// expect reads n bytes from c and compares them with rstream's pattern at *next.
func expect(c net.Conn, n int, next *byte) error {
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		return fmt.Errorf("reading %d bytes: %w", n, err)
	}
	for i, x := range b {
		if x != *next {
			return fmt.Errorf("byte %d of %d: %d, want %d", i, n, x, *next)
		}
		*next++
	}
	return nil
}

// answer writes n bytes of the pattern at *next to c.
func answer(c net.Conn, n int, next *byte) error {
	b := make([]byte, n)
	for i := range b {
		b[i] = *next
		*next++
	}
	_, err := c.Write(b)
	return err
}

// rstreamPeer is rstream's server side of the tests given, written out: for each test the
// 16-byte sync (receive, answer), then per iteration count transfers in, count out, every
// byte checked against the pattern; then the client's close (EOF).
func rstreamPeer(tests []streamtool.Test, in, out *byte) func(c net.Conn) error {
	return func(c net.Conn) error {
		for _, tt := range tests {
			if err := expect(c, 16, in); err != nil {
				return fmt.Errorf("%s: sync: %w", tt.Name, err)
			}
			if err := answer(c, 16, out); err != nil {
				return err
			}
			for range tt.Iters {
				for range tt.Count {
					if err := expect(c, tt.Size, in); err != nil {
						return fmt.Errorf("%s: %w", tt.Name, err)
					}
				}
				for range tt.Count {
					if err := answer(c, tt.Size, out); err != nil {
						return err
					}
				}
			}
		}
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			return fmt.Errorf("after the tests: %d bytes, %v; want EOF", n, err)
		}
		return nil
	}
}

// The client's byte stream, against rstream's flow written out: the sync and the
// transfers of each test, the pattern running on across tests and connections, the latency
// set's connection closed before the bandwidth set's.
func TestClientStream(t *testing.T) {
	short := func(size int) int { return 2 }
	var lat, bw []streamtool.Test
	for _, size := range []int{64, 4096, 65536, 1 << 20} {
		lat = append(lat, streamtool.Test{Name: streamtool.TestName(size, "lat"), Size: size, Count: 1, Iters: 2})
		bw = append(bw, streamtool.Test{Name: streamtool.TestName(size, "bw"), Size: size, Count: 2, Iters: 1})
	}
	var in, out byte
	addr, errs := scriptedServer(t, rstreamPeer(lat, &in, &out), rstreamPeer(bw, &in, &out))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cc := &collector{}
	cfg := Config{ServerAddr: addr.Addr(), Port: int(addr.Port()), Sockets: true, Verify: true, CountFor: short}
	if err := run(ctx, &cfg, cc.output()); err != nil {
		t.Fatalf("client: %v\n%s", err, cc.log.String())
	}
	for i := range 2 {
		if err := <-errs; err != nil {
			t.Errorf("connection %d: %v", i+1, err)
		}
	}
	if len(cc.results) != 8 {
		t.Errorf("%d results, want 8", len(cc.results))
	}
}

// The server's byte stream, against rstream's client written out: per test the sync and
// the transfers, both connections of the size sets, each closed by the server once its
// tests are done (EOF), the pattern running on across them.
func TestServerStream(t *testing.T) {
	short := func(size int) int { return 2 }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	listening := make(chan netip.AddrPort, 1)
	cfg := Config{Bind: netip.MustParseAddr("127.0.0.2"), Sockets: true, Verify: true, CountFor: short,
		Local: cmtool.Local{Listening: func(a netip.AddrPort) { listening <- a }}}
	cs := &collector{}
	srvErr := make(chan error, 1)
	go func() { srvErr <- run(ctx, &cfg, cs.output()) }()
	var addr netip.AddrPort
	select {
	case addr = <-listening:
	case err := <-srvErr:
		t.Fatalf("server: %v", err)
	}
	var out, in byte // the client sends first
	for _, kind := range []string{"lat", "bw"} {
		c, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range []int{64, 4096, 65536, 1 << 20} {
			count, iters := 1, 2
			if kind == "bw" {
				count, iters = 2, 1
			}
			if err := answer(c, 16, &out); err != nil {
				t.Fatal(err)
			}
			if err := expect(c, 16, &in); err != nil {
				t.Fatalf("%s %d: sync: %v", kind, size, err)
			}
			for range iters {
				for range count {
					if err := answer(c, size, &out); err != nil {
						t.Fatal(err)
					}
				}
				for range count {
					if err := expect(c, size, &in); err != nil {
						t.Fatalf("%s %d: %v", kind, size, err)
					}
				}
			}
		}
		if n, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("%s: after the tests: %d bytes, %v; want EOF (the server closes)", kind, n, err)
		}
		c.Close()
	}
	if err := <-srvErr; err != nil {
		t.Fatalf("server: %v\n%s", err, cs.log.String())
	}
	if len(cs.results) != 8 {
		t.Errorf("%d results, want 8", len(cs.results))
	}
}

// -T v finds a byte that came back wrong and says which, counting from the first byte
// received, as rstream.
func TestVerifyFails(t *testing.T) {
	addr, errs := scriptedServer(t, func(c net.Conn) error {
		b := make([]byte, 16+200)
		if _, err := io.ReadFull(c, b[:16]); err != nil {
			return err
		}
		c.Write(b[:16])
		if _, err := io.ReadFull(c, b[16:]); err != nil {
			return err
		}
		b[16+150]++
		c.Write(b[16:116])
		c.Write(b[116:])
		io.Copy(io.Discard, c)
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := Config{ServerAddr: addr.Addr(), Port: int(addr.Port()), Sockets: true, Verify: true, Custom: true, Size: 100, Count: 2, Iters: 1}
	err := run(ctx, &cfg, (&collector{}).output())
	if err == nil || !strings.Contains(err.Error(), "data verification failed byte 166") {
		t.Fatalf("client: %v, want data verification failed byte 166", err)
	}
	<-errs
}

func TestParseArgs(t *testing.T) {
	var stderr bytes.Buffer
	cfg, o, err := parseArgs(strings.Split("-s 127.0.0.1 -b 127.0.0.3 -Ts -T verify -S all -B 4096 -p9000 -k 5 --json", " "), &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Sockets || !cfg.Verify || !cfg.AllSizes || cfg.Custom || cfg.Buffer != 4096 || cfg.Port != 9000 || cfg.KeepAlive != 5 ||
		cfg.ServerAddr != netip.MustParseAddr("127.0.0.1") || cfg.Bind != netip.MustParseAddr("127.0.0.3") || !o.JSON {
		t.Errorf("%+v", cfg)
	}
	cfg, _, err = parseArgs([]string{"-S", "100", "-T", "a", "-T", "Nonblocking", "--ordering", "weak"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Custom || cfg.Size != 100 || cfg.Ordering != verbs.OrderingWeak || cfg.Port != defaultPort {
		t.Errorf("%+v", cfg)
	}
	if n := strings.Count(stderr.String(), "note:"); n != 2 {
		t.Errorf("%d notes, want 2 (-T a and -T n):\n%s", n, stderr.String())
	}
	cfg, _, err = parseArgs([]string{"-T", "f"}, &stderr)
	if err != nil || !cfg.Sockets {
		t.Errorf("-T f: %v, sockets %v", err, cfg != nil && cfg.Sockets)
	}
	for _, bad := range [][]string{{"-T", "x"}, {"-T", "so"}, {"-C", "ten"}, {"-f", "gid"}, {"-p", "0"}, {"--ordering", "loose"}, {"extra"}} {
		if _, _, err := parseArgs(bad, io.Discard); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	// An rsocket server needs a device address.
	c := Config{Port: defaultPort}
	if err := run(context.Background(), &c, (&collector{}).output()); err == nil || !strings.Contains(err.Error(), "-b ADDR") {
		t.Errorf("server without an address: %v", err)
	}
}
