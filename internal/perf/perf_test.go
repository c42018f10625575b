package perf

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

// TestLoopbackAll runs every test with a few iterations, checking every byte.
func TestLoopbackAll(t *testing.T) {
	for _, test := range Tests {
		for _, c := range []Config{
			{Test: test, Iters: 200, Check: true},
			{Test: test, Iters: 100, Check: true, Size: 5000, MTU: 1024},
		} {
			if strings.HasSuffix(test, "_bw") {
				c.QPs = 2
			}
			r, err := RunLoopback(c, DefaultAddrs, true)
			if err != nil {
				t.Fatalf("%s size %d: %v", test, c.Size, err)
			}
			if r.Iters != c.Iters || r.Seconds <= 0 || !r.Checked || r.Counters == nil || r.Counters.Client.TxPackets == 0 {
				t.Fatalf("%s: result %+v", test, r)
			}
			if strings.HasSuffix(test, "_lat") && (r.Lat == nil || r.Lat.Min > r.Lat.P50 || r.Lat.P50 > r.Lat.Max) {
				t.Fatalf("%s: latency %+v", test, r.Lat)
			}
		}
	}
}

// TestClientServer runs a test through the TCP control connection, as two processes would.
func TestClientServer(t *testing.T) {
	for _, test := range []string{"write_bw", "send_bw", "send_lat", "read_lat"} {
		addrc := make(chan net.Addr, 1)
		type out struct {
			r   Result
			err error
		}
		srv := make(chan out, 1)
		go func() {
			r, err := ServeOnce(test, "127.0.0.1:0", netip.Addr{}, nil, 0, true, func(a net.Addr) { addrc <- a })
			srv <- out{r, err}
		}()
		addr := <-addrc
		r, err := RunClient(Config{Test: test, Iters: 300, Check: true}, addr.String(), netip.Addr{}, true)
		if err != nil {
			t.Fatalf("%s client: %v", test, err)
		}
		s := <-srv
		if s.err != nil {
			t.Fatalf("%s server: %v", test, s.err)
		}
		if r.Iters != 300 || s.r.Test != test || r.Counters == nil || r.Counters.Server.RxPackets == 0 {
			t.Fatalf("%s: client %+v server %+v", test, r, s.r)
		}
	}
	// A mismatched test is refused with a clear error on both sides.
	addrc := make(chan net.Addr, 1)
	srvErr := make(chan error, 1)
	go func() {
		_, err := ServeOnce("read_bw", "127.0.0.1:0", netip.Addr{}, nil, 0, false, func(a net.Addr) { addrc <- a })
		srvErr <- err
	}()
	_, err := RunClient(Config{Test: "write_bw", Iters: 10}, (<-addrc).String(), netip.Addr{}, false)
	if err == nil || !strings.Contains(err.Error(), "read_bw") {
		t.Fatalf("mismatched test: %v", err)
	}
	if <-srvErr == nil {
		t.Fatal("server accepted a mismatched test")
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{Test: "nope"}, {Test: "write_bw", MTU: 3000}, {Test: "send_lat", QPs: 2},
		{Test: "write_bw", Size: -1}, {Test: "write_bw", TxDepth: 100000},
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
