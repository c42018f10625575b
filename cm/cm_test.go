package cm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// The handshake with private data at its maximum both ways; data then flows both ways,
// and the first SEND finds the receives posted before Dial and Accept.
func TestDialAccept(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	a, b := newEndpoint(t, da, 4), newEndpoint(t, db, 4)
	ca, cb := handshake(t, a, b, fast(testutil.Fill(mad.CMAPrivateMax, 0xA1)), &AcceptParams{PrivateData: testutil.Fill(mad.AcceptPrivateMax, 0xB2)})
	if !bytes.Equal(cb.PrivateData(), testutil.Fill(mad.CMAPrivateMax, 0xA1)) {
		t.Errorf("listener got private data %x", cb.PrivateData())
	}
	if !bytes.Equal(ca.PrivateData(), testutil.Fill(mad.AcceptPrivateMax, 0xB2)) {
		t.Errorf("dialer got private data %x", ca.PrivateData())
	}
	for _, c := range []*Conn{ca, cb} {
		if s := c.QP().State(); s != verbs.StateRTS {
			t.Errorf("QP %#x in %v after the handshake", c.QP().QPNum(), s)
		}
		if c.Ordering() != verbs.OrderingOrdered {
			t.Errorf("ordering %v, want ordered (nobody offered weak)", c.Ordering())
		}
		if c.Err() != nil {
			t.Errorf("Err() = %v while connected", c.Err())
		}
	}
	if ca.RemoteQPN() != b.QP.QPNum() || cb.RemoteQPN() != a.QP.QPNum() {
		t.Errorf("remote QPNs %#x/%#x, want %#x/%#x", ca.RemoteQPN(), cb.RemoteQPN(), b.QP.QPNum(), a.QP.QPNum())
	}
	if ca.RemoteAddr() != db.Addr() || cb.RemoteAddr() != da.Addr() {
		t.Errorf("remote addresses %v/%v, want %v/%v", ca.RemoteAddr(), cb.RemoteAddr(), db.Addr(), da.Addr())
	}
	aa, _ := a.QP.QueryQP()
	ab, _ := b.QP.QueryQP()
	if aa.SQPSN != ab.RQPSN || ab.SQPSN != aa.RQPSN {
		t.Errorf("PSNs: A sends from %#x, B expects %#x; B sends from %#x, A expects %#x", aa.SQPSN, ab.RQPSN, ab.SQPSN, aa.RQPSN)
	}
	sendRecv(t, a, b, 1000)
	sendRecv(t, b, a, 2000)
}

// Private data one byte over the limit is refused before anything is sent.
func TestPrivateDataLimits(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	a, b := newEndpoint(t, da, 0), newEndpoint(t, db, 0)
	p := fast(testutil.Fill(mad.CMAPrivateMax+1, 1))
	if _, err := Dial(testutil.Context(t), da, remote(db, p), a.QP, p); !errors.Is(err, ErrPrivateData) {
		t.Errorf("Dial with %d bytes: %v, want ErrPrivateData", mad.CMAPrivateMax+1, err)
	}
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	errc := make(chan error, 1)
	go func() {
		p := fast(nil)
		_, err := Dial(testutil.Context(t), da, remote(db, p), a.QP, p)
		errc <- err
	}()
	r, err := l.Accept(testutil.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Accept(b.QP, &AcceptParams{PrivateData: testutil.Fill(mad.AcceptPrivateMax+1, 1)}); !errors.Is(err, ErrPrivateData) {
		t.Errorf("Accept with %d bytes: %v, want ErrPrivateData", mad.AcceptPrivateMax+1, err)
	}
	if err := r.Reject(testutil.Fill(mad.RejectPrivateMax+1, 1)); !errors.Is(err, ErrPrivateData) {
		t.Errorf("Reject with %d bytes: %v, want ErrPrivateData", mad.RejectPrivateMax+1, err)
	}
	if err := r.Reject(testutil.Fill(mad.RejectPrivateMax, 7)); err != nil {
		t.Fatalf("Reject: %v", err)
	}
	<-errc
}

// A consumer reject reaches Dial with its reason and private data.
func TestReject(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	a := newEndpoint(t, da, 0)
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if r, err := l.Accept(testutil.Context(t)); err == nil {
			_ = r.Reject([]byte("go away"))
		}
	}()
	p := fast(nil)
	_, err = Dial(testutil.Context(t), da, remote(db, p), a.QP, p)
	var rej *RejectError
	if !errors.As(err, &rej) || !errors.Is(err, ErrRejected) || errors.Is(err, ErrNoListener) {
		t.Fatalf("Dial: %v, want a consumer reject", err)
	}
	if rej.Reason != ReasonConsumerReject || !bytes.HasPrefix(rej.PrivateData, []byte("go away")) || len(rej.PrivateData) != mad.RejectPrivateMax {
		t.Errorf("reject: %v, private data %q", rej.Reason, rej.PrivateData)
	}
	if s := a.QP.State(); s != verbs.StateInit {
		t.Errorf("QP after a reject: %v, want INIT (it may dial again)", s)
	}
}

