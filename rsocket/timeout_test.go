package rsocket

import (
	"context"
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
	devS := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	devC := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	l, err := Listen(devS, 7471)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.WaitLimit)
	defer cancel()
	d := Dialer{DevicePort: devS.Addr().Port()}
	c, err := d.Dial(ctx, devC, netip.AddrPortFrom(verbstest.IPB, 7471))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.AcceptRsocket()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
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
	devS := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	devC := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	lc := ListenConfig{Options: Options{ACKTimeout: 10 * time.Millisecond}}
	l, err := lc.Listen(devS, 7471)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d := Dialer{Options: Options{ACKTimeout: 60 * time.Millisecond}, DevicePort: devS.Addr().Port()}
	c, err := d.Dial(testutil.Context(t), devC, netip.AddrPortFrom(verbstest.IPB, 7471))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.AcceptRsocket()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if a, _ := c.qp.QueryQP(); a.Timeout != 14 {
		t.Errorf("dialler's QP: local ACK timeout %d, want 14", a.Timeout)
	}
	if a, _ := s.qp.QueryQP(); a.Timeout != 12 {
		t.Errorf("listener's QP: local ACK timeout %d, want 12", a.Timeout)
	}
}
