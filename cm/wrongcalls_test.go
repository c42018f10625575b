package cm

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// TestInitQPAccessKept checks that the remote access InitQP gives a QP is what it keeps
// through Dial and Accept with default options: a QP initialised with no remote access
// refuses the peer's RDMA READ (remote access error at the reader), one initialised with
// READ only serves the READ; and that options naming the rights replace InitQP's.
func TestInitQPAccessKept(t *testing.T) {
	cases := []struct {
		name    string
		access  verbs.AccessFlags // InitQP's, on both sides
		options verbs.ConnectOptions
		status  verbs.WCStatus // of a READ from the dialer's QP into the listener's memory
	}{
		{"InitQP 0, default options", 0, verbs.ConnectOptions{}, verbs.WCRemAccessErr},
		{"InitQP READ, default options", verbs.AccessRemoteRead, verbs.ConnectOptions{}, verbs.WCSuccess},
		{"InitQP 0, Access READ", 0, verbs.ConnectOptions{Access: verbs.AccessRemoteRead}, verbs.WCSuccess},
		{"InitQP READ, NoRemoteAccess", verbs.AccessRemoteRead, verbs.ConnectOptions{NoRemoteAccess: true}, verbs.WCRemAccessErr},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			da, db := devs(t, verbs.DeviceConfig{})
			a, b := newEndpoint(t, da, 0), newEndpoint(t, db, 0)
			for _, e := range []*endpoint{a, b} {
				if err := InitQP(e.QP, c.access); err != nil {
					t.Fatal(err)
				}
			}
			dp := fast(nil)
			dp.Options = c.options
			handshake(t, a, b, dp, &AcceptParams{Options: c.options})
			want := c.access // InitQP's, unless the options name rights or none
			switch {
			case c.options.NoRemoteAccess:
				want = 0
			case c.options.Access != 0:
				want = c.options.Access
			}
			for _, e := range []*endpoint{a, b} {
				if got, _ := e.QP.QueryQP(); got.QPAccessFlags != want {
					t.Errorf("QP %#x's remote access %v, want %v", e.QP.QPNum(), got.QPAccessFlags, want)
				}
			}
			copy(b.buf[:64], testutil.Pattern(64, 3))
			verbstest.MustPostSend(t, a.QP, verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled,
				SGList: verbstest.SGL(a.mr, 0, 64), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
			wc := verbstest.PollOne(t, a.SCQ)
			if wc.Status != c.status {
				t.Fatalf("READ from the listener's memory: %v, want %v", wc.Status, c.status)
			}
			if c.status == verbs.WCSuccess {
				verbstest.CheckBytes(t, "read", a.buf[:64], b.buf[:64])
			}
		})
	}
}

// TestWrongCalls checks the errors of the calls a user makes wrongly: each names the
// call ("cm: Dial: ...") and wraps what errors.Is tests: cm.ErrClosed, and
// verbs.ErrClosed too, after the device was closed; ErrClosed after a listener's Close;
// ErrPrivateData, verbs.ErrInvalid and the context's error.
func TestWrongCalls(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	a := newEndpoint(t, da, 0)
	dp := fast(nil)
	to := remote(db, dp)
	type call struct {
		op      string
		fn      func() error
		targets []error
	}
	check := func(when string, calls []call) {
		t.Helper()
		for _, c := range calls {
			err := c.fn()
			if err == nil {
				t.Errorf("%s %s: no error", c.op, when)
				continue
			}
			for _, target := range c.targets {
				if !errors.Is(err, target) {
					t.Errorf("%s %s: %v does not wrap %q", c.op, when, err, target)
				}
			}
			if want := "cm: " + c.op + ": "; !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "cm: cm:") || strings.Count(err.Error(), c.op+":") > 1 {
				t.Errorf("%s %s: %q does not start with %q once", c.op, when, err, want)
			}
		}
	}
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	check("with wrong arguments", []call{
		{"Dial", func() error {
			_, err := Dial(testutil.Context(t), da, to, a.QP, &DialParams{PrivateData: make([]byte, mad.CMAPrivateMax+1)})
			return err
		}, []error{ErrPrivateData}},
		{"Dial", func() error { _, err := Dial(cancelled, da, to, a.QP, dp); return err }, []error{context.Canceled}},
		{"Dial", func() error { _, err := Dial(testutil.Context(t), da, to, nil, dp); return err }, []error{verbs.ErrInvalid}},
		{"Dial", func() error { _, err := Dial(testutil.Context(t), da, netip.AddrPort{}, a.QP, dp); return err }, []error{verbs.ErrInvalid}},
		{"ResolveUD", func() error {
			_, err := ResolveUD(testutil.Context(t), da, to, &ResolveParams{PrivateData: make([]byte, mad.SIDRPrivateMax+1)})
			return err
		}, []error{ErrPrivateData}},
		{"Accept", func() error { _, err := l.Accept(cancelled); return err }, []error{context.Canceled}},
		{"Listen", func() error { _, err := Listen(db, testPort); return err }, nil},
	})
	l.Close()
	check("after the listener's Close", []call{
		{"Accept", func() error { _, err := l.Accept(context.Background()); return err }, []error{ErrClosed}},
	})

	verbstest.NewSide(t, da, verbstest.SideConfig{Cap: verbstest.DefaultCap, CQE: 16})
	if err := da.Close(); err != nil {
		t.Fatal(err)
	}
	closed := []error{ErrClosed, verbs.ErrClosed}
	check("after the device's Close", []call{
		{"Dial", func() error { _, err := Dial(testutil.Context(t), da, to, a.QP, dp); return err }, closed},
		{"Listen", func() error { _, err := Listen(da, testPort); return err }, closed},
		{"ListenUD", func() error { _, err := ListenUD(da, testPort); return err }, closed},
		{"ResolveUD", func() error {
			_, err := ResolveUD(testutil.Context(t), da, netip.AddrPortFrom(db.Addr().Addr(), 1), &ResolveParams{DevicePort: db.Addr().Port()})
			return err
		}, closed},
	})
}

// TestCloseEndsDialWithErrClosed checks that a Dial waiting for its answer when its device
// closes returns an error naming Dial that wraps cm.ErrClosed and verbs.ErrClosed.
func TestCloseEndsDialWithErrClosed(t *testing.T) {
	da := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	a := newEndpoint(t, da, 0)
	// A socket that answers nothing (not even with ICMP port unreachable, as a closed port
	// would): the REQ waits.
	sink, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IP(verbstest.IPB.AsSlice())})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	dp := &DialParams{ResponseTimeout: time.Minute, DevicePort: uint16(sink.LocalAddr().(*net.UDPAddr).Port)}
	to := netip.AddrPortFrom(verbstest.IPB, testPort)
	errc := make(chan error, 1)
	go func() { _, err := Dial(testutil.Context(t), da, to, a.QP, dp); errc <- err }()
	verbstest.WaitUntil(t, "the request sent", func() bool { return DeviceCounters(da).REQSent == 1 })
	da.Close()
	err = <-errc
	if !errors.Is(err, ErrClosed) || !errors.Is(err, verbs.ErrClosed) || !strings.HasPrefix(err.Error(), "cm: Dial: ") {
		t.Errorf("Dial when its device closed: %v, want cm: Dial: wrapping cm.ErrClosed and verbs.ErrClosed", err)
	}
}
