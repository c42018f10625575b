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
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/softrnic/softrnic/internal/cmtool"
)

func main() {
	os.Exit(mainArgs(os.Args[1:], os.Stdout, os.Stderr))
}

// mainArgs is the command: arguments in, exit status out.
func mainArgs(args []string, stdout, stderr io.Writer) int {
	cfg, o, err := parseArgs(args, stderr)
	if err != nil {
		return cmtool.ParseStatus("rping", err, stderr)
	}
	ctx, stop := cmtool.RunContext(o.Timeout)
	defer stop()
	out := &output{Out: o.Info(stdout, stderr), Log: stderr, Emit: cmtool.Reporter(o, stdout, func(w io.Writer, r *Result) {
		fmt.Fprintf(w, "%s %s -> %s: %d pings, %s\n", r.Role, r.Local, r.Peer, r.Pings, r.Ended)
		fmt.Fprint(w, r.Counters.Lines("  "))
		fmt.Fprintf(w, "  qp:     %s\n", cmtool.NonZero(r.QP))
	})}
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

func parseArgs(args []string, stderr io.Writer) (*Config, *cmtool.Options, error) {
	cfg := &Config{}
	fs, o := cmtool.NewFlagSet("rping", stderr, usage, &cfg.Local)
	var server, client, selfQP bool
	var addr, source string
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
	if err := cmtool.Parse(fs, args); err != nil {
		return nil, nil, err
	}
	if server == client {
		fs.Usage()
		return nil, nil, errors.New("give one of -s (server) and -c (client)")
	}
	cfg.Server = server
	if err := o.ResolveAddrs(cmtool.AddrFlag{Flag: "-a", Value: addr, Dst: &cfg.Addr},
		cmtool.AddrFlag{Flag: "-I", Value: source, Dst: &cfg.Source}); err != nil {
		return nil, nil, err
	}
	if cfg.Size < minSize || cfg.Size > maxSize {
		return nil, nil, fmt.Errorf("invalid size %d (valid range is %d to %d)", cfg.Size, minSize, maxSize)
	}
	return cfg, o, nil
}
