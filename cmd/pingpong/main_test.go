package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/cmtool/cmtooltest"
	"github.com/softrnic/softrnic/verbs"
)

// pair runs a server and a client of cfg's mode in this process: devices on srvIP and
// cliIP (ephemeral UDP ports, each side told the other's), the exchange over TCP on
// srvIP. It returns both results and what each side printed.
func pair(t *testing.T, srvIP, cliIP string, srv, cli Config) (rs, rc *Result, outS, outC string) {
	t.Helper()
	ds, dc := cmtooltest.OpenDevice(t, srvIP), cmtooltest.OpenDevice(t, cliIP)
	ln, err := net.Listen("tcp", net.JoinHostPort(srvIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	srv.Device, srv.UDPPort, srv.Listener, srv.Port = ds, int(dc.Addr().Port()), ln, port
	cli.Device, cli.UDPPort, cli.Server, cli.Port = dc, int(ds.Addr().Port()), srvIP, port
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type out struct {
		r   *Result
		err error
		buf bytes.Buffer
	}
	var so, co out
	done := make(chan struct{})
	go func() {
		defer close(done)
		so.r, so.err = run(ctx, &srv, &so.buf)
	}()
	co.r, co.err = run(ctx, &cli, &co.buf)
	if co.err != nil {
		cancel() // do not leave the server waiting
	}
	<-done
	if so.err != nil || co.err != nil {
		t.Fatalf("server: %v\n%s\nclient: %v\n%s", so.err, so.buf.String(), co.err, co.buf.String())
	}
	return so.r, co.r, so.buf.String(), co.buf.String()
}

// The ping-pong between two softrnic devices, both ways round (server on 127.0.0.2 and on
// 127.0.0.1), RC and UD, with -c: every message arrives with the C tools' buffer
// contents, and both sides print the C tools' address lines with each other's numbers.
func TestLoopback(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"rc/4096", Config{Mode: "rc", Size: 4096, Iters: 100, Check: true, Stats: true}}, // 4 packets per message at MTU 1024
		{"rc/64/events", Config{Mode: "rc", Size: 64, Iters: 300, Check: true, Events: true, RxDepth: 8}},
		{"rc/10000/mtu512", Config{Mode: "rc", Size: 10000, Iters: 100, Check: true, MTU: 512}}, // three pages, 20 packets
		{"ud/1024", Config{Mode: "ud", Size: 1024, Iters: 100, Check: true, Stats: true, MTU: 1024}},
		{"ud/4096/events", Config{Mode: "ud", Size: 4096, Iters: 300, Check: true, Events: true}}, // loopback's active MTU is 4096
	}
	for _, c := range cases {
		for _, ips := range [][2]string{{"127.0.0.2", "127.0.0.1"}, {"127.0.0.1", "127.0.0.2"}} {
			t.Run(fmt.Sprintf("%s/server=%s", c.name, ips[0]), func(t *testing.T) {
				// Not in parallel: each side busy-polls, as the C tools do.
				srv, cli := c.cfg, c.cfg
				rs, rc, outS, outC := pair(t, ips[0], ips[1], srv, cli)
				for _, r := range []*Result{rs, rc} {
					if r.Invalid() || !r.Checked {
						t.Errorf("%s: checked %v, invalid pages %v, bad messages %d", r.Role, r.Checked, r.InvalidPages, r.BadMessages)
					}
					if r.Iters != c.cfg.Iters || r.Bytes != int64(2*c.cfg.Size*c.cfg.Iters) || r.Seconds <= 0 || r.Lat == nil {
						t.Errorf("%s: result %+v", r.Role, r)
					}
					if c.cfg.Events && r.CQEvents == 0 {
						t.Errorf("%s: -e and no CQ events", r.Role)
					}
				}
				if rs.Role != "server" || rc.Role != "client" || rs.Local != rc.Remote || rc.Local != rs.Remote {
					t.Errorf("addresses: server %+v, client %+v", rs, rc)
				}
				if want := "::ffff:" + ips[0]; rs.Local.GID != want {
					t.Errorf("server GID %s, want %s", rs.Local.GID, want)
				}
				for _, o := range []struct {
					out string
					r   *Result
				}{{outS, rs}, {outC, rc}} {
					sep := ","
					if c.cfg.Mode == "ud" {
						sep = ":"
					}
					want := fmt.Sprintf("  local address:  LID 0x0000, QPN 0x%06x, PSN 0x%06x%s GID %s\n  remote address: LID 0x0000, QPN 0x%06x, PSN 0x%06x, GID %s\n",
						o.r.Local.QPN, o.r.Local.PSN, sep, o.r.Local.GID, o.r.Remote.QPN, o.r.Remote.PSN, o.r.Remote.GID)
					if o.out != want {
						t.Errorf("%s printed\n%q, want\n%q", o.r.Role, o.out, want)
					}
				}
				if c.cfg.Stats {
					for _, r := range []*Result{rs, rc} {
						d := r.Device
						// (Retransmissions are allowed: on a machine busy with other work an
						// ACK timeout may fire.)
						if d == nil || r.QP == nil || d.ICRCErrors+d.Malformed+d.UnknownQP+d.Dropped+d.WrongSource+d.QKeyErrors+d.NAKsSent != 0 {
							t.Errorf("%s: counters %+v", r.Role, d)
						}
					}
				}
			})
		}
	}
}

