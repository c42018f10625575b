package cmtool

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
	"strings"
	"sync"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// Local is what every tool's configuration holds besides its C tool's options: which
// device this side opens and how (softrnic's --dev-addr, --udp-port and --pcap), and what
// tests set instead. Each tool embeds it in its Config.
type Local struct {
	DevAddr  netip.Addr // --dev-addr: this side's device (default: see Open)
	UDPPort  int        // --udp-port: this device's RoCEv2 UDP port (4791); a client's peer has the same one
	PeerPort int        // tests: the server device's UDP port (0: UDPPort)
	Pcap     string     // --pcap: the device's packets to this file
	// Device, if set, is the device to use (tests); it is not closed.
	Device *verbs.Device
	// Listening, if set, is called once the server listens (tests).
	Listening func(netip.AddrPort)
}

// Defaults sets the UDP ports left zero: this device's to RoCEv2's 4791, the peer's to
// this device's (the C tools have no way to tell them apart).
func (l *Local) Defaults() {
	if l.UDPPort == 0 {
		l.UDPPort = verbs.DefaultPort
	}
	if l.PeerPort == 0 {
		l.PeerPort = l.UDPPort
	}
}

// Open returns the device a run uses and what releases it. That is l.Device if set (a
// test's, left open); else a device opened at l.DevAddr, or if that is unset at
// fallback (the address the tool's own options bind to: the caller passes the zero
// Addr where they give none), or if that is unset too at the source address of the route
// to peer, as rdma_resolve_addr picks the local device. noRoute starts the error when
// there is no such route, in the C tool's words.
func (l *Local) Open(fallback, peer netip.Addr, noRoute string) (*verbs.Device, func(), error) {
	if l.Device != nil {
		return l.Device, func() {}, nil
	}
	addr := l.DevAddr
	switch {
	case addr.IsValid():
	case fallback.IsValid():
		addr = fallback
	default:
		a, err := LocalAddrFor(peer)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", noRoute, err)
		}
		addr = a
	}
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: addr, Port: l.UDPPort, PcapFile: l.Pcap})
	if err != nil {
		return nil, nil, fmt.Errorf("opening the device at %v: %w", addr, err)
	}
	return dev, func() { dev.Close() }, nil
}

// Options are the flags every tool adds to its C tool's that are not part of a run, and
// --dev-addr as given until ResolveAddrs reads it.
type Options struct {
	JSON    bool          // --json: each result as one JSON object on stdout
	Stats   bool          // --stats: the counters as text after each result
	Timeout time.Duration // --timeout: give up after this long (0: never)
	devAddr string
	local   *Local
}

// NewFlagSet returns the flag set of the tool called name, which writes its errors to
// stderr and its usage with usage, and has the flags every tool adds to its C tool's:
// --dev-addr, --udp-port and --pcap for local, --json, --stats and --timeout for the
// Options returned. The tool adds its C tool's flags, then calls Parse.
func NewFlagSet(name string, stderr io.Writer, usage func(io.Writer), local *Local) (*flag.FlagSet, *Options) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(fs.Output()) }
	o := &Options{local: local}
	fs.StringVar(&o.devAddr, "dev-addr", "", "this side's device address")
	fs.IntVar(&local.UDPPort, "udp-port", verbs.DefaultPort, "this device's RoCEv2 UDP port and the peer's")
	fs.BoolVar(&o.JSON, "json", false, "one JSON object per result")
	fs.BoolVar(&o.Stats, "stats", false, "print the counters after each result")
	fs.StringVar(&local.Pcap, "pcap", "", "write the device's packets to this pcap file")
	fs.DurationVar(&o.Timeout, "timeout", 0, "give up after this long")
	return fs, o
}

// Parse parses args as getopt(3) reads them (ExpandArgs). The tools take no positional
// arguments: one is an error, after the usage.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(ExpandArgs(fs, args)); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return nil
}

