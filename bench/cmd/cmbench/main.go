// Command cmbench measures connection establishment with package cm: how many RC
// connections per second one client process opens into one listener, each Dial's latency
// (p50, p99, max), how many fail, what the connection managers resent, and how fast the
// connections are torn down again.
//
//	go run ./bench/cmd/cmbench                          1,000 then 10,000 connections
//	go run ./bench/cmd/cmbench -conns 5000 -concurrency 64
//	go run ./bench/cmd/cmbench --json                   one JSON object per connection count
//	go run ./bench/cmd/cmbench -cpuprofile cpu.prof     profiles: cpu.prof (client), cpu.prof.server (listener)
//
// The listener runs in a child process (this program again, with -serve) on a device at
// 127.0.0.2; the client is this process, on a device at 127.0.0.1; both devices take
// ephemeral UDP ports and the child tells the parent its port. The listener has one PD,
// one CQ and one SRQ: every request gets a new RC QP on that SRQ and is accepted in its
// own goroutine. The client has one PD and one CQ, and a new RC QP (one send and one
// receive WQE) per connection; -concurrency Dials are in flight at once (package cm
// itself lets at most cm.MaxREQInFlight requests of a device wait for an answer: a Dial's
// latency includes its wait for that turn).
//
// For each count N the client creates N QPs, then measures from the first Dial to the
// last one established (connections/s), each Dial's own duration, the failures, and its
// connection manager's counters (requests resent, MRAs and REJs received). The listener
// reports how many it established; a count other than N is an error. Then the client
// disconnects all N (-disconnect-concurrency at a time; disconnects/s), the listener
// destroys each QP as its connection ends and the client its QPs after the last
// Disconnect, and the next count starts on the same devices.
//
// Two machines: start the listener with
//
//	cmbench -serve -addr 10.0.0.2 -port 4791      (it runs until its stdin ends)
//
// and the client with cmbench -addr 10.0.0.1 -server 10.0.0.2:4791 (the listener's
// counts are then not checked; it destroys each QP as its connection ends, so it serves
// any number of runs).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/softrnic/softrnic/internal/perf"
	"github.com/softrnic/softrnic/verbs"
)

type options struct {
	conns       []int
	concurrency int
	discConc    int
	ordering    verbs.Ordering
	json        bool
	cpuprofile  string
	mutexprof   string
	serve       bool
	addr        string // this side's device address
	serverAddr  string // the child listener's device address
	server      string // a listener started elsewhere (ADDR:PORT of its device)
	port        int    // this side's UDP port (0: ephemeral)
	service     int
	timeout     time.Duration // CM response timeout (0: cm's default)
	waitLimit   time.Duration
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "cmbench:", err)
		os.Exit(2)
	}
	stopProfile := func() {}
	if o.cpuprofile != "" {
		if stopProfile, err = perf.StartCPUProfile(o.cpuprofile); err != nil {
			fatal(err)
		}
	}
	if o.mutexprof != "" {
		runtime.SetMutexProfileFraction(1)
	}
	if o.serve {
		err = serve(o, os.Stdin, os.Stdout)
	} else {
		err = run(o, os.Stdout)
	}
	stopProfile()
	if o.mutexprof != "" {
		if werr := writeProfile("mutex", o.mutexprof); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		fatal(err)
	}
}