// A client without -c sends the buffer as the C tools fill it (0x7b): a server with -c
// reports page 0 invalid, as ibv_rc_pingpong's does ("invalid data in page 0"), and every
// message as differing; the command exits 1.
func TestCheckFails(t *testing.T) {
	srv := Config{Mode: "rc", Size: 5000, Iters: 20, Check: true}
	cli := Config{Mode: "rc", Size: 5000, Iters: 20}
	rs, rc, _, _ := pair(t, "127.0.0.2", "127.0.0.1", srv, cli)
	if !rs.Invalid() || len(rs.InvalidPages) != 2 || rs.BadMessages != 20 {
		t.Errorf("server: invalid pages %v, bad messages %d; want pages [0 1], 20", rs.InvalidPages, rs.BadMessages)
	}
	if rc.Checked || rc.Invalid() {
		t.Errorf("client without -c: %+v", rc)
	}
}

// The exchange's message as the C tools write it (sprintf "%04x:%06x:%06x:%s" and the
// GID's bytes as hex), and back.
func TestWireFormat(t *testing.T) {
	d := dest{LID: 0, QPN: 0x11, PSN: 0x81290e, GID: verbs.GIDFromAddr(netip.MustParseAddr("10.77.0.3"))}
	msg := d.marshal()
	want := "0000:000011:81290e:00000000000000000000ffff0a4d0003\x00"
	if string(msg) != want || len(msg) != msgLen {
		t.Fatalf("marshal: %q, want %q", msg, want)
	}
	got, err := parseDest(msg)
	if err != nil || got != d {
		t.Fatalf("parse: %+v %v", got, err)
	}
	if s := gidString(d.GID); s != "::ffff:10.77.0.3" {
		t.Errorf("GID printed %s", s)
	}
	for _, bad := range []string{
		"0000:000011:81290e\x00",
		"0000:000011:81290e:00ffff0a4d0003\x00",
		"0000:00001g:81290e:00000000000000000000ffff0a4d0003\x00",
		"0000:1000000:81290e:00000000000000000000ffff0a4d0003\x00",
	} {
		if _, err := parseDest([]byte(bad)); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
}

// The C tools' flags, and the ones that are refused.
func TestFlags(t *testing.T) {
	cfg, o, err := parseArgs("", strings.Fields("rc -p 18600 -d 10.77.0.1 -i 1 -s 64 -m 2048 -r 100 -n 7 -l 1 -e -g 1 -c 10.77.0.3 --json --stats"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Mode: "rc", Server: "10.77.0.3", Port: 18600, DevAddr: netip.MustParseAddr("10.77.0.1"), IBPort: 1, Size: 64, MTU: 2048,
		RxDepth: 100, Iters: 7, SL: 1, Events: true, GIDIndex: 1, Check: true, Stats: true, UDPPort: 4791}
	if *cfg != want || !o.json {
		t.Errorf("parsed %+v %+v, want %+v", cfg, o, want)
	}
	cfg, _, err = parseArgs("ud", []string{"--size=512", "--ib-dev=127.0.0.1"}, io.Discard)
	if err != nil || cfg.Mode != "ud" || cfg.Size != 512 || cfg.Server != "" || cfg.DevAddr != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("ud_pingpong --size=512: %+v %v", cfg, err)
	}
	for _, args := range []string{"rc -o", "rc --odp", "rc -t", "rc -j", "rc -d rxe0", "rc a b", "xx", "rc -m 1000 x"} {
		_, _, err := parseArgs("", strings.Fields(args), io.Discard)
		if args == "rc -m 1000 x" {
			// Refused when the run starts (the MTU).
			cfg, _, _ := parseArgs("", strings.Fields(args), io.Discard)
			cfg.defaults()
			err = cfg.validate()
		}
		if err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