// No listener: on a device whose connection manager listens elsewhere, and on one with
// no connection manager at all (QP1's own agent answers).
func TestNoListener(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	dc := verbstest.OpenDevice(t, netip.MustParseAddr("127.0.0.3"), verbs.DeviceConfig{})
	l, err := Listen(db, testPort+1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, d := range []*verbs.Device{db, dc} {
		a := newEndpoint(t, da, 0)
		p := fast(nil)
		_, err := Dial(testutil.Context(t), da, remote(d, p), a.QP, p)
		if !errors.Is(err, ErrNoListener) || !errors.Is(err, ErrRejected) {
			t.Errorf("Dial to %v: %v, want ErrNoListener", d.Addr(), err)
		}
	}
}

// Nothing answers: the request is resent MaxRetries times, then Dial gives up.
func TestDialTimeout(t *testing.T) {
	da := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	sink, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 4)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	a := newEndpoint(t, da, 0)
	before := DeviceCounters(da)
	p := &DialParams{ResponseTimeout: 10 * time.Millisecond, MaxRetries: 3, DevicePort: uint16(sink.LocalAddr().(*net.UDPAddr).Port)}
	_, err = Dial(testutil.Context(t), da, netip.MustParseAddrPort("127.0.0.4:7471"), a.QP, p)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Dial: %v, want ErrTimeout", err)
	}
	s := DeviceCounters(da)
	if got := s.REQRetries - before.REQRetries; got != 3 {
		t.Errorf("%d retries, want 3", got)
	}
	if got := s.REQSent - before.REQSent; got != 1 {
		t.Errorf("%d requests, want 1", got)
	}
	// The context bounds Dial too.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p.MaxRetries = 15
	if _, err := Dial(ctx, da, netip.MustParseAddrPort("127.0.0.4:7471"), a.QP, p); !errors.Is(err, context.Canceled) {
		t.Errorf("Dial with a cancelled context: %v", err)
	}
}

// Either side disconnects: both QPs end in ERR, the other side's Done closes with
// ErrDisconnected, outstanding receives are flushed.
func TestDisconnect(t *testing.T) {
	for _, fromDialer := range []bool{true, false} {
		da, db := devs(t, verbs.DeviceConfig{})
		a, b := newEndpoint(t, da, 2), newEndpoint(t, db, 2)
		ca, cb := handshake(t, a, b, fast(nil), nil)
		from, to := ca, cb
		if !fromDialer {
			from, to = cb, ca
		}
		// The context, not the keep-alive period, bounds the wait for the answer: a
		// busy machine may take its time.
		if err := from.DisconnectContext(testutil.Context(t)); err != nil {
			t.Fatalf("Disconnect: %v", err)
		}
		<-from.Done()
		<-to.Done()
		for _, c := range []*Conn{from, to} {
			if !errors.Is(c.Err(), ErrDisconnected) {
				t.Errorf("Err() = %v, want ErrDisconnected", c.Err())
			}
			if s := c.QP().State(); s != verbs.StateErr {
				t.Errorf("QP %#x in %v after disconnect", c.QP().QPNum(), s)
			}
		}
		for _, e := range []*endpoint{a, b} {
			for _, wc := range verbstest.PollN(t, e.RCQ, 2) {
				if wc.Status != verbs.WCWRFlushErr {
					t.Errorf("receive after disconnect: %v, want flushed", wc.Status)
				}
			}
		}
		if err := from.Disconnect(); err != nil {
			t.Errorf("second Disconnect: %v", err)
		}
		if err := to.Disconnect(); err != nil {
			t.Errorf("Disconnect after the peer's: %v", err)
		}
	}
}