// AddrFormat reads -f as cmatose and udaddy do (case aside, by its start): "name", "ip"
// and "ipv6" are rdma_cm's IP addressing, which is softrnic's; "gid" (AF_IB) is refused
// with the error gidErr (each tool's words); anything else draws the C tools' warning on
// stderr and is ignored.
func AddrFormat(format string, stderr io.Writer, gidErr string) error {
	switch f := strings.ToLower(format); {
	case f == "" || strings.HasPrefix(f, "ip") || strings.HasPrefix(f, "name"):
	case strings.HasPrefix(f, "gid"):
		return errors.New(gidErr)
	default:
		fmt.Fprintln(stderr, "Warning: unknown address format")
	}
	return nil
}

// AddrFlag is a flag that names an address: the flag as the error shows it ("-a"), its
// value as given (empty: not given) and where the address goes.
type AddrFlag struct {
	Flag  string
	Value string
	Dst   *netip.Addr
}

// ResolveAddrs resolves the address flags given (ResolveAddr), in order, then
// --dev-addr into the Local of NewFlagSet. An error names the flag and its value.
func (o *Options) ResolveAddrs(flags ...AddrFlag) error {
	for _, a := range append(flags, AddrFlag{"--dev-addr", o.devAddr, &o.local.DevAddr}) {
		if a.Value == "" {
			continue
		}
		ip, err := ResolveAddr(a.Value)
		if err != nil {
			return fmt.Errorf("%s %s: %w", a.Flag, a.Value, err)
		}
		*a.Dst = ip
	}
	return nil
}

// Info returns where the C tool's stdout lines go: stdout, or stderr with --json, which
// keeps stdout for the JSON.
func (o *Options) Info(stdout, stderr io.Writer) io.Writer {
	if o.JSON {
		return stderr
	}
	return stdout
}

// Reporter returns what prints a result on w: with --json one JSON object (a line), else
// with --stats the text stats writes, else nothing.
func Reporter[R any](o *Options, w io.Writer, stats func(w io.Writer, r R)) func(R) {
	enc := json.NewEncoder(w)
	return func(r R) {
		switch {
		case o.JSON:
			_ = enc.Encode(r)
		case o.Stats:
			stats(w, r)
		}
	}
}

// ParseStatus is a tool's exit status when its command line could not be parsed (err):
// 0 for -h (flag printed the usage), else 1, after err on stderr after the tool's name.
func ParseStatus(name string, err error, stderr io.Writer) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return 1
}

// RunContext returns the context a tool runs in: done on an interrupt (SIGINT, as the C
// tools end on it), and after timeout if it is above zero (--timeout). stop releases it.
func RunContext(timeout time.Duration) (ctx context.Context, stop func()) {
	ctx, stopSignal := signal.NotifyContext(context.Background(), os.Interrupt)
	if timeout <= 0 {
		return ctx, stopSignal
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return ctx, func() { cancel(); stopSignal() }
}

// Output is where a tool's run writes, from any of its goroutines one line at a time: Out
// takes the lines the C tool prints on stdout, Log those it prints on stderr, and Emit, if
// set, each result as it is made.
type Output[R any] struct {
	mu   sync.Mutex
	Out  io.Writer
	Log  io.Writer
	Emit func(R)
}

// Printf writes to Out.
func (o *Output[R]) Printf(format string, a ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(o.Out, format, a...)
}

// Logf writes to Log.
func (o *Output[R]) Logf(format string, a ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(o.Log, format, a...)
}

// Result hands r to Emit, if set, one result at a time.
func (o *Output[R]) Result(r R) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.Emit != nil {
		o.Emit(r)
	}
}

// ConnContext returns a context that is done when ctx is, or when done (a connection's
// Done) is closed: what a tool waits in for completions that end with the connection.
func ConnContext(ctx context.Context, done <-chan struct{}) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-done:
			cancel()
		case <-c.Done():
		}
	}()
	return c, cancel
}
