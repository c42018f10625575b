package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/internal/cmtool/cmtooltest"
	"github.com/softrnic/softrnic/verbs"
)

// collector is an output whose lines and results are kept (each result also as the JSON
// --json prints).
type collector struct {
	mu      sync.Mutex
	out     cmtooltest.Buffer
	results []*Result
	json    bytes.Buffer
}

func (c *collector) output() *output {
	return &output{Out: &c.out, Emit: func(r *Result) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.results = append(c.results, r)
		_ = json.NewEncoder(&c.json).Encode(r)
	}}
}

// pair runs a server on srvIP and a client on cliIP in this process (ephemeral UDP ports;
// the client starts once the server listens) and returns both collectors and errors.
func pair(t *testing.T, srvIP, cliIP string, srv, cli Config) (cs, cc *collector, serr, cerr error) {
	t.Helper()
	cs, cc = &collector{}, &collector{}
	serr, cerr = cmtooltest.Pair(t, srvIP, cliIP,
		func(ctx context.Context, dev *verbs.Device, listening func(netip.AddrPort)) error {
			srv.Server, srv.Device, srv.Listening = true, dev, listening
			return run(ctx, &srv, cs.output())
		},
		func(ctx context.Context, dev *verbs.Device, la netip.AddrPort, peerPort int) error {
			if cli.Port == 0 {
				cli.Port = int(la.Port())
			}
			cli.Device, cli.Addr, cli.PeerPort = dev, la.Addr(), peerPort
			return run(ctx, &cli, cc.output())
		})
	return cs, cc, serr, cerr
}

// Both roles both ways round (server on 127.0.0.2 and on 127.0.0.1), one and several
// connections: every connection is resolved through SIDR and every datagram comes back,
// with udaddy's lines in udaddy's order; each connection's result names the peer's QP
// and rdma_cm's Q_Key, and no error counter moved.
func TestLoopback(t *testing.T) {
	for _, c := range []struct{ conns, count, size int }{{1, 10, 100}, {3, 20, 1024}} {
		for _, ips := range [][2]string{{"127.0.0.2", "127.0.0.1"}, {"127.0.0.1", "127.0.0.2"}} {
			t.Run(fmt.Sprintf("c%d/server=%s", c.conns, ips[0]), func(t *testing.T) {
				t.Parallel()
				cfg := Config{Connections: c.conns, Count: c.count, Size: c.size}
				cs, cc, serr, cerr := pair(t, ips[0], ips[1], cfg, cfg)
				if cerr != nil || serr != nil {
					t.Fatalf("client: %v\n%s\nserver: %v\n%s", cerr, cc.out.String(), serr, cs.out.String())
				}
				wantS := "udaddy: starting server\nreceiving data transfers\nsending replies\ndata transfers complete\ntest complete\nreturn status 0\n"
				wantC := "udaddy: starting client\nudaddy: connecting\ninitiating data transfers\nreceiving data transfers\ndata transfers complete\ntest complete\nreturn status 0\n"
				if got := cs.out.String(); got != wantS {
					t.Errorf("server printed\n%s\nwant\n%s", got, wantS)
				}
				if got := cc.out.String(); got != wantC {
					t.Errorf("client printed\n%s\nwant\n%s", got, wantC)
				}
				if len(cs.results) != c.conns || len(cc.results) != c.conns {
					t.Fatalf("%d server and %d client results, want %d each", len(cs.results), len(cc.results), c.conns)
				}
				serverQPs := map[uint32]bool{}
				for _, r := range cs.results {
					serverQPs[r.QPN] = true
				}
				for _, rs := range [][]*Result{cs.results, cc.results} {
					for _, r := range rs {
						if !r.OK || r.Sent != c.count || r.Received != c.count || r.Bad != 0 || r.PeerQKey != cm.UDPQKey || len(r.Errors) != 0 {
							t.Errorf("%s %d: %+v", r.Role, r.Index, r)
						}
					}
				}
				for _, r := range cc.results {
					if !serverQPs[r.PeerQPN] {
						t.Errorf("client %d sent to QP %#x, none of the server's", r.Index, r.PeerQPN)
					}
				}
				if s := cc.results[0].SIDR; s.Resolved != uint64(c.conns) || s.Failed != 0 || s.Timeouts != 0 {
					t.Errorf("client's SIDR counters %+v", s)
				}
				if s := cs.results[0].SIDR; s.REQReceived != uint64(c.conns) || s.REPSent != uint64(c.conns) {
					t.Errorf("server's SIDR counters %+v", s)
				}
				// --json: one object per connection.
				for _, col := range []*collector{cs, cc} {
					if n := strings.Count(col.json.String(), "\n"); n != c.conns {
						t.Errorf("%d JSON lines, want %d", n, c.conns)
					}
					var r map[string]any
					if err := json.Unmarshal(bytes.SplitN(col.json.Bytes(), []byte("\n"), 2)[0], &r); err != nil || r["tool"] != "udaddy" || r["ok"] != true {
						t.Errorf("JSON %v: %v", r, err)
					}
				}
			})
		}
	}
}

