package perf

import (
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/verbs"
)

// raceSkips reports whether the race run leaves test out: write_lat polls memory a
// peer's RDMA WRITE lands in, as perftest does, and write_bw's and atomic_bw's --check
// read what the peer's operations left; the ordering comes through the network, which
// the race detector cannot see. (The runs without it test them; the engine's own race
// run covers what they exercise.)
func raceSkips(test string) bool {
	return testutil.Race && (strings.HasPrefix(test, "write_") || test == "atomic_bw")
}

// TestLoopbackAll runs every test with a few iterations, checking every byte; the
// bandwidth tests also with two client goroutines (Config.Threads).
func TestLoopbackAll(t *testing.T) {
	for _, test := range Tests {
		if raceSkips(test) {
			continue
		}
		cfgs := []Config{
			{Test: test, Iters: 200, Check: true},
			{Test: test, Iters: 100, Check: true, Size: 5000, MTU: 1024},
		}
		if strings.HasSuffix(test, "_bw") {
			// Two client goroutines over three QPs (-t 2), an iteration count that does
			// not divide evenly.
			cfgs = append(cfgs, Config{Test: test, Iters: 101, Check: true, QPs: 3, Threads: 2})
			// Sleeping on completion channels (-e), one per thread's CQ.
			cfgs = append(cfgs, Config{Test: test, Iters: 150, Check: true, QPs: 2, Threads: 2, Events: true, TxDepth: 8})
		}
		for _, c := range cfgs {
			if strings.HasSuffix(test, "_bw") && c.QPs == 0 {
				c.QPs = 2
			}
			r, err := RunLoopback(c, DefaultAddrs, true)
			if err != nil {
				t.Fatalf("%s size %d: %v", test, c.Size, err)
			}
			if r.Iters != c.Iters || r.Seconds <= 0 || !r.Checked || r.Counters == nil || r.Counters.Client.TxPackets == 0 {
				t.Fatalf("%s: result %+v", test, r)
			}
			if _, _, ok := ProcessCPU(); ok && (r.CPUSeconds <= 0 || r.CPUPerGiB <= 0 || r.CPUPerPacket <= 0) {
				t.Fatalf("%s: no CPU figures in %+v", test, r)
			}
			if strings.HasSuffix(test, "_lat") && (r.Lat == nil || r.Lat.Min > r.Lat.P50 || r.Lat.P50 > r.Lat.Max) {
				t.Fatalf("%s: latency %+v", test, r.Lat)
			}
		}
	}
}

// server is what ServeOnce is given in a client/server test (the test is the client's).
type server struct {
	test     string
	devAddr  netip.Addr // invalid: the control connection's address
	ordering verbs.Ordering
	cm       bool
	rocePort int // with cm: the device's UDP port, opened before any client (0: 4791)
}

type outcome struct {
	r   Result
	err error
}

// clientServer runs ServeOnce in a goroutine and RunClient against it, as two processes
// would, and returns both outcomes.
func clientServer(srv server, c Config, clientDev netip.Addr, stats bool) (client, serv outcome) {
	if srv.test == "" {
		srv.test = c.Test
	}
	addrc := make(chan net.Addr, 1)
	sc := make(chan outcome, 1)
	go func() {
		r, err := ServeOnce(Config{Test: srv.test, Ordering: srv.ordering, CM: srv.cm, RoCEPort: srv.rocePort}, "127.0.0.1:0", srv.devAddr, stats, func(a net.Addr) { addrc <- a })
		sc <- outcome{r, err}
	}()
	r, err := RunClient(c, (<-addrc).String(), clientDev, stats)
	return outcome{r, err}, <-sc
}

// TestClientServer runs a test through the TCP control connection, as two processes would.
func TestClientServer(t *testing.T) {
	for _, test := range []string{"write_bw", "send_bw", "send_lat", "read_lat"} {
		if raceSkips(test) {
			continue
		}
		cl, s := clientServer(server{}, Config{Test: test, Iters: 300, Check: true}, netip.Addr{}, true)
		if cl.err != nil {
			t.Fatalf("%s client: %v", test, cl.err)
		}
		if s.err != nil {
			t.Fatalf("%s server: %v", test, s.err)
		}
		r := cl.r
		if r.Iters != 300 || s.r.Test != test || r.Counters == nil || r.Counters.Server.RxPackets == 0 || r.CM {
			t.Fatalf("%s: client %+v server %+v", test, r, s.r)
		}
	}
	// A mismatched test is refused with a clear error on both sides.
	cl, s := clientServer(server{test: "read_bw"}, Config{Test: "write_bw", Iters: 10}, netip.Addr{}, false)
	if cl.err == nil || !strings.Contains(cl.err.Error(), "read_bw") {
		t.Fatalf("mismatched test: %v", cl.err)
	}
	if s.err == nil {
		t.Fatal("server accepted a mismatched test")
	}
}