// Weakly-ordered mode only if both sides offer it; the hole span is the smaller.
func TestOrderingNegotiated(t *testing.T) {
	for _, tc := range []struct{ dial, accept, want verbs.Ordering }{
		{verbs.OrderingWeak, verbs.OrderingWeak, verbs.OrderingWeak},
		{verbs.OrderingWeak, verbs.OrderingOrdered, verbs.OrderingOrdered},
		{verbs.OrderingOrdered, verbs.OrderingWeak, verbs.OrderingOrdered},
	} {
		da, db := devs(t, verbs.DeviceConfig{})
		a, b := newEndpoint(t, da, 1), newEndpoint(t, db, 1)
		dp := fast(nil)
		dp.Options = verbs.ConnectOptions{Ordering: tc.dial, MaxHole: 1024, MTU: verbs.MTU4096}
		ca, cb := handshake(t, a, b, dp, &AcceptParams{Options: verbs.ConnectOptions{Ordering: tc.accept, MaxHole: 256, MTU: verbs.MTU2048}})
		if ca.Ordering() != tc.want || cb.Ordering() != tc.want {
			t.Errorf("%v/%v: got %v/%v, want %v", tc.dial, tc.accept, ca.Ordering(), cb.Ordering(), tc.want)
		}
		qa, _ := a.QP.QueryQP()
		qb, _ := b.QP.QueryQP()
		if qa.Ordering != tc.want || qb.Ordering != tc.want {
			t.Errorf("QPs in %v/%v", qa.Ordering, qb.Ordering)
		}
		if tc.want == verbs.OrderingWeak && (qa.MaxHole != 256 || qb.MaxHole != 256) {
			t.Errorf("hole spans %d/%d, want 256", qa.MaxHole, qb.MaxHole)
		}
		if qa.PathMTU != verbs.MTU2048 || qb.PathMTU != verbs.MTU2048 {
			t.Errorf("MTUs %v/%v, want 2048 (the smaller)", qa.PathMTU, qb.PathMTU)
		}
		sendRecv(t, a, b, 1500)
		ca.Disconnect()
	}
}

// An application slow to accept: the resent request is answered with MRA, and the
// connection is made when the application gets to it.
func TestMRAWhileApplicationIsSlow(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	a, b := newEndpoint(t, da, 1), newEndpoint(t, db, 1)
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type res struct {
		c   *Conn
		err error
	}
	dialed := make(chan res, 1)
	p := &DialParams{ResponseTimeout: 20 * time.Millisecond}
	go func() {
		c, err := Dial(testutil.Context(t), da, remote(db, p), a.QP, p)
		dialed <- res{c, err}
	}()
	verbstest.WaitUntil(t, "an MRA", func() bool { return DeviceCounters(da).MRAReceived > 0 })
	r, err := l.Accept(testutil.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	cb, err := r.Accept(b.QP, nil)
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	d := <-dialed
	if d.err != nil {
		t.Fatalf("Dial: %v", d.err)
	}
	sendRecv(t, a, b, 100)
	_ = cb
}

// Closing a listener ends a waiting Accept; closing the device ends waiting Dials and
// established connections.
func TestClose(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(db, testPort); err == nil {
		t.Error("a second listener on the same port was allowed")
	}
	errc := make(chan error, 1)
	go func() {
		_, err := l.Accept(context.Background())
		errc <- err
	}()
	l.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
	a, b := newEndpoint(t, da, 1), newEndpoint(t, db, 1)
	ca, cb := handshake(t, a, b, fast(nil), nil)
	db.Close()
	<-cb.Done()
	if !errors.Is(cb.Err(), ErrClosed) {
		t.Errorf("listener's connection after its device closed: %v", cb.Err())
	}
	<-ca.Done() // the closing device's DisconnectRequest
	if !errors.Is(ca.Err(), ErrDisconnected) {
		t.Errorf("dialer's connection after the peer device closed: %v", ca.Err())
	}
	if _, err := Listen(db, testPort); err == nil {
		t.Error("Listen on a closed device succeeded")
	}
	if err := cb.Disconnect(); !errors.Is(err, ErrClosed) || !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Disconnect after the device closed: %v, want cm.ErrClosed and verbs.ErrClosed", err)
	}
}

// Many Dials at once into one listener: all are established.
func TestConcurrentDials(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	da, db := devs(t, verbs.DeviceConfig{})
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pdA, _ := da.AllocPD()
	pdB, _ := db.AllocPD()
	cqA := verbstest.MustCQ(t, da, 4, nil)
	cqB := verbstest.MustCQ(t, db, 4, nil)
	srq, err := pdB.CreateSRQ(&verbs.SRQInitAttr{MaxWR: 64, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	accepted := acceptEach(t, l, n, func(int) (*verbs.QP, error) {
		return pdB.CreateQP(&verbs.QPInitAttr{SendCQ: cqB, RecvCQ: cqB, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 1, MaxSendSGE: 1}})
	}, nil)
	qps := make([]*verbs.QP, n)
	for i := range qps {
		if qps[i], err = pdA.CreateQP(&verbs.QPInitAttr{SendCQ: cqA, RecvCQ: cqA, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	dialEach(t, da, db, qps, func() *DialParams { return &DialParams{ResponseTimeout: 500 * time.Millisecond} })
	collect(t, accepted, n)
	if s := DeviceCounters(db); s.Established != uint64(n) {
		t.Errorf("listener established %d, want %d", s.Established, n)
	}
}
