// Command udaddy is softrnic's counterpart of librdmacm's udaddy (rdma-core,
// librdmacm/examples/udaddy.c): unreliable-datagram "connections" resolved through the
// connection manager in rdma_cm's UDP port space (package cm: service ID resolution,
// SIDR, port 7174), and udaddy's exchange of datagrams over them, message for message as
// the C tool, so that either side may be the C tool on a RoCE device (Linux rxe, a NIC):
//
//	client                                      server
//	SIDR_REQ (service 0x01110000|7174)    ->    answer with a UD QP, receives posted
//	                                      <-    SIDR_REP {QPN, Q_Key 0x01234567}
//	-C SENDs with immediate (client QPN)  ->    receive -C; reply address from the first
//	                                            datagram's GRH, QPN from its immediate
//	                                      <-    -C SENDs with immediate (server QPN)
//
// Each of -c connections has its own UD QP on each side. Messages are -S bytes (at most
// the device's active MTU, as udaddy checks); the server's replies carry, as udaddy's,
// the start of its receive buffer (the GRH area, then the message). The client prints
// "data transfers complete" once every reply came, the server once every reply was sent;
// the server prints "udaddy: starting server" once it listens (a script may start the
// client then).
//
//	udaddy [-b bind_address] [-c connections] [-C message_count] [-S message_size]     server
//	udaddy -s server_address [-b bind_address] [-c ...] [-C ...] [-S ...]              client
//
// Flags as udaddy's, getopt-style (-C10 works): -s the server's address (makes this a
// client), -b the address to bind (a server's device; a client's source), -c connections
// (1), -C message count (10), -S message size (100), -t type of service (accepted:
// softrnic sends TOS 0), -f address format (ip, ipv6, name; gid is refused: there is no
// AF_IB), -P port space (udp; ipoib refused), -p port space by number (udaddy's
// backwards-compatible form: 0x111 only). udaddy has no option for the rdma_cm port, which
// is 7174; softrnic's additions: --port (the rdma_cm port), --dev-addr ADDR (this
// side's device: one IP address; default -b, or for a client the route's source address
// toward -s), --udp-port (this device's RoCEv2 UDP port and the peer's, default 4791),
// --json (one JSON object per connection on stdout: QPs, Q_Key, datagrams sent and
// received, the device's, connection manager's and QP's counters; udaddy's lines then go
// to stderr), --stats (the counters as text), --pcap FILE (the device's packets),
// --timeout (give up after this long).
//
// The exit status is 0 when every connection was resolved and every datagram came, of
// the right size and from the peer's QP, 1 otherwise.
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
		return cmtool.ParseStatus("udaddy", err, stderr)
	}
	ctx, stop := cmtool.RunContext(o.Timeout)
	defer stop()
	out := &output{Out: o.Info(stdout, stderr), Log: stderr, Emit: cmtool.Reporter(o, stdout, func(w io.Writer, r *Result) {
		fmt.Fprintf(w, "%s %d %s -> %s: QPN %#x -> %#x (Q_Key %#x), %d sent, %d received, %d bad\n",
			r.Role, r.Index, r.Local, r.Peer, r.QPN, r.PeerQPN, r.PeerQKey, r.Sent, r.Received, r.Bad)
		fmt.Fprint(w, r.Counters.Lines("  "))
		fmt.Fprintf(w, "  sidr:   %s\n", cmtool.NonZero(r.SIDR))
		fmt.Fprintf(w, "  qp:     %s\n", cmtool.NonZero(r.QP))
	})}
	if err := run(ctx, cfg, out); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprint(w, `softrnic's udaddy (librdmacm's udaddy over softrnic's verbs and connection manager)
usage: udaddy
	[-s server_address]
	[-b bind_address]
	[-f address_format]
	    name, ip, ipv6 (gid: refused, softrnic has no AF_IB)
	[-P port_space]
	    udp (ipoib: refused)
	[-c connections]
	[-C message_count]
	[-S message_size]
	[-t type_of_service]	(accepted: softrnic sends TOS 0)
	[-p port_space - 0x111 for UDP (default); 0x2 (IPOIB) refused]
softrnic:
	--port port	the rdma_cm port (udaddy's fixed 7174)
	--dev-addr addr	this side's device address (default: -b; for a client without -b,
			the source address of the route to -s)
	--udp-port port	this device's RoCEv2 UDP port, and the peer's (default 4791)
	--json		one JSON object per connection on stdout (udaddy's lines to stderr)
	--stats		the device's, connection manager's and QP's counters per connection
	--pcap file	write the device's packets to file (pcap)
	--timeout d	give up after this long (e.g. 30s; default: never)
`)
}

// portSpaceUDP is RDMA_PS_UDP, udaddy's port space.
const portSpaceUDP = 0x0111

func parseArgs(args []string, stderr io.Writer) (*Config, *cmtool.Options, error) {
	cfg := &Config{}
	fs, o := cmtool.NewFlagSet("udaddy", stderr, usage, &cfg.Local)
	var server, bind, format, psName, psNum string
	var tos int
	fs.StringVar(&server, "s", "", "server address")
	fs.StringVar(&bind, "b", "", "bind address")
	fs.IntVar(&cfg.Connections, "c", defaultConnections, "connections")
	fs.IntVar(&cfg.Count, "C", defaultCount, "message count")
	fs.IntVar(&cfg.Size, "S", defaultSize, "message size")
	fs.IntVar(&tos, "t", 0, "type of service (accepted)")
	fs.StringVar(&format, "f", "", "address format: name, ip, ipv6")
	fs.StringVar(&psName, "P", "", "port space: udp")
	fs.StringVar(&psNum, "p", "", "port space by number: 0x111")
	fs.IntVar(&cfg.Port, "port", defaultPort, "the rdma_cm port")
	if err := cmtool.Parse(fs, args); err != nil {
		return nil, nil, err
	}
	if err := cmtool.AddrFormat(format, stderr, "-f gid: softrnic has no AF_IB addresses (use ip or name)"); err != nil {
		return nil, nil, err
	}
	switch p := strings.ToLower(psName); {
	case p == "" || strings.HasPrefix(p, "udp"):
	case strings.HasPrefix(p, "ipoib"):
		return nil, nil, errors.New("-P ipoib: softrnic serves the UDP port space only")
	default:
		fmt.Fprintln(stderr, "Warning: unknown port space format")
	}
	if psNum != "" {
		if v, err := strconv.ParseInt(psNum, 0, 32); err != nil || v != portSpaceUDP {
			return nil, nil, fmt.Errorf("-p %s: softrnic serves the UDP port space only (%#x)", psNum, portSpaceUDP)
		}
	}
	cfg.Server = server == ""
	if err := o.ResolveAddrs(cmtool.AddrFlag{Flag: "-s", Value: server, Dst: &cfg.Addr},
		cmtool.AddrFlag{Flag: "-b", Value: bind, Dst: &cfg.Bind}); err != nil {
		return nil, nil, err
	}
	return cfg, o, nil
}