// TestLoopbackCM runs every test with the QPs connected through the connection manager:
// receives posted before the handshake, the ordering the CM negotiated in the result,
// disconnected afterwards (an error otherwise).
func TestLoopbackCM(t *testing.T) {
	for _, test := range Tests {
		for _, ord := range []verbs.Ordering{verbs.OrderingOrdered, verbs.OrderingWeak} {
			if raceSkips(test) {
				continue
			}
			c := Config{Test: test, Iters: 200, Check: true, CM: true, Ordering: ord}
			if isBW(test) {
				c.QPs, c.Size = 3, 8192 // small buffers: this is about the connections
			}
			if ord == verbs.OrderingWeak {
				c.Size, c.MTU = 5000, 1024 // several packets a message: weak placement
				if test == "write_lat" {
					c.Size = 1024 // polls the last byte: one packet (Validate)
				}
			}
			r, err := RunLoopback(c, DefaultAddrs, true)
			if err != nil {
				t.Fatalf("%s %v: %v", test, ord, err)
			}
			if r.Iters != c.Iters || !r.Checked || !r.CM || r.Ordering != ord.String() || r.Counters == nil || r.Counters.Server.RxPackets == 0 {
				t.Fatalf("%s %v: result %+v", test, ord, r)
			}
			if isBW(test) != (r.Lat == nil) {
				t.Fatalf("%s %v: latency %+v", test, ord, r.Lat)
			}
		}
	}
}

