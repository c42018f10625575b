// Command rperf is softrnic's perftest: RDMA bandwidth and latency benchmarks over the
// verbs API.
//
//	rperf                        a short loopback suite (both sides in this process)
//	rperf TEST --loopback        one test in this process (devices 127.0.0.1 and 127.0.0.2)
//	rperf TEST                   server: waits for a client on TCP port 18515
//	rperf TEST HOST              client: connects to the server on HOST
//
// With --cm or -R (any of the above; perftest's -R) the queue pairs are connected through
// the connection manager (package cm: ConnectRequest, ConnectReply, ReadyToUse between the
// devices' QP1) instead of by exchanging QP numbers and PSNs over the control connection,
// and disconnected through it after the test. Client and server must both use it. A
// server with it opens its devices (--dev-addr, or one per address of the host) on UDP
// 4791 and listens through the connection manager before any client comes: it serves
// rperf --cm clients (control connection over TCP, QPs through the CM) and perftest's -R
// clients, which speak nothing but rdma_cm (rperf TEST --perftest -R HOST is one).
//
// With --perftest the client speaks perftest's own exchange and runs perftest's traffic,
// so that its server may be perftest's tool (ib_write_bw etc., e.g. on Linux rxe); the
// server speaks it to any client that does (perftest's tools, rperf --perftest), and
// rperf's own protocol to rperf clients without --perftest. Both sides then take their
// parameters from their own flags, as perftest's do, and print perftest's table
// (docs/perftest.md).
//
// Tests: write_bw read_bw send_bw atomic_bw write_lat read_lat send_lat atomic_lat.
// Bandwidth is in MiB/s; latency in microseconds (one way for send_lat and write_lat, the
// whole operation for read_lat and atomic_lat), as perftest reports them.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"

	"github.com/softrnic/softrnic/internal/metricshttp"
	"github.com/softrnic/softrnic/internal/perf"
	"github.com/softrnic/softrnic/metrics"
	"github.com/softrnic/softrnic/verbs"
)

type options struct {
	cfg      perf.Config
	size     string
	all      bool
	loopback bool
	stats    bool
	json     bool
	port     int
	devAddr  string
	faults   string
	metrics  string
}

