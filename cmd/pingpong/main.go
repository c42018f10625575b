// Command pingpong is softrnic's counterpart of rdma-core's ibv_rc_pingpong and
// ibv_ud_pingpong: the same flags where they make sense, the same TCP exchange of
// "LID:QPN:PSN:GID" on port 18515 (server waits, client connects), the same ping-pong of
// SENDs and the same result lines, over softrnic's verbs API. Either side may be the C
// tool on a RoCE device (Linux rxe, a NIC), or this command.
//
//	pingpong rc [flags]            server: waits for a client on TCP port 18515
//	pingpong rc [flags] HOST       client: connects to the server on HOST
//	pingpong ud [flags] [HOST]     the same with UD queue pairs (ibv_ud_pingpong)
//
// Installed or linked under a name ending in rc_pingpong or ud_pingpong, the mode is
// implied by the name. The device is an IP address (-d / --dev-addr; default: the local
// address of the TCP connection) and UDP port 4791. Against a C peer, run it with -g (its
// RoCEv2 GID: index 1 on rxe over IPv4), as RoCE needs GIDs.
//
// Flags as the C tools': -p port, -d device address, -i ib port (1), -s size (rc 4096, ud
// 1024), -m path MTU (rc 1024; ud: the port's active MTU, from the interface's MTU, which also
// bounds -s, as ud_pingpong's port MTU), -r rx depth (500), -n iters (1000), -l service
// level (accepted: RoCEv2 carries none), -e sleep on the completion channel, -g GID index
// (accepted: the device has one GID, its address, and always sends it), -c validate the
// buffer (as the C tools: the client writes 0 at the start of every page of its 0x7b
// buffer, the server checks; here both sides also check every byte of every message
// received, and exit 1 on a difference). -o, -O, -P, -t and -j (on-demand paging,
// prefetch, completion timestamps, device memory) are refused; -N and -U are accepted and
// change nothing. And: --json (one JSON object per result, with one-way latency
// percentiles: half of each iteration), --stats (the device's and the QP's packet
// counters), --pcap FILE (the device's packets), --udp-port (softrnic extension: this
// device's RoCEv2 port and the peer's, 4791), --timeout (give up after this long).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/verbs"
)

func main() {
	os.Exit(mainArgs(os.Args, os.Stdout, os.Stderr))
}

// mainArgs is the command: argv in, exit status out.
func mainArgs(argv []string, stdout, stderr io.Writer) int {
	name := filepath.Base(argv[0])
	mode := ""
	switch {
	case strings.HasSuffix(name, "rc_pingpong"):
		mode = "rc"
	case strings.HasSuffix(name, "ud_pingpong"):
		mode = "ud"
	}
	cfg, o, err := parseArgs(mode, argv[1:], stderr)
	if err != nil {
		return cmtool.ParseStatus("pingpong", err, stderr)
	}
	ctx, stop := cmtool.RunContext(o.timeout)
	defer stop()
	info := stdout
	if o.json {
		info = stderr // stdout has only the JSON
	}
	r, err := run(ctx, cfg, info)
	if err != nil {
		fmt.Fprintln(stderr, "pingpong:", err)
		return 1
	}
	if o.json {
		_ = json.NewEncoder(stdout).Encode(r)
	} else {
		fmt.Fprint(stdout, r.Lines())
		for _, pg := range r.InvalidPages {
			fmt.Fprintf(stdout, "invalid data in page %d\n", pg)
		}
		if r.BadMessages > 0 {
			fmt.Fprintf(stdout, "%d of %d messages received differed from the client's buffer\n", r.BadMessages, r.Iters)
		}
		if r.Device != nil {
			fmt.Fprintln(stdout, "  device:", countersLine(r.Device, true))
			fmt.Fprintln(stdout, "  QP:    ", countersLine(r.QP, false))
		}
	}
	if r.Invalid() {
		return 1
	}
	return 0
}

