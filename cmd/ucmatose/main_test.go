package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/internal/cmtool/cmtooltest"
	"github.com/softrnic/softrnic/verbs"
)

type side struct {
	r        *Result
	err      error
	out, log cmtooltest.Buffer
}

// run runs ucmatose with cfg, keeping its result and what it printed.
func (s *side) run(ctx context.Context, cfg *Config) error {
	s.r, s.err = run(ctx, cfg, &output{Out: &s.out, Log: &s.log})
	return s.err
}

// pair runs a server on srvIP and a client on cliIP in this process (ephemeral UDP
// ports; the client connects once the server listens).
func pair(t *testing.T, srvIP, cliIP string, srv, cli Config) (s, c *side) {
	t.Helper()
	s, c = &side{}, &side{}
	cmtooltest.Pair(t, srvIP, cliIP,
		func(ctx context.Context, dev *verbs.Device, listening func(netip.AddrPort)) error {
			srv.Device, srv.Listening = dev, listening
			if err := s.run(ctx, &srv); err != nil {
				return fmt.Errorf("%w\n%s", err, s.log.String())
			}
			return nil
		},
		func(ctx context.Context, dev *verbs.Device, la netip.AddrPort, peerPort int) error {
			cli.Device, cli.ServerAddr, cli.Port, cli.PeerPort = dev, la.Addr(), int(la.Port()), peerPort
			return c.run(ctx, &cli)
		})
	return s, c
}

const (
	serverLines = "cmatose: starting server\ninitiating data transfers\ncompleting sends\nreceiving data transfers\n" +
		"data transfers complete\ncmatose: disconnecting\ndisconnected\ntest complete\nreturn status 0\n"
	clientLines = "cmatose: starting client\ncmatose: connecting\nreceiving data transfers\nsending replies\n" +
		"data transfers complete\ntest complete\nreturn status 0\n"
)

// Many connections at once, both roles both ways round, messages of one packet and of
// several, checked with -V; and with no messages (-C 0): connect and disconnect only.
func TestLoopback(t *testing.T) {
	cases := []struct{ conns, count, size int }{{8, 10, 100}, {3, 20, 5000}, {4, 0, 100}}
	for _, c := range cases {
		for _, ips := range [][2]string{{"127.0.0.2", "127.0.0.1"}, {"127.0.0.1", "127.0.0.2"}} {
			t.Run(fmt.Sprintf("c%d/C%d/S%d/server=%s", c.conns, c.count, c.size, ips[0]), func(t *testing.T) {
				t.Parallel()
				cfg := Config{Connections: c.conns, Count: c.count, Size: c.size, Validate: true}
				s, cl := pair(t, ips[0], ips[1], cfg, cfg)
				if s.err != nil || cl.err != nil {
					t.Fatalf("server: %v\n%s%s\nclient: %v\n%s%s", s.err, s.out.String(), s.log.String(), cl.err, cl.out.String(), cl.log.String())
				}
				wantS, wantC := serverLines, clientLines
				if c.count == 0 {
					wantS = strings.Replace(wantS, "initiating data transfers\ncompleting sends\nreceiving data transfers\ndata transfers complete\n", "", 1)
					wantC = strings.Replace(wantC, "receiving data transfers\nsending replies\ndata transfers complete\n", "", 1)
				}
				if got := s.out.String(); got != wantS {
					t.Errorf("server printed\n%s\nwant\n%s", got, wantS)
				}
				if got := cl.out.String(); got != wantC {
					t.Errorf("client printed\n%s\nwant\n%s", got, wantC)
				}
				want := c.conns * c.count
				for _, r := range []*Result{s.r, cl.r} {
					if !r.OK || r.Established != c.conns || r.Received != want || r.Sent+r.Flushed != want || r.Mismatches != 0 ||
						r.Disconnected != c.conns || r.Errors != nil || r.CM.Established != uint64(c.conns) {
						t.Errorf("%s: %+v", r.Role, r)
					}
				}
				if s.r.Flushed != 0 || s.r.Sent != want {
					t.Errorf("server: sent %d, flushed %d", s.r.Sent, s.r.Flushed)
				}
			})
		}
	}
}

// A request beyond -c is refused (cmatose: "failing connection request") while the
// server's connections run.
func TestExtraConnectionRefused(t *testing.T) {
	ds, dc := cmtooltest.OpenDevice(t, "127.0.0.2"), cmtooltest.OpenDevice(t, "127.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	listening := make(chan netip.AddrPort, 1)
	// The server waits for two connections; the client makes three.
	srv := Config{Connections: 2, Count: 0, Size: 100, Local: cmtool.Local{Device: ds, Listening: func(a netip.AddrPort) { listening <- a }}}
	var so side
	done := make(chan struct{})
	go func() {
		defer close(done)
		so.run(ctx, &srv)
	}()
	la := <-listening
	cli := Config{ServerAddr: la.Addr(), Port: int(la.Port()), Connections: 3, Count: 0, Size: 100,
		Local: cmtool.Local{Device: dc, PeerPort: int(ds.Addr().Port())}}
	var co side
	co.run(ctx, &cli)
	<-done
	if co.err == nil || co.r.Established != 2 || co.r.ConnectFails != 1 || co.r.CM.REJReceived != 1 {
		t.Errorf("client: %v %+v", co.err, co.r)
	}
	if !strings.Contains(co.out.String(), "cmatose: event: cm: Dial: connection rejected") {
		t.Errorf("client printed %q", co.out.String())
	}
	if so.err != nil || so.r.Established != 2 {
		t.Errorf("server: %v %+v\n%s", so.err, so.r, so.log.String())
	}
}

// The command line as cmatose's getopt reads it.
func TestArgs(t *testing.T) {
	var stderr bytes.Buffer
	cfg, o, err := parseArgs(strings.Fields("-s 10.77.0.6 -b10.77.0.1 -c 20 -C100 -S 4096 -p 7000 -a 0x12 -m --json"), &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ServerAddr != netip.MustParseAddr("10.77.0.6") || cfg.Bind != netip.MustParseAddr("10.77.0.1") || cfg.Connections != 20 ||
		cfg.Count != 100 || cfg.Size != 4096 || cfg.Port != 7000 || !cfg.SetAckTimeout || cfg.AckTimeout != 18 || !cfg.Migrate || !o.JSON {
		t.Errorf("%+v %+v", cfg, o)
	}
	cfg, _, err = parseArgs(strings.Fields("-b 10.77.0.1"), &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ServerAddr.IsValid() || cfg.Connections != 1 || cfg.Count != 10 || cfg.Size != 100 || cfg.Port != 7471 || cfg.SetAckTimeout {
		t.Errorf("%+v", cfg)
	}
	for _, bad := range []string{"-f gid -s 1.2.3.4", "-P ib", "-t 4", "-a 32", "extra", "-x"} {
		if _, _, err := parseArgs(strings.Fields(bad), &stderr); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	c := &Config{Connections: 1, Count: 10, Size: 0, Bind: netip.MustParseAddr("127.0.0.1")}
	c.defaults()
	if c.Count != 0 || c.validate() != nil {
		t.Errorf("-S 0: %+v", c)
	}
}