func writeProfile(name, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "cmbench:", err)
	os.Exit(1)
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("cmbench", flag.ContinueOnError)
	conns := fs.String("conns", "1000,10000", "connection counts, comma-separated")
	fs.IntVar(&o.concurrency, "concurrency", 256, "Dials in flight at once")
	fs.IntVar(&o.discConc, "disconnect-concurrency", 64, "Disconnects in flight at once")
	ordering := fs.String("ordering", "ordered", "delivery mode the client offers: ordered or weak (the listener accepts what is offered)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per connection count instead of the table")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write the client's CPU profile to this file (the listener's to FILE.server)")
	fs.StringVar(&o.mutexprof, "mutexprofile", "", "write the client's mutex contention profile to this file (the listener's to FILE.server)")
	fs.BoolVar(&o.serve, "serve", false, "be the listener: print the device address, then answer the client's commands on stdin")
	fs.StringVar(&o.addr, "addr", "", "this side's device address (default 127.0.0.1, with -serve 127.0.0.2)")
	fs.StringVar(&o.serverAddr, "server-addr", "127.0.0.2", "device address of the listener this process starts")
	fs.StringVar(&o.server, "server", "", "dial a listener started elsewhere with -serve (its device's ADDR:PORT) instead of starting one")
	fs.IntVar(&o.port, "port", 0, "this side's UDP port (0: an ephemeral one)")
	fs.IntVar(&o.service, "service", 7471, "the listener's service port (rdma_cm's TCP port space)")
	fs.DurationVar(&o.timeout, "timeout", 0, "CM response timeout before a request is resent (0: cm's default, 1s)")
	fs.DurationVar(&o.waitLimit, "limit", 5*time.Minute, "bound on each round's Dials and on the listener's waits")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, f := range strings.Split(*conns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad connection count %q", f)
		}
		o.conns = append(o.conns, n)
	}
	switch *ordering {
	case "ordered", "strict":
		o.ordering = verbs.OrderingOrdered
	case "weak":
		o.ordering = verbs.OrderingWeak
	default:
		return nil, fmt.Errorf("-ordering %q: want ordered or weak", *ordering)
	}
	if o.concurrency < 1 || o.discConc < 1 {
		return nil, fmt.Errorf("concurrency must be at least 1")
	}
	if o.service < 1 || o.service > 65535 {
		return nil, fmt.Errorf("-service %d out of range", o.service)
	}
	if o.addr == "" {
		o.addr = "127.0.0.1"
		if o.serve {
			o.addr = "127.0.0.2"
		}
	}
	return o, nil
}

// result is one connection count's row, and its JSON object with --json.
type result struct {
	Test                  string  `json:"test"`
	Conns                 int     `json:"conns"`
	Concurrency           int     `json:"concurrency"`
	DisconnectConcurrency int     `json:"disconnect_concurrency"`
	Ordering              string  `json:"ordering"`
	Established           int     `json:"established"`
	Weak                  int     `json:"weak"` // established weakly ordered
	Failures              int     `json:"failures"`
	FirstError            string  `json:"first_error,omitempty"`
	Seconds               float64 `json:"seconds"`
	ConnsPerS             float64 `json:"conns_per_s"`
	DialP50US             float64 `json:"dial_p50_us"`
	DialP99US             float64 `json:"dial_p99_us"`
	DialMaxUS             float64 `json:"dial_max_us"`
	REQSent               uint64  `json:"req_sent"`
	REQRetries            uint64  `json:"req_retries"`
	MRAReceived           uint64  `json:"mra_received"`
	REJReceived           uint64  `json:"rej_received"`
	ClientCMDropped       uint64  `json:"client_cm_dropped"`
	ClientDevDropped      uint64  `json:"client_dev_dropped"`
	// The listener's view (-1: not known, with -server).
	ServerEstablished   int    `json:"server_established"`
	ServerFailures      int    `json:"server_failures"`
	ServerFirstError    string `json:"server_first_error,omitempty"`
	ServerREQDuplicates uint64 `json:"server_req_duplicates"`
	ServerMRASent       uint64 `json:"server_mra_sent"`
	ServerREPRetries    uint64 `json:"server_rep_retries"`
	ServerBacklogDrops  uint64 `json:"server_backlog_drops"`
	ServerDevDropped    uint64 `json:"server_dev_dropped"`
	ServerEnded         int    `json:"server_ended"`     // connections that ended after the Disconnects
	ServerDestroyed     int    `json:"server_destroyed"` // QPs the listener destroyed
	// Teardown.
	Disconnects        int     `json:"disconnects"`
	DisconnectFailures int     `json:"disconnect_failures"`
	DisconnectError    string  `json:"disconnect_error,omitempty"`
	DisconnectSeconds  float64 `json:"disconnect_seconds"`
	DisconnectsPerS    float64 `json:"disconnects_per_s"`
	DREQRetries        uint64  `json:"dreq_retries"`
	OK                 bool    `json:"ok"` // no failure, and the listener established exactly conns
}

// listener is the child process running the listener.
type listener struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	dec  *json.Decoder
	addr netip.AddrPort

	stopOnce sync.Once
	stopErr  error
}

// serverCommand builds the command that runs this program as the listener; the smoke
// test replaces it.
var serverCommand = func(args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return exec.Command(exe, args...), nil
}

