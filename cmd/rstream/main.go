// Command rstream is softrnic's counterpart of librdmacm's rstream (rdma-core,
// librdmacm/examples/rstream.c): a stream benchmark over rsockets (package rsocket, which
// speaks librdmacm's rsocket protocol over softrnic's verbs and connection manager), with
// rstream's flags, test flow and table, so that either side may be the C tool on a RoCE
// device (Linux rxe, a NIC); or over the kernel's TCP (-T s) for comparison.
//
//	client (-s server)                        server
//	16 bytes (the sync)                 ->
//	                                    <-    16 bytes
//	per iteration: C transfers of S bytes ->
//	                                    <-    C transfers of S bytes
//	... every test of the connection, then shutdown and close on both sides
//
// Without -S, -C or -I rstream runs two sets of tests, each on a connection of its own:
// the latency set (one transfer each way per iteration, many iterations) on the first
// connection, which is closed; then the bandwidth set (one iteration of many transfers)
// on a second. The sizes are 64 B, 4 KiB, 64 KiB and 1 MiB, or with -S all the 33 sizes
// of rstream's table (64 B to 6 MiB); the counts shrink as the sizes grow (100000 below
// 1 KiB, 10000 below 64 KiB, 1000 below 1 MiB, then 100). -S, -C or -I make one custom
// test on one connection (defaults 1000 bytes, 1000 transfers, 1 iteration). Each side
// prints, per test, rstream's line: name, bytes per transfer, transfers, iterations, the
// bytes moved both ways, seconds, Gb/sec and microseconds per transfer (one way).
//
//	rstream [-b bind_address] [-B buffer_size] [-I iterations] [-C transfer_count]
//	        [-S transfer_size|all] [-p port] [-k keepalive_time] [-T test_option]    server
//	rstream -s server_address [the same]                                             client
//
// Flags as rstream's, getopt-style: -s the server's address (be the client), -b the
// address to bind (a server's device; a client's source address), -f address format
// (ip, ipv6 or name; gid refused), -B buffer size (rstream's SO_SNDBUF and SO_RCVBUF, 1<<19
// by default; an rsocket's receive ring and send buffer are twice it), -i inline size of
// the latency set (64; a send-side choice), -I iterations, -C transfer count, -S
// transfer size or all, -p port (7471), -k keep-alive seconds (for rsockets the
// connection manager's probe of the peer device: softrnic's rsockets send no rsocket
// keep-alive writes; for TCP, SO_KEEPALIVE), -T test option, one letter or word per -T:
// s|socket (the kernel's TCP through Go's net package, no rsockets), v|verify (check
// every byte: rstream's running byte pattern, both ways, over the whole run), f|fork
// (rstream's forking TCP server: TCP here, served without forking); a|async,
// b|blocking, n|nonblocking and r|resolve are accepted with a note and change nothing
// (Go's reads and writes block their goroutine; addresses are IP addresses).
//
// softrnic's additions: --dev-addr ADDR (this side's device; default -b, or a client's
// route's source address), --udp-port (this device's RoCEv2 UDP port and the peer's,
// 4791), --ordering ordered|weak (the delivery mode offered: weak is used only between
// softrnic devices that both offer it), --busy-poll (how long a blocked read or write
// polls its completion queue before it sleeps; default 50µs, 0: it sleeps at once),
// --nodelay (every write goes out at once, as librdmacm's do: rsocket.Options.NoDelay),
// --json (one JSON object per test on stdout, with the process's CPU time over the test
// and per GiB moved; rstream's table then goes to stderr), --stats (the device's and
// connection manager's counters after each test), --pcap FILE, --timeout, --cpuprofile
// FILE. Fault injection comes from SOFTRNIC_FAULTS, as for every device.
//
// Where it differs from rstream, off the wire: a client's -b binds its source address
// with any port (rstream binds the -p port too); an rsocket server's listener takes the
// inline size of the first set for both connections (rstream changes it between them;
// the peer cannot see it); a test that fails ends the run (rstream goes on with the next
// test of the set, the two sides' byte counts then out of step).
//
// The exit status is 0 when every test ran (and every byte matched, with -T v), 1
// otherwise.
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
	"github.com/softrnic/softrnic/verbs"
)

func main() {
	os.Exit(mainArgs(os.Args[1:], os.Stdout, os.Stderr))
}

