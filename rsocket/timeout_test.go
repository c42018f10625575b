package rsocket

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// A dialled connection's QPs, on both sides, retransmit after the local ACK timeout
// librdmacm's rconnect gets from rdma_cm, not verbs' default.
func TestDialACKTimeout(t *testing.T) {
	c, s := connectedPair(t, Options{}, Options{})
	for side, conn := range map[string]*Conn{"dialler": c, "listener": s} {
		if a, _ := conn.qp.QueryQP(); a.Timeout != 19 {
			t.Errorf("%s's QP: local ACK timeout %d, want 19 (2.1 s)", side, a.Timeout)
		}
	}
}

// Options.ACKTimeout sets the dialler's request, and a listener's own when it has one.
func TestACKTimeoutOption(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		code uint8
	}{{time.Nanosecond, 1}, {67 * time.Millisecond, 14}, {68 * time.Millisecond, 15}, {2 * time.Second, 19}, {time.Hour, 30}, {100 * time.Hour, 31}} {
		if got := ackCode(tc.d); got != tc.code {
			t.Errorf("ackCode(%v) = %d, want %d", tc.d, got, tc.code)
		}
	}
	c, s := connectedPair(t, Options{ACKTimeout: 10 * time.Millisecond}, Options{ACKTimeout: 60 * time.Millisecond})
	if a, _ := c.qp.QueryQP(); a.Timeout != 14 {
		t.Errorf("dialler's QP: local ACK timeout %d, want 14", a.Timeout)
	}
	if a, _ := s.qp.QueryQP(); a.Timeout != 12 {
		t.Errorf("listener's QP: local ACK timeout %d, want 12", a.Timeout)
	}
}

// connectedPair connects a dialler with options do to a listener with options lo, on two
// devices, and returns the dialled and the accepted connection, closed when t ends.
func connectedPair(t *testing.T, lo, do Options) (c, s *Conn) {
	t.Helper()
	devS := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	devC := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	l, err := (&ListenConfig{Options: lo}).Listen(devS, 7471)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	d := Dialer{Options: do, DevicePort: devS.Addr().Port()}
	if c, err = d.Dial(testutil.Context(t), devC, netip.AddrPortFrom(verbstest.IPB, 7471)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if s, err = l.AcceptRsocket(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return c, s
}