func startListener(o *options) (*listener, error) {
	args := []string{"-serve", "-addr", o.serverAddr, "-service", strconv.Itoa(o.service), "-limit", o.waitLimit.String()}
	if o.cpuprofile != "" {
		args = append(args, "-cpuprofile", o.cpuprofile+".server")
	}
	if o.mutexprof != "" {
		args = append(args, "-mutexprofile", o.mutexprof+".server")
	}
	cmd, err := serverCommand(args...)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	l := &listener{cmd: cmd, in: in, dec: json.NewDecoder(out)}
	var hello struct{ Addr string }
	if err := l.dec.Decode(&hello); err != nil {
		l.stop()
		return nil, fmt.Errorf("listener process: %w", err)
	}
	if l.addr, err = netip.ParseAddrPort(hello.Addr); err != nil {
		l.stop()
		return nil, fmt.Errorf("listener process: address %q: %w", hello.Addr, err)
	}
	return l, nil
}

// ask sends a command and reads the answer.
func (l *listener) ask(cmd string) (serverReport, error) {
	var r serverReport
	if _, err := fmt.Fprintln(l.in, cmd); err != nil {
		return r, fmt.Errorf("listener process: %w", err)
	}
	if err := l.dec.Decode(&r); err != nil {
		return r, fmt.Errorf("listener process: %w", err)
	}
	return r, nil
}

// stop ends the child: its stdin closes, it closes its device and exits. Calls after the
// first return the first's result.
func (l *listener) stop() error {
	l.stopOnce.Do(func() {
		l.in.Close()
		done := make(chan error, 1)
		go func() { done <- l.cmd.Wait() }()
		select {
		case l.stopErr = <-done:
		case <-time.After(30 * time.Second):
			_ = l.cmd.Process.Kill()
			l.stopErr = errors.New("listener process did not exit; killed")
		}
	})
	return l.stopErr
}

// run is the client: it starts the listener (or uses -server), then runs each count.
func run(o *options, stdout io.Writer) error {
	results, err := bench(o, os.Stderr)
	if err != nil {
		return err
	}
	printResults(o, stdout, results)
	for _, r := range results {
		if !r.OK {
			return fmt.Errorf("%d connections: %d failed, the listener established %d", r.Conns, r.Failures, r.ServerEstablished)
		}
	}
	return nil
}