// mainArgs is the command: arguments in, exit status out.
func mainArgs(args []string, stdout, stderr io.Writer) int {
	cfg, o, err := parseArgs(args, stderr)
	if err != nil {
		return cmtool.ParseStatus("rstream", err, stderr)
	}
	if o.cpuprofile != "" {
		stop, err := perf.StartCPUProfile(o.cpuprofile)
		if err != nil {
			fmt.Fprintln(stderr, "rstream:", err)
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
		fmt.Fprintln(stderr, "rstream:", err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: rstream (softrnic's, over its rsockets)
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
	[-k keepalive_time]
	[-T test_option]
	    s|sockets - use standard tcp/ip sockets (Go's net package)
	    a|async - asynchronous operation (accepted; Go's calls block their goroutine)
	    b|blocking - use blocking calls (accepted; they are)
	    f|fork - fork server processing (TCP, served without forking)
	    n|nonblocking - use nonblocking calls (accepted; Go's calls block their goroutine)
	    r|resolve - use rdma cm to resolve address (accepted; IP addresses)
	    v|verify - verify data
softrnic:
	[--dev-addr addr]	this side's device address (default: -b; a client: the route's source)
	[--udp-port port]	this device's RoCEv2 UDP port, and the peer's (default 4791)
	[--ordering mode]	ordered (default) or weak (used if both sides offer it)
	[--busy-poll d]		how long a blocked read or write polls before it sleeps (default 50µs; 0: none)
	[--nodelay]		every write goes out at once (default: writes behind one on its way join the next message)
	[--json]		one JSON object per test on stdout (rstream's table to stderr)
	[--stats]		the device's and connection manager's counters after each test
	[--pcap file]		write the device's packets to file (pcap)
	[--timeout d]		give up after this long (e.g. 60s; default: never)
	[--cpuprofile file]	write a CPU profile of the run to file
`)
}

// options are the flags that are not the run's.
type options struct {
	*cmtool.Options
	cpuprofile string
}

func parseArgs(args []string, stderr io.Writer) (*Config, *options, error) {
	cfg := &Config{}
	fs, co := cmtool.NewFlagSet("rstream", stderr, usage, &cfg.Local)
	o := &options{Options: co}
	var server, bind, format, ordering string
	var notes []string
	fs.StringVar(&server, "s", "", "server address")
	fs.StringVar(&bind, "b", "", "bind address")
	fs.StringVar(&format, "f", "", "address format")
	fs.IntVar(&cfg.Buffer, "B", 0, "buffer size")
	fs.IntVar(&cfg.Inline, "i", defaultInline, "inline size")
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
	fs.IntVar(&cfg.Port, "p", defaultPort, "port number")
	fs.IntVar(&cfg.KeepAlive, "k", 0, "keepalive time")
	fs.Func("T", "test option", func(s string) error {
		t, ok := streamtool.LookupTestOption(testOptions, s)
		if !ok {
			return fmt.Errorf("unknown test option %q", s)
		}
		switch t.Letter {
		case 's':
			cfg.Sockets = true
		case 'f':
			cfg.Sockets = true
			notes = append(notes, "-T "+s+": "+t.Note)
		case 'v':
			cfg.Verify = true
		default:
			notes = append(notes, "-T "+s+": "+t.Note)
		}
		return nil
	})
	fs.StringVar(&ordering, "ordering", "ordered", "ordered or weak")
	busySet := streamtool.BusyPollFlag(fs, &cfg.BusyPoll)
	fs.BoolVar(&cfg.NoDelay, "nodelay", false, "every write goes out at once")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile to this file")
	if err := cmtool.Parse(fs, args); err != nil {
		return nil, nil, err
	}
	for _, n := range notes {
		fmt.Fprintln(stderr, "rstream: note:", n)
	}
	if err := cmtool.AddrFormat(format, stderr, "-f gid: softrnic's connection manager speaks rdma_cm's IP addressing only (no AF_IB)"); err != nil {
		return nil, nil, err
	}
	switch ordering {
	case "ordered", "strict":
		cfg.Ordering = verbs.OrderingOrdered
	case "weak":
		cfg.Ordering = verbs.OrderingWeak
	default:
		return nil, nil, fmt.Errorf("--ordering %q: want ordered or weak", ordering)
	}
	if cfg.Sockets && (ordering != "ordered" || busySet() || cfg.NoDelay) {
		fmt.Fprintln(stderr, "rstream: note: --ordering, --busy-poll and --nodelay apply to rsockets, not to -T s")
	}
	if err := o.ResolveAddrs(cmtool.AddrFlag{Flag: "-s", Value: server, Dst: &cfg.ServerAddr},
		cmtool.AddrFlag{Flag: "-b", Value: bind, Dst: &cfg.Bind}); err != nil {
		return nil, nil, err
	}
	if cfg.Port == 0 && !cfg.Sockets {
		return nil, nil, errors.New("-p 0: an rsocket listens on a port of its own choosing only with -T s")
	}
	return cfg, o, nil
}

// atoi reads a count as rstream does, but refuses what is not a number.
func atoi(s string, dst *int) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("%q is not a number", s)
	}
	*dst = n
	return nil
}
