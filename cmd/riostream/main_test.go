//go:build !race

// The tests that run riostream poll a marker byte that the peer's RDMA WRITEs land in:
// a data race in Go's terms, harmless (see buffer.byteAt) but one the race detector
// reports, since the ordering goes through the network where it cannot see it. They
// run without -race only; the flag tests (flags_test.go) run with it too.

package main

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"

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

// pair runs a server on 127.0.0.2 and a client on 127.0.0.1 in this process, on devices
// with ephemeral UDP ports. The client dials once the server listens.
func pair(t *testing.T, srv, cli Config) (cs, cc *collector) {
	t.Helper()
	cs, cc = &collector{}, &collector{}
	serr, cerr := cmtooltest.Pair(t, "127.0.0.2", "127.0.0.1",
		func(ctx context.Context, dev *verbs.Device, listening func(netip.AddrPort)) error {
			srv.Bind, srv.Listening = netip.MustParseAddr("127.0.0.2"), listening
			srv.Device, srv.Port = dev, streamtool.DefaultPort
			return run(ctx, &srv, cs.output())
		},
		func(ctx context.Context, dev *verbs.Device, la netip.AddrPort, peerPort int) error {
			cli.ServerAddr, cli.Port = la.Addr(), int(la.Port())
			cli.Device, cli.PeerPort = dev, peerPort
			return run(ctx, &cli, cc.output())
		})
	if cerr != nil || serr != nil {
		t.Fatalf("client: %v\n%s%s\nserver: %v\n%s%s", cerr, cc.out.String(), cc.log.String(), serr, cs.out.String(), cs.log.String())
	}
	return cs, cc
}

// checkResults checks that both sides reported the tests given, on the connections
// given, each with its size, transfers and iterations, with clean counters, and printed
// the table.
func checkResults(t *testing.T, cs, cc *collector, want []Result) {
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
			if r.Tool != "riostream" || r.Test != w.Test || r.Connection != w.Connection || r.Size != w.Size || r.Xfers != w.Xfers ||
				r.Iters != w.Iters || r.Bytes != int64(w.Size)*int64(w.Xfers)*int64(w.Iters)*2 || r.Role != side.role ||
				r.Transport != "rsocket" || r.Verified != w.Verified {
				t.Errorf("%s result %d: %+v, want %+v", side.role, i, r, w)
			}
			if i+1 < len(lines) && lines[i+1]+"\n" != r.Row() {
				t.Errorf("%s line %d: %q, want %q", side.role, i+1, lines[i+1], r.Row())
			}
			if r.Rsocket == nil || r.Rsocket.Violations != 0 || r.Counters == nil || len(r.Counters.Errors) != 0 {
				t.Errorf("%s %s: rsocket stats %+v, counters %+v", side.role, r.Test, r.Rsocket, r.Counters)
			}
		}
	}
}

// Custom tests (-S -C -I) on one connection each, the bytes before every marker checked
// on both sides (-T v): sizes below and above a packet, one not a multiple of the word
// the marker is loaded through, and more iterations than markers (they wrap at 256).
func TestCustom(t *testing.T) {
	for _, c := range []Config{
		{Custom: true, Size: 64, Count: 1, Iters: 300},
		{Custom: true, Size: 4099, Count: 3, Iters: 20},
		{Custom: true, Size: 300 << 10, Count: 4, Iters: 3},
	} {
		c.Verify = true
		t.Run(streamtool.SizeStr(int64(c.Size)), func(t *testing.T) {
			cs, cc := pair(t, c, c)
			checkResults(t, cs, cc, []Result{{Test: "custom", Connection: 1, Size: c.Size, Xfers: c.Count, Iters: c.Iters, Verified: true}})
		})
	}
}

// The default run, with short counts: the latency set on a first connection, then the
// bandwidth set on a second, each test mapping the buffer anew into the peer's one
// entry; the checked bytes' pattern runs on across tests and connections.
func TestSizeSets(t *testing.T) {
	short := func(size int) int { return max(2, 8<<10/size) }
	c := Config{Verify: true, CountFor: short}
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
	checkResults(t, cs, cc, want)
}

// -T v on one side only: the other side writes back what its buffer holds, which is
// what the checking side wrote into it, the pattern (the C tool's one buffer is both
// the mapping and the source).
func TestVerifyOneSide(t *testing.T) {
	srv := Config{Custom: true, Size: 3000, Count: 2, Iters: 5}
	cli := srv
	cli.Verify = true
	cs, cc := pair(t, srv, cli)
	if !cc.results[0].Verified || cs.results[0].Verified {
		t.Errorf("verified: client %v server %v", cc.results[0].Verified, cs.results[0].Verified)
	}
}

// A side that checks (-T v) against one that does not fill the pattern: the checking
// server finds the client's bytes wrong, in riostream's words, and fails; the client,
// waiting for a marker that will not come, ends with the run's context.
func TestVerifyFails(t *testing.T) {
	ds, dc := cmtooltest.OpenDevice(t, "127.0.0.2"), cmtooltest.OpenDevice(t, "127.0.0.1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listening := make(chan netip.AddrPort, 1)
	srvErr := make(chan error, 1)
	go func() {
		c := Config{Custom: true, Size: 1000, Count: 1, Iters: 2, Verify: true, Bind: netip.MustParseAddr("127.0.0.2"),
			Port: streamtool.DefaultPort, Local: cmtool.Local{Device: ds, Listening: func(a netip.AddrPort) { listening <- a }}}
		err := run(ctx, &c, (&collector{}).output())
		cancel()
		srvErr <- err
	}()
	la := <-listening
	c := Config{Custom: true, Size: 1000, Count: 1, Iters: 2, ServerAddr: la.Addr(), Port: int(la.Port()),
		Local: cmtool.Local{Device: dc, PeerPort: int(ds.Addr().Port())}}
	cerr := run(ctx, &c, (&collector{}).output())
	if serr := <-srvErr; serr == nil || !strings.Contains(serr.Error(), "data verification failed byte 1") {
		t.Errorf("server: %v, want a verification failure at byte 1 (the client's buffer holds zeros)", serr)
	}
	if cerr == nil {
		t.Error("the client succeeded without its peer's marker")
	}
}
