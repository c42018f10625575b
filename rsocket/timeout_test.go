package rsocket

import (
	"context"
	"net/netip"
	"testing"

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
