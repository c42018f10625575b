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
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/softrnic/softrnic/internal/cmtool"
)

func main() {
	os.Exit(mainArgs(os.Args[1:], os.Stdout, os.Stderr))
}

// mainArgs is the command: arguments in, exit status out.
func mainArgs(args []string, stdout, stderr io.Writer) int {
	cfg, o, err := parseArgs(args, stderr)
	if err != nil {
		return cmtool.ParseStatus("ucmatose", err, stderr)
	}
	ctx, stop := cmtool.RunContext(o.Timeout)
	defer stop()
	r, err := run(ctx, cfg, &output{Out: o.Info(stdout, stderr), Log: stderr})
	if r != nil {
		cmtool.Reporter(o, stdout, func(w io.Writer, r *Result) {
			fmt.Fprintf(w, "%s %s: %d/%d connections, sent %d received %d (flushed %d), disconnected %d\n",
				r.Role, r.Local, r.Established, r.Connections, r.Sent, r.Received, r.Flushed, r.Disconnected)
			fmt.Fprint(w, r.Counters.Lines("  "))
		})(r)
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

func parseArgs(args []string, stderr io.Writer) (*Config, *cmtool.Options, error) {
	cfg := &Config{}
	fs, o := cmtool.NewFlagSet("ucmatose", stderr, usage, &cfg.Local)
	var server, bind, format, space string
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
	if err := cmtool.Parse(fs, args); err != nil {
		return nil, nil, err
	}
	if err := cmtool.AddrFormat(format, stderr, "-f gid: softrnic's connection manager speaks rdma_cm's IP addressing only (no AF_IB)"); err != nil {
		return nil, nil, err
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
	if err := o.ResolveAddrs(cmtool.AddrFlag{Flag: "-s", Value: server, Dst: &cfg.ServerAddr},
		cmtool.AddrFlag{Flag: "-b", Value: bind, Dst: &cfg.Bind}); err != nil {
		return nil, nil, err
	}
	return cfg, o, nil
}