// options are the flags that are not the run's.
type options struct {
	json    bool
	timeout time.Duration
}

// refused are the C tools' flags that have no meaning here.
var refused = []struct{ short, long, what string }{
	{"o", "odp", "on-demand paging"},
	{"O", "iodp", "implicit on-demand paging"},
	{"P", "prefetch", "prefetching an ODP MR"},
	{"t", "ts", "completion timestamps"},
	{"j", "dm", "device memory"},
}

func parseArgs(mode string, args []string, stderr io.Writer) (*Config, *options, error) {
	cfg := &Config{Size: -1, GIDIndex: -1}
	o := &options{}
	fs := flag.NewFlagSet("pingpong", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage:
  pingpong rc|ud [flags]          start a server and wait for connection
  pingpong rc|ud [flags] <host>   connect to server at <host>
(softrnic's ibv_rc_pingpong and ibv_ud_pingpong; rc_pingpong or ud_pingpong as the
command's name implies the mode; -x and --x are the same; flags before or after <host>)

Options:
  -p, --port=<port>      listen on/connect to TCP port <port> (default 18515)
  -d, --ib-dev=<addr>    this side's device: its IP address (also --dev-addr;
                         default: the TCP connection's local address)
  -i, --ib-port=<port>   use port <port> of the device (it has one: 1)
  -s, --size=<size>      size of message to exchange (default rc 4096, ud 1024)
  -m, --mtu=<size>       path MTU (default rc 1024; ud: the active MTU of the device's
                         interface, which also bounds -s, as ud_pingpong's port MTU)
  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)
  -n, --iters=<iters>    number of exchanges (default 1000)
  -l, --sl=<sl>          service level (accepted; RoCEv2 carries none)
  -e, --events           sleep on CQ events (default poll)
  -g, --gid-idx=<index>  local port GID index (accepted: the device has one GID, its
                         address, and always sends it; give the C peer -g)
  -c, --chk              validate received buffer (both sides check every message;
                         exit status 1 on a difference)
  -o, -O, -P, -t, -j     (ODP, implicit ODP, prefetch, timestamps, device memory): refused
  -N, -U                 accepted; change nothing
  --json                 one JSON object per result on stdout (address lines on stderr)
  --stats                the device's and the QP's packet counters after the run
  --pcap=<file>          write the device's packets to <file> (pcap)
  --udp-port=<port>      this device's RoCEv2 UDP port and the peer's (default 4791)
  --timeout=<duration>   give up after this long (default: wait for ever)
`)
	}
	both := func(short, long string, fn func(name string)) { fn(short); fn(long) }
	both("p", "port", func(n string) { fs.IntVar(&cfg.Port, n, 18515, "listen on/connect to TCP port `port`") })
	var dev string
	both("d", "ib-dev", func(n string) {
		fs.StringVar(&dev, n, "", "this side's device: its IP `address` (default: the TCP connection's local address)")
	})
	fs.StringVar(&dev, "dev-addr", "", "the same as -d")
	both("i", "ib-port", func(n string) { fs.IntVar(&cfg.IBPort, n, 1, "use `port` of the device (it has one: 1)") })
	both("s", "size", func(n string) {
		fs.IntVar(&cfg.Size, n, -1, "`size` of message to exchange (default rc 4096, ud 1024)")
	})
	both("m", "mtu", func(n string) {
		fs.IntVar(&cfg.MTU, n, 0, "path MTU `bytes` (default rc 1024; ud: the interface's active MTU, and the limit of -s)")
	})
	both("r", "rx-depth", func(n string) { fs.IntVar(&cfg.RxDepth, n, 500, "number of receives to post at a time") })
	both("n", "iters", func(n string) { fs.IntVar(&cfg.Iters, n, 1000, "number of exchanges") })
	both("l", "sl", func(n string) { fs.IntVar(&cfg.SL, n, 0, "service level (accepted; RoCEv2 carries none)") })
	both("e", "events", func(n string) { fs.BoolVar(&cfg.Events, n, false, "sleep on CQ events (default poll)") })
	both("g", "gid-idx", func(n string) {
		fs.IntVar(&cfg.GIDIndex, n, -1, "local port GID `index` (accepted: the device's one GID, its address, is always sent)")
	})
	both("c", "chk", func(n string) { fs.BoolVar(&cfg.Check, n, false, "validate received buffer") })
	var ignored bool
	both("N", "new_send", func(n string) { fs.BoolVar(&ignored, n, false, "use new post send WR API (accepted: there is one)") })
	both("U", "allow-cc-unprotected", func(n string) { fs.BoolVar(&ignored, n, false, "accepted; no meaning here") })
	refuse := make([]bool, len(refused))
	for i, r := range refused {
		both(r.short, r.long, func(n string) { fs.BoolVar(&refuse[i], n, false, "refused: softrnic has no "+r.what) })
	}
	fs.BoolVar(&o.json, "json", false, "print one JSON object per result (the address lines go to stderr)")
	fs.BoolVar(&cfg.Stats, "stats", false, "print the device's and the QP's packet counters after the run")
	fs.StringVar(&cfg.Pcap, "pcap", "", "write the device's packets to this pcap `file`")
	fs.IntVar(&cfg.UDPPort, "udp-port", verbs.DefaultPort, "this device's RoCEv2 UDP port, and the peer's (softrnic extension; a standard peer uses 4791)")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long (default: wait for ever, as the C tools)")

	// Flags may come before or after the positional arguments.
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	for i, r := range refused {
		if refuse[i] {
			return nil, nil, fmt.Errorf("-%s/--%s: softrnic has no %s", r.short, r.long, r.what)
		}
	}
	if mode == "" {
		if len(pos) == 0 || (pos[0] != "rc" && pos[0] != "ud") {
			fs.Usage()
			return nil, nil, fmt.Errorf("the first argument is the mode: rc or ud")
		}
		mode, pos = pos[0], pos[1:]
	}
	cfg.Mode = mode
	switch len(pos) {
	case 0:
	case 1:
		cfg.Server = pos[0]
	default:
		fs.Usage()
		return nil, nil, fmt.Errorf("too many arguments: %q", pos)
	}
	if dev != "" {
		a, err := netip.ParseAddr(dev)
		if err != nil {
			return nil, nil, fmt.Errorf("-d %q: a softrnic device is named by its IP address (e.g. -d 10.77.0.1)", dev)
		}
		cfg.DevAddr = a
	}
	if cfg.Port < 0 || cfg.Port > 65535 {
		return nil, nil, fmt.Errorf("port %d out of range", cfg.Port)
	}
	return cfg, o, nil
}

// countersLine formats the counters that say whether the run was clean.
func countersLine(c *verbs.Counters, device bool) string {
	s := fmt.Sprintf("tx %d pkts %d B, rx %d pkts %d B, retransmits %d, NAKs sent/recv %d/%d, RNR NAKs sent/recv %d/%d, dup %d, out-of-seq %d, timeouts %d, wrong source %d, dropped %d",
		c.TxPackets, c.TxBytes, c.RxPackets, c.RxBytes, c.Retransmits, c.NAKsSent, c.NAKsReceived,
		c.RNRNAKsSent, c.RNRNAKsReceived, c.Duplicates, c.OutOfSequence, c.Timeouts, c.WrongSource, c.Dropped)
	if c.QKeyErrors > 0 || !device {
		s += fmt.Sprintf(", Q_Key errors %d", c.QKeyErrors)
	}
	if device {
		s += fmt.Sprintf(", ICRC errors %d, malformed %d, unknown QP %d, send errors %d",
			c.ICRCErrors, c.Malformed, c.UnknownQP, c.SendErrors)
	}
	return s
}