// -C 0 (or -S 0): resolution only, no datagrams, as udaddy.
func TestResolveOnly(t *testing.T) {
	cfg := Config{Connections: 2, Size: 0, Count: 10}
	cs, cc, serr, cerr := pair(t, "127.0.0.2", "127.0.0.1", cfg, cfg)
	if cerr != nil || serr != nil {
		t.Fatalf("client %v, server %v", cerr, serr)
	}
	for _, r := range append(cs.results, cc.results...) {
		if !r.OK || r.Sent != 0 || r.Received != 0 {
			t.Errorf("%s %d: %+v", r.Role, r.Index, r)
		}
	}
	if strings.Contains(cc.out.String(), "data transfers") {
		t.Errorf("client printed %q", cc.out.String())
	}
}

// A client whose server does not listen on the port is told so at once (SIDR's "not
// supported"): udaddy's UNREACHABLE event line and a failure; a message larger than the
// active MTU is refused before anything is sent, with udaddy's words.
func TestClientErrors(t *testing.T) {
	ds, dc := cmtooltest.OpenDevice(t, "127.0.0.2"), cmtooltest.OpenDevice(t, "127.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The server device's connection manager runs (it listens on another port).
	l, err := cm.ListenUD(ds, defaultPort+1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := &collector{}
	local := cmtool.Local{Device: dc, PeerPort: int(ds.Addr().Port())}
	err = run(ctx, &Config{Addr: ds.Addr().Addr(), Count: 1, Size: 10, Local: local}, c.output())
	if err == nil || !strings.Contains(c.out.String(), "udaddy: event: RDMA_CM_EVENT_UNREACHABLE") {
		t.Errorf("no listener: %v\n%s", err, c.out.String())
	}
	if len(c.results) != 1 || c.results[0].OK || c.results[0].Error == "" {
		t.Errorf("results %+v", c.results)
	}
	port, _ := dc.QueryPort(1)
	c = &collector{}
	err = run(ctx, &Config{Addr: ds.Addr().Addr(), Count: 1, Size: port.ActiveMTU.Bytes() + 1, Local: local}, c.output())
	if want := fmt.Sprintf("udaddy: message_size %d is larger than active mtu %d", port.ActiveMTU.Bytes()+1, port.ActiveMTU.Bytes()); err == nil ||
		!strings.Contains(c.out.String(), want) {
		t.Errorf("size above the MTU: %v\n%s", err, c.out.String())
	}
}

// udaddy's command line, getopt-style, and what is refused.
func TestParseArgs(t *testing.T) {
	var stderr bytes.Buffer
	cfg, o, err := parseArgs([]string{"-s", "127.0.0.2", "-b127.0.0.1", "-c2", "-C", "5", "-S64", "-p", "0x111", "-P", "udp", "-f", "ip", "-t", "4", "--json", "--port", "9000"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server || cfg.Addr != netip.MustParseAddr("127.0.0.2") || cfg.Bind != netip.MustParseAddr("127.0.0.1") || cfg.Connections != 2 ||
		cfg.Count != 5 || cfg.Size != 64 || cfg.Port != 9000 || !o.JSON {
		t.Errorf("client: %+v %+v", cfg, o)
	}
	cfg, _, err = parseArgs(nil, &stderr)
	if err != nil || !cfg.Server || cfg.Connections != 1 || cfg.Count != 10 || cfg.Size != 100 || cfg.Port != 7174 || cfg.UDPPort != 4791 {
		t.Errorf("defaults: %+v %v", cfg, err)
	}
	for _, args := range [][]string{{"-p", "2"}, {"-P", "ipoib"}, {"-f", "gid"}, {"extra"}} {
		if _, _, err := parseArgs(args, &stderr); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
	if err := (&Config{Server: true}).validate(); err == nil {
		t.Error("a server without an address to bind")
	}
}