func main() {
	var o options
	fs := flag.NewFlagSet("rperf", flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage:
  rperf                      run the loopback suite
  rperf TEST --loopback      run one test in this process
  rperf TEST                 serve one client (TCP port %d): an rperf client in rperf's own
                             protocol, any other (perftest's ib_TEST, rperf --perftest) in perftest's
  rperf TEST HOST            run TEST against the server on HOST
  ... --cm, -R               connect the QPs through the connection manager (both sides); with
                             --perftest as perftest's -R: the exchange over rdma_cm too, no TCP; a
                             server listens on its devices (UDP 4791) from the start
  ... --perftest             speak perftest's exchange: the peer may be perftest's ib_TEST (client
                             or server); each side then takes -s, -n, -a, --qps from its own flags
tests: %s
flags:
`, perf.DefaultControlPort, strings.Join(perf.Tests, " "))
		fs.PrintDefaults()
	}
	fs.StringVar(&o.size, "s", "", "message size in bytes (suffixes K, M; default 65536 for _bw, 8 for _lat; with --perftest 2 for _lat)")
	fs.IntVar(&o.cfg.Iters, "n", 0, "iterations (default 5000 for _bw, 10000 for _lat; with --perftest perftest's: 5000 for write_bw, 1000 for the others)")
	fs.BoolVar(&o.all, "a", false, "run all sizes from 2 B to 8 MiB (with --perftest in one connection, as perftest's -a; both sides)")
	fs.IntVar(&o.cfg.MTU, "mtu", 4096, "path MTU: 256, 512, 1024, 2048 or 4096 (with --perftest: this side's offer, default the link's active MTU; the smaller of the two sides' is used)")
	fs.BoolVar(&o.cfg.Perftest, "perftest", false, "speak perftest's exchange (its tools are the peer: ib_write_bw etc.); the device listens on UDP 4791")
	fs.IntVar(&o.cfg.CQMod, "cq-mod", 0, "with --perftest: signal every Nth work request (perftest's -Q; default 100, 1 above 8 KiB)")
	fs.IntVar(&o.cfg.RxDepth, "rx-depth", 0, "with --perftest: receives posted ahead in send_bw and send_lat (perftest's -r; default 512, at most -n)")
	fs.StringVar(&o.cfg.AtomicType, "atomic-type", "", "with --perftest: FETCH_AND_ADD (default) or CMP_AND_SWAP (perftest's -A)")
	fs.IntVar(&o.cfg.QPs, "qps", 1, "number of queue pairs (bandwidth tests)")
	fs.IntVar(&o.cfg.Threads, "t", 1, "goroutines driving the client's QPs in the bandwidth tests, each with QPs and a CQ of its own (QP i: thread i mod t; at most --qps)")
	fs.IntVar(&o.cfg.Threads, "threads", 1, "the same as -t")
	fs.IntVar(&o.cfg.Queues, "queues", 0, "receive queues per device, each a socket with its own goroutines, packets steered by QP (default: one per two processors of GOMAXPROCS, at most 8; a client's applies to the server too, unless the server was given its own)")
	fs.BoolVar(&o.cfg.Events, "e", false, "bandwidth tests: the client sleeps on its CQ's completion channel when it has nothing to post, instead of busy-polling (perftest's -e)")
	fs.BoolVar(&o.cfg.Events, "events", false, "the same as -e")
	fs.IntVar(&o.cfg.TxDepth, "tx-depth", 128, "outstanding work requests per QP (bandwidth tests; with --perftest perftest's -t: 128 for _bw, 1 for _lat, at most -n)")
	fs.BoolVar(&o.cfg.Check, "check", false, "verify every byte received or read")
	fs.BoolVar(&o.stats, "stats", false, "print the devices' packet counters after each test")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per result")
	fs.BoolVar(&o.loopback, "loopback", false, "run both sides in this process")
	fs.BoolVar(&o.cfg.CM, "cm", false, "connect the QPs through the connection manager (package cm; perftest's -R): the server opens its devices (--dev-addr, or every address of the host) on UDP 4791 and listens on them with the control port's number as rdma_cm port before any client comes; client and server must both use it; with --perftest the exchange goes over rdma_cm too")
	fs.BoolVar(&o.cfg.CM, "R", false, "the same as --cm (perftest's -R)")
	fs.IntVar(&o.port, "p", perf.DefaultControlPort, "TCP port of the control connection")
	fs.StringVar(&o.devAddr, "dev-addr", "", "IP address of this side's device (default: the control connection's local address; a --cm server: every address of the host; a --perftest -R client: the address the server is reached from)")
	fs.StringVar(&o.faults, "faults", "", "fault injection, e.g. loss=0.01,reorder=0.02 (default: $SOFTRNIC_FAULTS)")
	var timeout uint
	fs.UintVar(&timeout, "timeout", 14, "local ACK timeout exponent: 4.096 us * 2^timeout (with --perftest -R: default 19, as Linux's rdma_cm gives RoCE QPs)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile to this file")
	traceFile := fs.String("trace", "", "write a Go execution trace to this file (go tool trace FILE; -pprof=sched shows where goroutines waited for a processor)")
	pcapFile := fs.String("pcap", "", "write every packet of the client's device to this pcap file, as its link carries it (tshark -r FILE; up to 256 MiB)")
	ordering := fs.String("ordering", "ordered", "delivery mode to offer: ordered or weak (weak is used only if both sides offer it)")
	fs.StringVar(&o.metrics, "metrics", "", "serve the devices' counters on this address while rperf runs (e.g. 127.0.0.1:9464): Prometheus text at /metrics, expvar JSON at /debug/vars")
	fs.DurationVar(&o.cfg.BusyPoll, "busy-poll", 0, "how long each device's receive goroutine polls after traffic before sleeping (default 50us; negative: never)")

	// Flags may come before or after the positional arguments.
	var pos []string
	args := os.Args[1:]
	for {
		if err := fs.Parse(args); err != nil {
			os.Exit(2)
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	o.cfg.Timeout = uint8(timeout)
	// A server answers perftest clients in perftest's exchange with its own flags, whose
	// defaults are then perftest's: leave the ones not given at zero.
	if o.cfg.Perftest || len(pos) == 1 && !o.loopback {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		if !given["mtu"] {
			o.cfg.MTU = 0
		}
		if !given["tx-depth"] {
			o.cfg.TxDepth = 0
		}
		if !given["timeout"] {
			o.cfg.Timeout = 0 // perftest's: 14, or rdma_cm's 19 with -R
		}
	}
	switch *ordering {
	case "ordered", "strict":
		o.cfg.Ordering = verbs.OrderingOrdered
	case "weak":
		o.cfg.Ordering = verbs.OrderingWeak
	default:
		fatal(fmt.Errorf("--ordering %q: want ordered or weak", *ordering))
	}
	if o.faults != "" {
		f, err := verbs.ParseFaults(o.faults)
		if err != nil {
			fatal(err)
		}
		o.cfg.Faults = &f
	}
	if o.size != "" {
		n, err := parseSize(o.size)
		if err != nil {
			fatal(err)
		}
		o.cfg.Size = n
	}
	if *cpuprofile != "" {
		stop, err := perf.StartCPUProfile(*cpuprofile)
		if err != nil {
			fatal(err)
		}
		defer stop()
	}
	if *traceFile != "" {
		f, err := os.Create(*traceFile)
		if err != nil {
			fatal(err)
		}
		if err := trace.Start(f); err != nil {
			fatal(err)
		}
		defer trace.Stop()
	}
	if *pcapFile != "" {
		f, err := os.Create(*pcapFile)
		if err != nil {
			fatal(err)
		}
		capture, err := verbs.NewPacketCapture(f, 0)
		if err != nil {
			fatal(err)
		}
		o.cfg.Capture = capture
		defer func() {
			if n := capture.Dropped(); n > 0 {
				fmt.Fprintf(os.Stderr, "rperf: %s is full: %d packets not written\n", *pcapFile, n)
			}
			if err := capture.Close(); err != nil {
				fatal(err)
			}
		}()
	}
	if o.metrics != "" {
		srv, err := metricshttp.Start(o.metrics, metrics.Default)
		if err != nil {
			fatal(err)
		}
		defer srv.Close()
		o.cfg.Metrics = metrics.Default
		fmt.Fprintf(os.Stderr, "rperf: metrics at http://%s/metrics\n", srv.Addr())
	}
	if err := run(&o, pos); err != nil {
		pprof.StopCPUProfile()
		fatal(err)
	}

}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "rperf:", err)
	os.Exit(1)
}

func parseSize(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K"), strings.HasSuffix(s, "k"):
		mult, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "M"), strings.HasSuffix(s, "m"):
		mult, s = 1<<20, s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// allSizes is how many sizes -a runs: 2 B to 8 MiB.
const allSizes = 23

// suite is what rperf runs with no arguments: each test once, short.
var suite = []perf.Config{
	{Test: "write_bw", Size: 65536, Iters: 20000},
	{Test: "write_bw", Size: 1 << 20, Iters: 2000},
	{Test: "read_bw", Size: 65536, Iters: 20000},
	{Test: "send_bw", Size: 65536, Iters: 20000},
	{Test: "send_bw", Size: 8, Iters: 200000},
	{Test: "atomic_bw", Size: 8, Iters: 20000},
	{Test: "write_lat", Size: 8, Iters: 20000},
	{Test: "read_lat", Size: 8, Iters: 20000},
	{Test: "send_lat", Size: 8, Iters: 20000},
	{Test: "atomic_lat", Size: 8, Iters: 20000},
}

func run(o *options, pos []string) error {
	var devAddr netip.Addr
	if o.devAddr != "" {
		a, err := netip.ParseAddr(o.devAddr)
		if err != nil {
			return err
		}
		devAddr = a
	}
	printer := newPrinter(o)
	defer printer.finish()
	if len(pos) == 0 {
		via := ""
		if o.cfg.CM {
			via = ", QPs through the connection manager"
		}
		fmt.Fprintf(os.Stderr, "rperf: loopback suite (devices 127.0.0.1 and 127.0.0.2 in this process%s); `rperf -h` for more\n", via)
		for _, c := range suite {
			c.MTU, c.Check, c.Timeout, c.Faults, c.BusyPoll, c.Ordering, c.CM = o.cfg.MTU, o.cfg.Check, o.cfg.Timeout, o.cfg.Faults, o.cfg.BusyPoll, o.cfg.Ordering, o.cfg.CM
			c.Capture, c.Metrics = o.cfg.Capture, o.cfg.Metrics
			if o.cfg.Perftest {
				c.Perftest, c.MTU = true, o.cfg.MTU
			}
			if o.cfg.Iters > 0 {
				c.Iters = o.cfg.Iters
			}
			r, err := perf.RunLoopback(c, perf.DefaultAddrs, o.stats)
			if err != nil {
				return fmt.Errorf("%s: %w", c.Test, err)
			}
			printer.print(r)
		}
		return nil
	}
	if len(pos) > 2 {
		return fmt.Errorf("too many arguments: %q", pos)
	}
	o.cfg.Test = pos[0]
	if o.cfg.Perftest || len(pos) == 1 && !o.loopback {
		// perftest's -a is one connection through every size; a server may find a
		// perftest client.
		o.cfg.AllSizes = o.all
		return runPerftestable(o, pos, devAddr, printer)
	}
	sizes := []int{o.cfg.Size}
	if o.all {
		sizes = nil
		for n := 2; n <= 8<<20; n *= 2 {
			sizes = append(sizes, n)
		}
	}
	for _, size := range sizes {
		c := o.cfg
		c.Size = size
		if o.all && c.Iters == 0 {
			c.Iters = max(100, min(5000, (256<<20)/size))
		}
		var r perf.Result
		var err error
		switch {
		case o.loopback:
			r, err = perf.RunLoopback(c, perf.DefaultAddrs, o.stats)
		default:
			r, err = perf.RunClient(c, net.JoinHostPort(pos[1], strconv.Itoa(o.port)), devAddr, o.stats)
		}
		if err != nil {
			return err
		}
		printer.print(r)
	}
	return nil
}

// runPerftestable runs what may speak perftest's exchange: a server (which serves rperf
// clients in rperf's own mode and any other in perftest's), a client with --perftest, or
// --perftest --loopback.
func runPerftestable(o *options, pos []string, devAddr netip.Addr, printer *printer) error {
	c := o.cfg
	var rs []perf.Result
	var err error
	switch {
	case o.loopback:
		var srv []perf.Result
		rs, srv, err = perf.PerftestLoopback(c, perf.DefaultAddrs, o.stats)
		if err == nil && len(srv) > 0 && !o.json {
			fmt.Fprintf(os.Stderr, "rperf: the server reported:\n")
			for _, r := range srv {
				fmt.Fprintln(os.Stderr, r.PerftestRow())
			}
		}
	case len(pos) == 1:
		how := "rperf clients in rperf's protocol, others in perftest's"
		switch {
		case c.Perftest && c.CM:
			how = "perftest's exchange, over TCP or rdma_cm (-R)"
		case c.Perftest:
			how = "perftest's exchange"
		case c.CM:
			how = "rperf --cm clients in rperf's protocol, perftest's over TCP or over rdma_cm (-R)"
		}
		srv, err := perf.NewServer(c, fmt.Sprintf(":%d", o.port), devAddr)
		if err != nil {
			return err
		}
		defer srv.Close()
		for _, e := range srv.Skipped {
			fmt.Fprintf(os.Stderr, "rperf: %v\n", e)
		}
		where := fmt.Sprintf("TCP port %d", o.port)
		if devs := srv.Devices(); len(devs) > 0 {
			var ds []string
			for _, d := range devs {
				ds = append(ds, d.String())
			}
			where += fmt.Sprintf(" and rdma_cm port %d on devices %s", o.port, strings.Join(ds, " "))
		}
		// A client may connect from now on.
		fmt.Fprintf(os.Stderr, "rperf: %s server waiting on %s (%s)\n", c.Test, where, how)
		// An rperf client with -a connects once per size (23 of them); a perftest client
		// goes through every size in one connection.
		for i, n := 0, 1; i < n; i++ {
			rs, err := srv.ServeOne(o.stats)
			if err != nil {
				return err
			}
			if len(rs) > 0 && rs[0].Perftest && rs[0].Measured == "client" && !o.json {
				fmt.Fprintln(os.Stderr, "rperf: the client's report (perftest's server prints it):")
			}
			for _, r := range rs {
				printer.print(r)
			}
			if i == 0 && o.all && len(rs) > 0 && !rs[0].Perftest {
				n = allSizes
			}
		}
		return nil
	default:
		rs, err = perf.PerftestClient(c, net.JoinHostPort(pos[1], strconv.Itoa(o.port)), devAddr, o.stats)
	}
	if err != nil {
		return err
	}
	for _, r := range rs {
		printer.print(r)
	}
	return nil
}

type printer struct {
	o      *options
	header bool
	enc    *json.Encoder
	// ptTitle is the perftest title printed last (perftest mode's results), "" if none.
	ptTitle string
}

// finish closes a perftest table with perftest's rule.
func (p *printer) finish() {
	if p.ptTitle != "" {
		fmt.Println(perf.PerftestLine)
	}
}

func newPrinter(o *options) *printer {
	return &printer{o: o, enc: json.NewEncoder(os.Stdout)}
}

// printHoles prints the most open holes seen on each side of a weak run.
func printHoles(hs []perf.HoleSample) {
	for _, h := range hs {
		rep := h.Report
		fmt.Printf("  %-6s most open holes seen (QP %#x): %d in requests received, %d in own requests\n",
			h.Side, h.QPNum, len(rep.Responder), len(rep.Requester))
		for i, x := range rep.Responder {
			if i == 8 {
				fmt.Printf("         ... %d more\n", len(rep.Responder)-i)
				break
			}
			fmt.Printf("         received  [%d, %d): %d receive completions, %d READ requests held for the doorbell, %d atomics held\n",
				x.Start, x.End, x.RecvCompletions, x.ReadRequestsHeld, x.AtomicsHeld)
		}
		for i, x := range rep.Requester {
			if i == 8 {
				fmt.Printf("         ... %d more\n", len(rep.Requester)-i)
				break
			}
			fmt.Printf("         requested [%d, %d): %d SEND/WRITE acknowledged, %d READ answered, %d atomics answered\n",
				x.Start, x.End, x.SendsAcked, x.ReadResponsesCompleted, x.AtomicsAnswered)
		}
	}
}

func (p *printer) print(r perf.Result) {
	if p.o.json {
		_ = p.enc.Encode(r)
		return
	}
	switch title := perf.PerftestTitle(r.Test, p.o.cfg.AtomicType); {
	case r.Passive: // perftest mode's read_lat and atomic_lat servers: no figures
	case r.Perftest && title != p.ptTitle:
		// perftest's title and column titles; the rows below are as perftest prints them.
		fmt.Println(perf.PerftestLine)
		fmt.Printf("%s (rperf, peer version %s, MTU %d)\n", title, r.PeerVersion, r.MTU)
		fmt.Println(perf.PerftestLine)
		fmt.Println(perf.PerftestHeader(r.Test))
		p.ptTitle = title
		fmt.Println(r.PerftestRow())
	case r.Perftest:
		fmt.Println(r.PerftestRow())
	default:
		if !p.header {
			fmt.Println(perf.Header())
			p.header = true
		}
		fmt.Println(r.Row())
	}
	if p.o.stats && r.Counters != nil {
		for _, side := range []struct {
			name string
			c    verbs.Counters
		}{{"client", r.Counters.Client}, {"server", r.Counters.Server}} {
			c := side.c
			if c.TxPackets == 0 && c.RxPackets == 0 && r.Perftest {
				continue // perftest mode: the peer's counters are not exchanged
			}
			fmt.Printf("  %-6s tx %d pkts %d B, rx %d pkts %d B, retransmits %d, NAKs sent/recv %d/%d, RNR NAKs sent/recv %d/%d, dup %d, out-of-seq %d, timeouts %d, ICRC err %d, malformed %d, faults lost/reord/dup/corrupt %d/%d/%d/%d, sendmmsg %d, recvmmsg %d, GSO %d, placed as verified %d\n",
				side.name, c.TxPackets, c.TxBytes, c.RxPackets, c.RxBytes, c.Retransmits, c.NAKsSent, c.NAKsReceived,
				c.RNRNAKsSent, c.RNRNAKsReceived, c.Duplicates, c.OutOfSequence, c.Timeouts, c.ICRCErrors, c.Malformed,
				c.FaultsLost, c.FaultsReordered, c.FaultsDuplicated, c.FaultsCorrupted, c.SendCalls, c.RecvCalls, c.GSOSends, c.DirectPlaced)
			if c.WrongSource+c.WrongMode+c.UnknownQP+c.SendErrors+c.SendBlocked > 0 {
				fmt.Printf("  %-6s dropped from other sources %d, of the other ordering mode %d, for unknown QPs %d; sends refused by the kernel %d, sends that waited for buffer space %d\n",
					side.name, c.WrongSource, c.WrongMode, c.UnknownQP, c.SendErrors, c.SendBlocked)
			}
			if len(c.Queues) > 1 {
				fmt.Printf("  %-6s queues:", side.name)
				for i, q := range c.Queues {
					fmt.Printf(" q%d rx %d pkts %d recvmmsg", i, q.RxPackets, q.RecvCalls)
					if q.Misrouted > 0 {
						fmt.Printf(" (%d misrouted)", q.Misrouted)
					}
					if i < len(c.Queues)-1 {
						fmt.Print(",")
					}
				}
				fmt.Println()
			}
			if c.SACKsSent+c.SACKsReceived > 0 || c.PlacedOutOfOrder > 0 {
				fmt.Printf("  %-6s weak: placed out of order %d, holes opened/closed %d/%d, SACKs sent/recv %d/%d, selective retransmits %d, beyond span %d\n",
					side.name, c.PlacedOutOfOrder, c.HolesOpened, c.HolesClosed, c.SACKsSent, c.SACKsReceived, c.SelectiveRetransmits, c.BeyondSpan)
			}
		}
		printHoles(r.Holes)
	}
}