// bench runs every count and returns the results; progress goes to log.
func bench(o *options, log io.Writer) ([]result, error) {
	addr, err := netip.ParseAddr(o.addr)
	if err != nil {
		return nil, fmt.Errorf("-addr: %w", err)
	}
	var lis *listener
	var remote netip.AddrPort
	if o.server != "" {
		if remote, err = netip.ParseAddrPort(o.server); err != nil {
			return nil, fmt.Errorf("-server: %w", err)
		}
	} else {
		if lis, err = startListener(o); err != nil {
			return nil, err
		}
		defer lis.stop()
		remote = lis.addr
	}
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: addr, Port: devicePort(o.port)})
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	cl, err := newClient(dev)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "cmbench: client %v, listener %v (service %d), %d Dials in flight, %d Disconnects in flight\n",
		dev.Addr(), remote, o.service, o.concurrency, o.discConc)
	var results []result
	for _, n := range o.conns {
		rc := roundConfig{n: n, c: o.concurrency, dc: o.discConc, remote: netip.AddrPortFrom(remote.Addr(), uint16(o.service)),
			devicePort: remote.Port(), ordering: o.ordering, responseTimeout: o.timeout, limit: o.waitLimit}
		conns, qps, res, err := cl.connect(rc)
		if err != nil {
			return nil, err
		}
		r := result{Test: "connect", Conns: n, Concurrency: o.concurrency, DisconnectConcurrency: o.discConc,
			Ordering: orderingName(o.ordering), Established: res.Established, Weak: res.Weak, Failures: res.Failures,
			FirstError: res.FirstError, Seconds: res.Seconds, DialP50US: us(percentile(res.Latencies, 0.50)),
			DialP99US: us(percentile(res.Latencies, 0.99)), DialMaxUS: us(percentile(res.Latencies, 1)),
			REQSent: res.CM.REQSent, REQRetries: res.CM.REQRetries, MRAReceived: res.CM.MRAReceived,
			REJReceived: res.CM.REJReceived, ClientCMDropped: res.CM.Dropped, ClientDevDropped: res.DevDropped,
			ServerEstablished: -1}
		if res.Seconds > 0 {
			r.ConnsPerS = float64(res.Established) / res.Seconds
		}
		if lis != nil {
			sr, err := lis.ask(fmt.Sprintf("collect %d", res.Established))
			if err != nil {
				return nil, err
			}
			r.ServerEstablished, r.ServerFailures, r.ServerFirstError = sr.Established, sr.Failed, sr.FirstError
			r.ServerREQDuplicates, r.ServerMRASent, r.ServerREPRetries = sr.REQDuplicates, sr.MRASent, sr.REPRetries
			r.ServerBacklogDrops, r.ServerDevDropped = sr.BacklogDrops, sr.DevDropped
			if sr.CMEstablished != uint64(sr.Established) {
				fmt.Fprintf(log, "cmbench: the listener's cm counted %d established, its Accepts %d\n", sr.CMEstablished, sr.Established)
				r.ServerEstablished = min(r.ServerEstablished, int(sr.CMEstablished))
			}
		}
		cl.disconnect(rc, conns, qps, &res)
		r.Disconnects, r.DisconnectFailures, r.DisconnectError = res.Disconnects, res.DisconnectFailures, res.DisconnectError
		r.DisconnectSeconds, r.DREQRetries = res.DisconnectSeconds, res.DisconnectCM.DREQRetries
		if res.DisconnectSeconds > 0 {
			r.DisconnectsPerS = float64(res.Disconnects) / res.DisconnectSeconds
		}
		if lis != nil {
			sr, err := lis.ask("drain")
			if err != nil {
				return nil, err
			}
			r.ServerEnded, r.ServerDestroyed = sr.Ended, sr.Destroyed
			if sr.TimedOut {
				fmt.Fprintf(log, "cmbench: %d connections: the listener saw %d of %d end\n", n, sr.Ended, r.ServerEstablished)
			}
		}
		r.OK = r.Failures == 0 && r.DisconnectFailures == 0 && (lis == nil || r.ServerEstablished == n && r.ServerEnded == n && r.ServerDestroyed == n)
		fmt.Fprintf(log, "cmbench: %d connections: %d established in %.3f s (%.0f/s), Dial p50 %.0f µs p99 %.0f µs max %.0f µs, "+
			"%d failed, REQ sent %d resent %d, MRA %d, REJ %d; listener established %d (failed %d, duplicate REQs %d, MRA sent %d, REP resent %d, backlog drops %d, dropped datagrams %d); "+
			"%d disconnects in %.3f s (%.0f/s), %d failed, DREQ resent %d; QPs destroyed in %.3f s\n",
			n, r.Established, r.Seconds, r.ConnsPerS, r.DialP50US, r.DialP99US, r.DialMaxUS,
			r.Failures, r.REQSent, r.REQRetries, r.MRAReceived, r.REJReceived, r.ServerEstablished, r.ServerFailures,
			r.ServerREQDuplicates, r.ServerMRASent, r.ServerREPRetries, r.ServerBacklogDrops, r.ServerDevDropped,
			r.Disconnects, r.DisconnectSeconds, r.DisconnectsPerS, r.DisconnectFailures, r.DREQRetries, res.DestroySeconds)
		for _, e := range []struct{ what, err string }{{"first Dial error", r.FirstError}, {"listener's first Accept error", r.ServerFirstError}, {"first Disconnect error", r.DisconnectError}} {
			if e.err != "" {
				fmt.Fprintf(log, "cmbench: %d connections: %s: %s\n", n, e.what, e.err)
			}
		}
		results = append(results, r)
	}
	if lis != nil {
		if err := lis.stop(); err != nil {
			return results, fmt.Errorf("listener process: %w", err)
		}
	}
	return results, nil
}

func printResults(o *options, w io.Writer, results []result) {
	if o.json {
		enc := json.NewEncoder(w)
		for _, r := range results {
			_ = enc.Encode(r)
		}
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "conns\tin flight\testablished\tfailed\tseconds\tconns/s\tDial p50\tp99\tmax\tREQ resent\tMRA\tREJ\tlistener established\tdisconnects/s\t")
	for _, r := range results {
		srv := "-"
		if r.ServerEstablished >= 0 {
			srv = strconv.Itoa(r.ServerEstablished)
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%.3f\t%.0f\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%.0f\t\n", r.Conns, r.Concurrency, r.Established, r.Failures,
			r.Seconds, r.ConnsPerS, fmtUS(r.DialP50US), fmtUS(r.DialP99US), fmtUS(r.DialMaxUS), r.REQRetries, r.MRAReceived, r.REJReceived,
			srv, r.DisconnectsPerS)
	}
	tw.Flush()
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func fmtUS(v float64) string {
	if v >= 10000 {
		return fmt.Sprintf("%.1f ms", v/1000)
	}
	return fmt.Sprintf("%.0f µs", v)
}

func orderingName(o verbs.Ordering) string {
	if o == verbs.OrderingWeak {
		return "weak"
	}
	return "ordered"
}
