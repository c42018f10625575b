// Command riostream is softrnic's counterpart of librdmacm's riostream (rdma-core,
// librdmacm/examples/riostream.c): rstream's benchmark, with the bytes moved by rsockets'
// direct writes instead of the stream. Each side maps its transfer buffer into the
// peer's iomap table (riomap; every rsocket offers a table of one entry,
// RDMA_IOMAPSIZE 1) and the peer writes into it with plain RDMA WRITEs (riowrite);
// nothing tells a side that bytes arrived but a marker in the buffer's last byte, which
// it polls. Package rsocket speaks librdmacm's protocol over softrnic's verbs and
// connection manager, so either side may be the C tool on a RoCE device (Linux rxe, a
// NIC).
//
//	client (-s server)                                   server
//	riomap the buffer (its entry goes to the peer)  ->  <-  riomap the buffer
//	16 bytes in the stream (the sync)               ->
//	                                                <-      16 bytes
//	per iteration: C-1 riowrites of S bytes, then
//	one with the client's marker in the last byte   ->      wait for the marker
//	wait for the marker                             <-      the same back
//	riounmap; the next test; then shutdown and close on both sides
//
// The markers count 0, 1, 2, ... (mod 256) over a test's messages, the client's the
// even ones; before the first iteration each side sets its buffer's last byte to 0xff.
// Without -S, -C or -I riostream runs rstream's two sets of tests, each on a connection
// of its own: the latency set (one transfer each way per iteration, many iterations),
// then the bandwidth set (one iteration of many transfers). The sizes are 64 B, 4 KiB,
// 64 KiB and 1 MiB, or with -S all the 33 sizes of the table (64 B to 6 MiB); the
// counts shrink as the sizes grow (100000 below 1 KiB, 10000 below 64 KiB, 1000 below
// 1 MiB, then 100). -S, -C or -I make one custom test on one connection (defaults 1000
// bytes, 1000 transfers, 1 iteration). Each side prints, per test, the tool's line:
// name, bytes per transfer, transfers, iterations, the bytes moved both ways, seconds,
// Gb/sec and microseconds per transfer (one way).
//
//	riostream [-b bind_address] [-B buffer_size] [-I iterations] [-C transfer_count]
//	          [-S transfer_size|all] [-p port] [-T test_option]        server
//	riostream -s server_address [the same]                             client
//
// Flags as riostream's (rstream's without -k), getopt-style: -s the server's address
// (be the client), -b the address to bind (a server's device), -f address format (ip,
// ipv6 or name; gid refused), -B buffer size (SO_SNDBUF and SO_RCVBUF, 1<<19 by default;
// an rsocket's receive ring and send buffer are twice it), -i inline size of the latency
// set (64; a send-side choice), -I iterations, -C transfer count, -S transfer size or
// all, -p port (7471), -T test option, one letter or word per -T: v|verify (check the
// bytes before the marker of each iteration's last write, riostream's running byte
// pattern, both ways, over the whole run: the other writes carry whatever the buffer
// holds, as the C tool's do); a|async, b|blocking and n|nonblocking are accepted with a
// note and change nothing (Go's calls block their goroutine; the marker is polled
// either way). rstream's -T s (the kernel's TCP) is refused: direct writes into a
// mapped buffer exist only over rsockets (riostream has no such option either; rstream
// -T s is the comparison over TCP).
//
// softrnic's additions: --dev-addr ADDR (this side's device; default -b, or a client's
// route's source address), --udp-port (this device's RoCEv2 UDP port and the peer's,
// 4791), --busy-poll (how long a call blocked in the stream polls its completion queue
// before it sleeps), --json (one JSON object per test on stdout, with the process's CPU
// time over the test and per GiB moved; the table then goes to stderr), --stats (the
// device's and connection manager's counters after each test), --pcap FILE, --timeout,
// --cpuprofile FILE. Direct writes need ordered mode, so there is no --ordering.
//
// Where it differs from riostream, off the wire: the wait for a marker yields the
// processor between polls, then sleeps between them (the device's goroutines share the
// processors, and wait for packets in the runtime's network poller), and ends with
// --timeout or an interrupt (the C tool spins until the marker comes); an rsocket
// server's listener takes the inline size of the first set for both connections; a test
// that fails ends the run. On the wire a mapping's entry goes to the peer when IOMap is
// called, where librdmacm sends it with the next rsend or riowrite: before the sync
// either way.
//
// The exit status is 0 when every test ran (and every byte checked matched, with -T v),
// 1 otherwise.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/internal/perf"
	"github.com/softrnic/softrnic/internal/streamtool"
)

func main() {
	os.Exit(mainArgs(os.Args[1:], os.Stdout, os.Stderr))
}

