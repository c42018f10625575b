// Command ucmatose is softrnic's counterpart of librdmacm's ucmatose (rdma-core,
// librdmacm/examples/cmatose.c): many RC connections at once through the connection
// manager (package cm; rdma_cm's TCP port space, default port 7471), SENDs on each both
// ways, then a disconnect, step for step as the C tool, so that either side may be the C
// tool on a RoCE device (Linux rxe, a NIC):
//
//	server (no -s)                            client (-s server)
//	accept -c connections                     connect -c connections
//	post -C SENDs of -S bytes on each    ->   receive -C messages on each
//	complete them; receive -C on each    <-   post -C SENDs on each
//	disconnect every connection          ->   (waits for the disconnects)
//
// As cmatose, every node posts its -C receives before it connects or accepts, every SEND
// is signaled, and the connection parameters are cmatose's (responder resources and
// initiator depth 1, retry count 5, RNR retry count 0). cmatose checks no data: neither
// does this command, beyond each message's length; -V (softrnic's addition, for two
// softrnic peers) fills message i with a pattern and checks it on receipt.
//
//	ucmatose [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-p port]
//	ucmatose -s server_address [-b bind_address] [-c connections] [-C message_count] ...
//
// Flags as cmatose's, getopt-style: -s server address (be the client), -b bind address
// (this side's device), -c connections (1), -C messages each way per connection (10),
// -S message size (100; 0: no messages), -p port (7471), -a ACK timeout (the QP's local
// ACK timeout code), -m (migrate to a new event channel: accepted, nothing to move), -f
// address format (ip, ipv6 or name; gid refused), -P port space (tcp; ib refused), -t
// type of service (0 only: softrnic's packets carry TOS 0). softrnic's additions:
// --dev-addr ADDR (this side's device; default -b, or a client's route's source
// address), --udp-port (this device's RoCEv2 UDP port and the peer's, 4791), -V
// (validate, above), --json (one JSON object for the run on stdout: connections,
// messages, the device's and connection manager's counters; cmatose's lines then go to
// stderr), --stats (the counters as text), --pcap FILE, --timeout.
//
// The exit status is 0 when every connection came up and every message arrived, 1
// otherwise.
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
	"strconv"
	"strings"
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
		fmt.Fprintln(stderr, "ucmatose:", err)
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
	if o.json {
		out.out = stderr // stdout has only the JSON
	}
	r, err := run(ctx, cfg, out)
	if r != nil {
		if o.json {
			_ = json.NewEncoder(stdout).Encode(r)
		} else if o.stats {
			fmt.Fprintf(stdout, "%s %s: %d/%d connections, sent %d received %d (flushed %d), disconnected %d\n",
				r.Role, r.Local, r.Established, r.Connections, r.Sent, r.Received, r.Flushed, r.Disconnected)
			fmt.Fprint(stdout, r.Counters.Lines("  "))
		}
	}
	if err != nil {
		if r == nil {
			fmt.Fprintln(stderr, "ucmatose:", err)
		}
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: ucmatose (softrnic's, over its verbs and connection manager)
	[-s server_address]
	[-b bind_address]
	[-f address_format]
	    name, ip, ipv6 (gid: refused)
	[-P port_space]
	    tcp (ib: refused)
	[-c connections]
	[-C message_count]
	[-S message_size]
	[-t type_of_service]	(0 only)
	[-p port_number]
	[-m(igrate)]		(accepted; nothing to migrate)
	[-a ack_timeout]
softrnic:
	[-V]			fill each message with a pattern and check it (both sides softrnic)
	[--dev-addr addr]	this side's device address (default: -b; a client: the route's source)
	[--udp-port port]	this device's RoCEv2 UDP port, and the peer's (default 4791)
	[--json]		one JSON object for the run on stdout (cmatose's lines to stderr)
	[--stats]		the device's and connection manager's counters after the run
	[--pcap file]		write the device's packets to file (pcap)
	[--timeout d]		give up after this long (e.g. 60s; default: never)
`)
}

func parseArgs(args []string, stderr io.Writer) (*Config, *options, error) {
	cfg := &Config{}
	o := &options{}
	fs := flag.NewFlagSet("ucmatose", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(fs.Output()) }
	var server, bind, devAddr, format, space string
	var tos int
	fs.StringVar(&server, "s", "", "server address")
	fs.StringVar(&bind, "b", "", "bind address")
	fs.StringVar(&format, "f", "", "address format")
	fs.StringVar(&space, "P", "tcp", "port space")
	fs.IntVar(&cfg.Connections, "c", defaultConnections, "connections")
	fs.IntVar(&cfg.Count, "C", defaultCount, "message count")
	fs.IntVar(&cfg.Size, "S", defaultSize, "message size")
	fs.IntVar(&tos, "t", 0, "type of service")
	fs.IntVar(&cfg.Port, "p", defaultPort, "port number")
	fs.BoolVar(&cfg.Migrate, "m", false, "migrate")
	fs.Func("a", "ack timeout", func(s string) error {
		v, err := strconv.ParseUint(s, 0, 8) // strtoul(optarg, NULL, 0)
		if err != nil || v > 31 {
			return fmt.Errorf("%q: the ACK timeout is a 5-bit code (0..31)", s)
		}
		cfg.AckTimeout, cfg.SetAckTimeout = int(v), true
		return nil
	})
	fs.BoolVar(&cfg.Validate, "V", false, "validate (softrnic)")
	fs.StringVar(&devAddr, "dev-addr", "", "this side's device address")
	fs.IntVar(&cfg.UDPPort, "udp-port", verbs.DefaultPort, "this device's RoCEv2 UDP port and the peer's")
	fs.BoolVar(&o.json, "json", false, "one JSON object for the run")
	fs.BoolVar(&o.stats, "stats", false, "print the counters after the run")
	fs.StringVar(&cfg.Pcap, "pcap", "", "write the device's packets to this pcap file")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long")
	if err := fs.Parse(cmtool.ExpandArgs(fs, args)); err != nil {
		return nil, nil, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return nil, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	f := strings.ToLower(format)
	switch {
	case f == "", strings.HasPrefix(f, "ip"), strings.HasPrefix(f, "name"):
	case strings.HasPrefix(f, "gid"):
		return nil, nil, errors.New("-f gid: softrnic's connection manager speaks rdma_cm's IP addressing only (no AF_IB)")
	default:
		fmt.Fprintln(stderr, "Warning: unknown address format")
	}
	switch s := strings.ToLower(space); {
	case strings.HasPrefix(s, "tcp"):
	case strings.HasPrefix(s, "ib"):
		return nil, nil, errors.New("-P ib: softrnic's connection manager has rdma_cm's TCP port space only")
	default:
		fmt.Fprintln(stderr, "Warning: unknown port space format")
	}
	if tos != 0 {
		return nil, nil, fmt.Errorf("-t %d: softrnic's packets carry type of service 0", tos)
	}
	for _, a := range []struct {
		flag string
		s    string
		dst  *netip.Addr
	}{{"-s", server, &cfg.ServerAddr}, {"-b", bind, &cfg.Bind}, {"--dev-addr", devAddr, &cfg.DevAddr}} {
		if a.s == "" {
			continue
		}
		ip, err := cmtool.ResolveAddr(a.s)
		if err != nil {
			return nil, nil, fmt.Errorf("%s %s: %w", a.flag, a.s, err)
		}
		*a.dst = ip
	}
	return cfg, o, nil
}