// TestCMConnections looks at the connections themselves: QP i of one side is connected to
// QP i of the other (the request names it), both in RTS with the negotiated ordering, and after the dialing side's Disconnect every connection has ended on both
// sides (the DisconnectReply came only after the peer's QP went to ERR).
func TestCMConnections(t *testing.T) {
	c := Config{Test: "send_bw", QPs: 4, Size: 4096, Iters: 10, CM: true, Ordering: verbs.OrderingWeak}
	c.Defaults()
	cs, err := newSide(&c, nil, DefaultAddrs[0], verbs.AnyPort, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.close()
	sc := c
	sc.Ordering = verbs.OrderingOrdered // the server does not offer weak mode
	ss, err := newSide(&sc, nil, DefaultAddrs[1], verbs.AnyPort, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.close()
	if len(cs.info().Endpoints) != 0 {
		t.Fatal("with CM, Info carries endpoints")
	}
	for _, s := range []*side{cs, ss} {
		if err := s.initQPs(); err != nil {
			t.Fatal(err)
		}
	}
	if err := prepare(ss); err != nil {
		t.Fatal(err)
	}
	if err := connectCM(cs, ss); err != nil {
		t.Fatal(err)
	}
	for i := range cs.qps {
		a, b := cs.conns[i], ss.conns[i]
		if a.QP() != cs.qps[i] || b.QP() != ss.qps[i] || a.RemoteQPN() != ss.qps[i].QPNum() || b.RemoteQPN() != cs.qps[i].QPNum() {
			t.Fatalf("QP %d: client %#x to %#x, server %#x to %#x", i, cs.qps[i].QPNum(), a.RemoteQPN(), ss.qps[i].QPNum(), b.RemoteQPN())
		}
		// The server does not offer weak mode: ordered, on both QPs and in both CMs' word.
		for _, cn := range []*cm.Conn{a, b} {
			qp := cn.QP()
			attr, _ := qp.QueryQP()
			if qp.State() != verbs.StateRTS || attr.Ordering != verbs.OrderingOrdered || cn.Ordering() != verbs.OrderingOrdered {
				t.Fatalf("QP %#x: %v, %v, the CM says %v", qp.QPNum(), qp.State(), attr.Ordering, cn.Ordering())
			}
		}
	}
	if cs.ordering() != "ordered" || ss.ordering() != "ordered" {
		t.Fatalf("ordering %q, %q", cs.ordering(), ss.ordering())
	}
	conns := ss.conns
	if err := cs.disconnect(); err != nil {
		t.Fatal(err)
	}
	for i, cn := range conns {
		select {
		case <-cn.Done():
		default:
			t.Fatalf("server QP %d: connection still up after the client's Disconnect returned", i)
		}
		if !errors.Is(cn.Err(), cm.ErrDisconnected) || ss.qps[i].State() != verbs.StateErr || cs.qps[i].State() != verbs.StateErr {
			t.Fatalf("QP %d: %v, server QP %v, client QP %v", i, cn.Err(), ss.qps[i].State(), cs.qps[i].State())
		}
	}
	if err := ss.disconnect(); err != nil {
		t.Fatalf("server's Disconnect after the peer's: %v", err)
	}
}

// TestClientServerCM runs tests through the control connection with the QPs connected
// through the connection manager, the devices on two addresses as two hosts' would be.
func TestClientServerCM(t *testing.T) {
	for _, tc := range []struct {
		test      string
		srv, cli  verbs.Ordering
		qps       int
		want      verbs.Ordering
		srvDevice netip.Addr
	}{
		{"write_bw", verbs.OrderingOrdered, verbs.OrderingOrdered, 2, verbs.OrderingOrdered, DefaultAddrs[1]},
		{"send_bw", verbs.OrderingWeak, verbs.OrderingWeak, 3, verbs.OrderingWeak, DefaultAddrs[1]},
		{"send_lat", verbs.OrderingOrdered, verbs.OrderingWeak, 1, verbs.OrderingOrdered, netip.Addr{}},
		{"read_lat", verbs.OrderingWeak, verbs.OrderingWeak, 1, verbs.OrderingWeak, DefaultAddrs[1]},
	} {
		if raceSkips(tc.test) {
			continue
		}
		c := Config{Test: tc.test, Iters: 300, Check: true, QPs: tc.qps, Ordering: tc.cli, CM: true}
		if isBW(tc.test) {
			c.Size = 8192
		}
		// The server's device opens (and listens) before the client comes, on a free port
		// here (4791 by default).
		cl, s := clientServer(server{devAddr: tc.srvDevice, ordering: tc.srv, cm: true, rocePort: freeRoCEPort(t)}, c, DefaultAddrs[0], true)
		if cl.err != nil || s.err != nil {
			t.Fatalf("%s: client %v, server %v", tc.test, cl.err, s.err)
		}
		r := cl.r
		if r.Iters != 300 || !r.Checked || !r.CM || r.Ordering != tc.want.String() || r.Counters == nil || r.Counters.Server.RxPackets == 0 {
			t.Fatalf("%s: client %+v", tc.test, r)
		}
		if s.r.Test != tc.test || !s.r.CM || s.r.Ordering != r.Ordering {
			t.Fatalf("%s: server %+v", tc.test, s.r)
		}
		// --json: the same fields as without --cm, and "cm": true.
		r.Counters = nil
		b, _ := json.Marshal(r)
		if !strings.Contains(string(b), `"cm":true`) || !strings.Contains(string(b), `"ordering":"`+tc.want.String()+`"`) {
			t.Fatalf("%s: JSON %s", tc.test, b)
		}
	}
	// Without --cm a result's JSON has no "cm" field (the format is unchanged).
	b, _ := json.Marshal(Result{Test: "write_bw", Ordering: "ordered"})
	if strings.Contains(string(b), `"cm"`) {
		t.Fatalf("JSON without --cm: %s", b)
	}
	// Both sides must agree on --cm: either disagreement is refused, clearly, on both.
	for _, srvCM := range []bool{true, false} {
		cl, s := clientServer(server{cm: srvCM, rocePort: freeRoCEPort(t)}, Config{Test: "send_bw", Iters: 10, CM: !srvCM}, netip.Addr{}, false)
		if cl.err == nil || s.err == nil || !strings.Contains(cl.err.Error(), "--cm") || !strings.Contains(s.err.Error(), "--cm") {
			t.Fatalf("server --cm=%v, client --cm=%v: client %v, server %v", srvCM, !srvCM, cl.err, s.err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{Test: "nope"}, {Test: "write_bw", MTU: 3000}, {Test: "send_lat", QPs: 2},
		{Test: "write_bw", Size: -1}, {Test: "write_bw", TxDepth: 100000}, {Test: "send_lat", Events: true},
	}
	for _, c := range bad {
		c2 := c
		c2.Defaults()
		if c.Size != 0 {
			c2.Size = c.Size
		}
		if c.MTU != 0 {
			c2.MTU = c.MTU
		}
		if c2.Validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
