package rsocket_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// TestConn runs golang.org/x/net/nettest's conformance suite for net.Conn: basic I/O,
// ping-pong, racy reads and writes, read and write deadlines in the past, present and
// future, Close waking blocked calls, concurrent methods; in both ordering modes, with
// waiting calls that poll first (the default) and calls that sleep at once.
func TestConn(t *testing.T) {
	for _, m := range []struct {
		ord  verbs.Ordering
		poll time.Duration
	}{
		{verbs.OrderingOrdered, 0}, {verbs.OrderingWeak, 0}, {verbs.OrderingOrdered, -1},
	} {
		name := m.ord.String()
		if m.poll < 0 {
			name += "/sleeping"
		}
		ord := m.ord
		t.Run(name, func(t *testing.T) {
			devS := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
			devC := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
			o := rsocket.Options{Ordering: ord, RecvBuffer: 64 << 10, SendBuffer: 64 << 10, BusyPoll: m.poll}
			lc := rsocket.ListenConfig{Options: o}
			l, err := lc.Listen(devS, 7471)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			d := rsocket.Dialer{Options: o, DevicePort: devS.Addr().Port()}
			nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
				ctx, cancel := context.WithTimeout(context.Background(), testutil.WaitLimit)
				defer cancel()
				c, err := d.Dial(ctx, devC, netip.AddrPortFrom(verbstest.IPB, 7471))
				if err != nil {
					return nil, nil, nil, err
				}
				s, err := l.Accept()
				if err != nil {
					c.Close()
					return nil, nil, nil, err
				}
				if c.Ordering() != ord {
					t.Errorf("ordering %v, want %v", c.Ordering(), ord)
				}
				return c, s, func() { c.Close(); s.Close() }, nil
			})
		})
	}
}
