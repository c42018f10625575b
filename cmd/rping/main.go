// Command rping is softrnic's counterpart of librdmacm's rping (rdma-core,
// librdmacm/examples/rping.c): an RC connection through the connection manager (package
// cm; rdma_cm's TCP port space, default port 7174) and rping's ping-pong over it, message
// for message as the C tool, so that either side may be the C tool on a RoCE device
// (Linux rxe, a NIC):
//
//	client                                   server
//	SEND {start buf, rkey, size}      ->     RDMA READ the start buffer
//	                                  <-     SEND go-ahead
//	SEND {rdma buf, rkey, size}       ->     RDMA WRITE the data into the rdma buffer
//	                                  <-     SEND go-ahead
//	(compare with -V; print with -v)         ... until the client disconnects
//
// The advertisement is rping's struct rping_rdma_info, 16 bytes big-endian (buf u64, rkey
// u32, size u32); the go-ahead is the server's 16-byte send buffer, which rping never
// fills. Ping N's data is rping's: "rdma-ping-N: " then letters from 'A'+N (mod the
// 'A'..'z' range) running up to 'z' and round again, NUL-terminated; the server WRITEs
// back strlen+1 bytes. The client disconnects after -C pings (rdma_disconnect); the
// server serves until its client disconnects, then exits (or, with -P, serves the next
// connections, several at once, until interrupted).
//
//	rping -s [-vVd] [-S size] [-C count] -a addr [-p port] [-P]
//	rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
//
// Flags as rping's, getopt-style (-vV, -C10 work): -s server, -c client, -a address (the
// server's; a server binds its device to it), -I the client's source address, -p port,
// -C ping count (0: until interrupted), -S ping data size (23..65535, default 64), -v
// print the ping data, -V validate (the client compares what came back with what it
// sent, as rping; softrnic's server also checks what it READ against the pattern), -d
// debug lines, -P persistent server, -q (rping's self-created QP: accepted, the same on
// the wire). softrnic's additions: --dev-addr ADDR (this side's device: one IP address,
// default -a for a server, -I or the route's source address for a client), --udp-port
// (this device's RoCEv2 UDP port and the peer's, default 4791), --json (one JSON object
// per connection on stdout: pings, mismatches, the device's, QP's and connection
// manager's counters; the ping data then goes to stderr), --stats (the same counters as
// text), --pcap FILE (the device's packets), --timeout (give up after this long).
//
// The exit status is 0 when every ping came back (and matched, with -V), 1 otherwise.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"time"

	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/verbs"
)

func main() {
	os.Exit(mainArgs(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	json    bool
	stats   bool
	timeout time.Duration
}

// mainArgs is the command: arguments in, exit status out.
func mainArgs(args []string, stdout, stderr io.Writer) int {
	cfg, o, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "rping:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	out := &output{out: stdout, log: stderr}
	enc := json.NewEncoder(stdout)
	out.emit = func(r *Result) {
		if o.json {
			_ = enc.Encode(r)
			return
		}
		if o.stats {
			fmt.Fprintf(stdout, "%s %s -> %s: %d pings, %s\n", r.Role, r.Local, r.Peer, r.Pings, r.Ended)
			fmt.Fprint(stdout, r.Counters.Lines("  "))
			fmt.Fprintf(stdout, "  qp:     %s\n", cmtool.NonZero(r.QP))
		}
	}
	if o.json {
		out.out = stderr // stdout has only the JSON
	}
	if err := run(ctx, cfg, out); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprint(w, `softrnic's rping (librdmacm's rping over softrnic's verbs and connection manager)
rping -s [-vVd] [-S size] [-C count] -a addr [-p port] [-P]
rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
	-c		client side
	-I		Source address to bind to for client.
	-s		server side.
	-v		display ping data to stdout
	-V		validate ping data
	-d		debug printfs
	-S size 	ping data size (23 to 65535, default 64)
	-C count	ping count times (0: until interrupted)
	-a addr		address
	-p port		port (default 7174)
	-P		persistent server mode allowing multiple connections
	-q		use self-created, self-modified QP (accepted: the same on the wire)
softrnic:
	--dev-addr addr	this side's device address (default: -a for a server; -I, or the
			source address of the route to -a, for a client)
	--udp-port port	this device's RoCEv2 UDP port, and the peer's (default 4791)
	--json		one JSON object per connection on stdout (ping data to stderr)
	--stats		the device's, QP's and connection manager's counters after each connection
	--pcap file	write the device's packets to file (pcap)
	--timeout d	give up after this long (e.g. 30s; default: never)
`)
}

func parseArgs(args []string, stderr io.Writer) (*Config, *options, error) {
	cfg := &Config{}
	o := &options{}
	fs := flag.NewFlagSet("rping", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(fs.Output()) }
	var server, client, selfQP bool
	var addr, source, devAddr string
	fs.BoolVar(&server, "s", false, "server side")
	fs.BoolVar(&client, "c", false, "client side")
	fs.StringVar(&addr, "a", "", "address")
	fs.StringVar(&source, "I", "", "source address to bind to for client")
	fs.BoolVar(&cfg.Persistent, "P", false, "persistent server")
	fs.IntVar(&cfg.Port, "p", defaultPort, "port")
	fs.IntVar(&cfg.Count, "C", 0, "ping count")
	fs.IntVar(&cfg.Size, "S", defaultSize, "ping data size")
	fs.BoolVar(&cfg.Verbose, "v", false, "display ping data")
	fs.BoolVar(&cfg.Validate, "V", false, "validate ping data")
	fs.BoolVar(&cfg.Debug, "d", false, "debug printfs")
	fs.BoolVar(&selfQP, "q", false, "self-created QP (accepted)")
	fs.StringVar(&devAddr, "dev-addr", "", "this side's device address")
	fs.IntVar(&cfg.UDPPort, "udp-port", verbs.DefaultPort, "this device's RoCEv2 UDP port and the peer's")
	fs.BoolVar(&o.json, "json", false, "one JSON object per connection")
	fs.BoolVar(&o.stats, "stats", false, "print the counters after each connection")
	fs.StringVar(&cfg.Pcap, "pcap", "", "write the device's packets to this pcap file")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long")
	if err := fs.Parse(cmtool.ExpandArgs(fs, args)); err != nil {
		return nil, nil, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return nil, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if server == client {
		fs.Usage()
		return nil, nil, errors.New("give one of -s (server) and -c (client)")
	}
	cfg.Server = server
	for _, a := range []struct {
		flag string
		s    string
		dst  *netip.Addr
	}{{"-a", addr, &cfg.Addr}, {"-I", source, &cfg.Source}, {"--dev-addr", devAddr, &cfg.DevAddr}} {
		if a.s == "" {
			continue
		}
		ip, err := cmtool.ResolveAddr(a.s)
		if err != nil {
			return nil, nil, fmt.Errorf("%s %s: %w", a.flag, a.s, err)
		}
		*a.dst = ip
	}
	if cfg.Size < minSize || cfg.Size > maxSize {
		return nil, nil, fmt.Errorf("invalid size %d (valid range is %d to %d)", cfg.Size, minSize, maxSize)
	}
	return cfg, o, nil
}
