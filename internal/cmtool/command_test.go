package cmtool

import (
	"bytes"
	"flag"
	"io"
	"net/netip"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/verbs"
)

// The flags every tool adds, getopt-style parsing, the address flags resolved in order
// with --dev-addr last, and what a bad command line returns.
func TestCommandLine(t *testing.T) {
	var stderr bytes.Buffer
	var l Local
	usage := func(w io.Writer) { io.WriteString(w, "usage\n") }
	fs, o := NewFlagSet("tool", &stderr, usage, &l)
	var a string
	fs.StringVar(&a, "a", "", "")
	verbose := fs.Bool("v", false, "")
	args := strings.Fields("-va10.0.0.1 --dev-addr 10.0.0.2 --udp-port 4792 --json --stats --pcap x.pcap --timeout 3s")
	if err := Parse(fs, args); err != nil {
		t.Fatal(err)
	}
	var addr netip.Addr
	if err := o.ResolveAddrs(AddrFlag{Flag: "-a", Value: a, Dst: &addr}); err != nil {
		t.Fatal(err)
	}
	if !*verbose || addr != netip.MustParseAddr("10.0.0.1") || l.DevAddr != netip.MustParseAddr("10.0.0.2") || l.UDPPort != 4792 ||
		l.Pcap != "x.pcap" || !o.JSON || !o.Stats || o.Timeout.Seconds() != 3 {
		t.Errorf("%+v %+v", l, o)
	}
	if err := o.ResolveAddrs(AddrFlag{Flag: "-a", Value: "no.such.host.invalid", Dst: &addr}); err == nil || !strings.HasPrefix(err.Error(), "-a no.such.host.invalid: ") {
		t.Errorf("unresolvable: %v", err)
	}
	fs, _ = NewFlagSet("tool", &stderr, usage, &Local{})
	stderr.Reset()
	if err := Parse(fs, []string{"extra"}); err == nil || stderr.String() != "usage\n" {
		t.Errorf("positional: %v, stderr %q", err, stderr.String())
	}
	if s := ParseStatus("tool", flag.ErrHelp, &stderr); s != 0 {
		t.Errorf("-h: status %d", s)
	}
	stderr.Reset()
	if s := ParseStatus("tool", io.EOF, &stderr); s != 1 || stderr.String() != "tool: EOF\n" {
		t.Errorf("status %d, stderr %q", s, stderr.String())
	}
	stderr.Reset()
	if AddrFormat("IPv6", &stderr, "gid") != nil || AddrFormat("x", &stderr, "gid") != nil || AddrFormat("gid", &stderr, "gid") == nil ||
		stderr.String() != "Warning: unknown address format\n" {
		t.Errorf("-f: stderr %q", stderr.String())
	}
}

// --json prints the result as a JSON line, --stats as text, neither nothing; Info sends
// the C tool's lines to stderr with --json.
func TestReporter(t *testing.T) {
	type res struct{ N int }
	stats := func(w io.Writer, r res) { io.WriteString(w, "stats\n") }
	for _, c := range []struct {
		o    Options
		want string
	}{{Options{JSON: true, Stats: true}, "{\"N\":1}\n"}, {Options{Stats: true}, "stats\n"}, {Options{}, ""}} {
		var out bytes.Buffer
		Reporter(&c.o, &out, stats)(res{1})
		if out.String() != c.want {
			t.Errorf("%+v: %q, want %q", c.o, out.String(), c.want)
		}
	}
	var stdout, stderr bytes.Buffer
	if (&Options{JSON: true}).Info(&stdout, &stderr) != &stderr || (&Options{}).Info(&stdout, &stderr) != &stdout {
		t.Error("Info")
	}
}

// A Local with a device uses it and leaves it open; else the address chosen is
// --dev-addr, then the tool's own, then the route's source.
func TestLocalOpen(t *testing.T) {
	l := Local{UDPPort: 0}
	l.Defaults()
	if l.UDPPort != 4791 || l.PeerPort != 4791 {
		t.Errorf("defaults %+v", l)
	}
	l = Local{DevAddr: netip.MustParseAddr("127.0.0.3")}
	l.UDPPort = verbs.AnyPort
	dev, release, err := l.Open(netip.MustParseAddr("127.0.0.4"), netip.Addr{}, "no route")
	if err != nil {
		t.Fatal(err)
	}
	if dev.Addr().Addr() != netip.MustParseAddr("127.0.0.3") {
		t.Errorf("device at %v, want --dev-addr's", dev.Addr())
	}
	given := Local{Device: dev}
	if d, rel, err := given.Open(netip.Addr{}, netip.Addr{}, "no route"); err != nil || d != dev {
		t.Errorf("given device: %v %v", d, err)
	} else {
		rel()
		if _, err := dev.AllocPD(); err != nil {
			t.Errorf("the given device was closed: %v", err)
		}
	}
	release()
	l = Local{UDPPort: verbs.AnyPort}
	dev, release, err = l.Open(netip.Addr{}, netip.MustParseAddr("127.0.0.5"), "no route")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if !dev.Addr().Addr().IsLoopback() {
		t.Errorf("device at %v, want the route's source toward 127.0.0.5", dev.Addr())
	}
}