// mainArgs is the command: arguments in, exit status out.
func mainArgs(args []string, stdout, stderr io.Writer) int {
	cfg, o, err := parseArgs(args, stderr)
	if err != nil {
		return cmtool.ParseStatus("riostream", err, stderr)
	}
	if o.cpuprofile != "" {
		stop, err := perf.StartCPUProfile(o.cpuprofile)
		if err != nil {
			fmt.Fprintln(stderr, "riostream:", err)
			return 1
		}
		defer stop()
	}
	ctx, stop := cmtool.RunContext(o.Timeout)
	defer stop()
	out := &output{Out: o.Info(stdout, stderr), Log: stderr, Emit: cmtool.Reporter(o.Options, stdout, func(w io.Writer, r *Result) {
		if r.Counters != nil {
			fmt.Fprint(w, r.Counters.Lines("  "))
		}
	})}
	if err := run(ctx, cfg, out); err != nil {
		fmt.Fprintln(stderr, "riostream:", err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: riostream (softrnic's, over its rsockets)
	[-s server_address]
	[-b bind_address]
	[-f address_format]
	    name, ip, ipv6 (gid: refused)
	[-B buffer_size]
	[-i inline_size]
	[-I iterations]
	[-C transfer_count]
	[-S transfer_size or all]
	[-p port_number]
	[-T test_option]
	    a|async - asynchronous operation (accepted; Go's calls block their goroutine)
	    b|blocking - use blocking calls (accepted; they are)
	    n|nonblocking - use nonblocking calls (accepted; Go's calls block their goroutine)
	    v|verify - verify data
softrnic:
	[--dev-addr addr]	this side's device address (default: -b; a client: the route's source)
	[--udp-port port]	this device's RoCEv2 UDP port, and the peer's (default 4791)
	[--busy-poll d]		how long a call blocked in the stream polls before it sleeps (default 50µs; 0: none)
	[--json]		one JSON object per test on stdout (riostream's table to stderr)
	[--stats]		the device's and connection manager's counters after each test
	[--pcap file]		write the device's packets to file (pcap)
	[--timeout d]		give up after this long (e.g. 60s; default: never)
	[--cpuprofile file]	write a CPU profile of the run to file
`)
}

// testOptions are riostream's -T options, as it reads them.
var testOptions = []streamtool.TestOption{
	{Letter: 'a', Word: "async", What: "asynchronous operation (poll)", Note: "Go's calls block their goroutine: there is nothing to poll"},
	{Letter: 'b', Word: "block", What: "blocking calls", Note: "Go's calls are blocking calls, and the marker is polled either way"},
	{Letter: 'n', Word: "nonblock", What: "non-blocking calls", Note: "Go's calls block their goroutine (the runtime polls), and the marker is polled either way"},
	{Letter: 'v', Word: "verify", What: "verify data"},
}

// errSockets is -T s's refusal.
var errSockets = errors.New("-T s: riostream moves its bytes by direct writes into a buffer the peer mapped (riomap, riowrite), which exist only over rsockets: there is no TCP mode (rstream -T s compares with TCP)")

// options are the flags that are not the run's.
type options struct {
	*cmtool.Options
	cpuprofile string
}

func parseArgs(args []string, stderr io.Writer) (*Config, *options, error) {
	cfg := &Config{}
	fs, co := cmtool.NewFlagSet("riostream", stderr, usage, &cfg.Local)
	o := &options{Options: co}
	var server, bind, format string
	var notes []string
	fs.StringVar(&server, "s", "", "server address")
	fs.StringVar(&bind, "b", "", "bind address")
	fs.StringVar(&format, "f", "", "address format")
	fs.IntVar(&cfg.Buffer, "B", 0, "buffer size")
	fs.IntVar(&cfg.Inline, "i", streamtool.DefaultInline, "inline size")
	fs.Func("I", "iterations", func(s string) error {
		cfg.Custom = true
		return atoi(s, &cfg.Iters)
	})
	fs.Func("C", "transfer count", func(s string) error {
		cfg.Custom = true
		return atoi(s, &cfg.Count)
	})
	fs.Func("S", "transfer size or all", func(s string) error {
		if strings.HasPrefix(strings.ToLower(s), "all") {
			cfg.AllSizes = true
			return nil
		}
		cfg.Custom = true
		return atoi(s, &cfg.Size)
	})
	fs.IntVar(&cfg.Port, "p", streamtool.DefaultPort, "port number")
	fs.Func("T", "test option", func(s string) error {
		if s == "s" || strings.HasPrefix(strings.ToLower(s), "socket") {
			return errSockets
		}
		t, ok := streamtool.LookupTestOption(testOptions, s)
		if !ok {
			return fmt.Errorf("unknown test option %q", s)
		}
		if t.Letter == 'v' {
			cfg.Verify = true
		} else {
			notes = append(notes, "-T "+s+": "+t.Note)
		}
		return nil
	})
	streamtool.BusyPollFlag(fs, &cfg.BusyPoll)
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile to this file")
	if err := cmtool.Parse(fs, args); err != nil {
		return nil, nil, err
	}
	for _, n := range notes {
		fmt.Fprintln(stderr, "riostream: note:", n)
	}
	if err := cmtool.AddrFormat(format, stderr, "-f gid: softrnic's connection manager speaks rdma_cm's IP addressing only (no AF_IB)"); err != nil {
		return nil, nil, err
	}
	if err := o.ResolveAddrs(cmtool.AddrFlag{Flag: "-s", Value: server, Dst: &cfg.ServerAddr},
		cmtool.AddrFlag{Flag: "-b", Value: bind, Dst: &cfg.Bind}); err != nil {
		return nil, nil, err
	}
	return cfg, o, nil
}

// atoi reads a count as riostream does, but refuses what is not a number.
func atoi(s string, dst *int) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("%q is not a number", s)
	}
	*dst = n
	return nil
}
