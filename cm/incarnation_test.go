package cm

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// openAt opens a device at addr (port 0: an ephemeral one) that closes when the test ends.
func openAt(t testing.TB, addr netip.Addr, port uint16) *verbs.Device {
	t.Helper()
	p := verbs.AnyPort
	if port != 0 {
		p = int(port)
	}
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: addr, Port: p, Faults: &verbs.Faults{}})
	if err != nil {
		t.Fatalf("OpenDevice(%v:%d): %v", addr, port, err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// vanish closes dev as a killed process's device goes: its connection manager sends no
// DisconnectRequest, so the peers' connections stay up as far as they know.
func vanish(t testing.TB, dev *verbs.Device) {
	t.Helper()
	m, err := managerFor(dev)
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	for _, c := range m.ids {
		c.stopTimer()
	}
	for _, p := range m.peers {
		p.timer.Stop()
	}
	m.ids, m.peers = map[uint32]*conn{}, map[netip.AddrPort]*peer{}
	m.mu.Unlock()
	dev.Close()
}

// silence makes dev's connection manager deaf and mute, as a hung process's: its device
// stays open (no ICMP error tells the peer anything), and no MAD is answered.
func silence(t *testing.T, dev *verbs.Device) {
	t.Helper()
	m, err := managerFor(dev)
	if err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.closed = true
	for _, c := range m.ids {
		c.stopTimer()
	}
	for _, p := range m.peers {
		p.timer.Stop()
	}
	m.mu.Unlock()
}

// waitEnded waits for the connection to end and checks that it ended with want, its QP
// in ERR.
func waitEnded(t *testing.T, what string, c *Conn, want error) {
	t.Helper()
	select {
	case <-c.Done():
	case <-testutil.Context(t).Done():
		t.Fatalf("%s: still up", what)
	}
	if !errors.Is(c.Err(), want) {
		t.Errorf("%s ended with %v, want %v", what, c.Err(), want)
	}
	if s := c.QP().State(); s != verbs.StateErr {
		t.Errorf("%s: QP in %v, want ERR", what, s)
	}
}

// A dialing device vanishes (its process killed) and a new one opens at its address and
// port and dials again: its request shows the listener a new incarnation, which ends the
// old connection at once; the new one works.
func TestPeerRestartedDials(t *testing.T) {
	db := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	b1, b2 := newEndpoint(t, db, 1), newEndpoint(t, db, 1)
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accept := func(b *endpoint) <-chan *Conn {
		ch := make(chan *Conn, 1)
		go func() {
			defer close(ch)
			r, err := l.Accept(testutil.Context(t))
			if err != nil {
				t.Errorf("Accept: %v", err)
				return
			}
			c, err := r.Accept(b.QP, &AcceptParams{KeepAlive: -1}) // only the incarnation can end it
			if err != nil {
				t.Errorf("Accept: %v", err)
			}
			ch <- c
		}()
		return ch
	}
	dial := func(da *verbs.Device) (*endpoint, *Conn) {
		a := newEndpoint(t, da, 1)
		p := fast(nil)
		c, err := Dial(testutil.Context(t), da, remote(db, p), a.QP, p)
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		return a, c
	}
	da1 := openAt(t, verbstest.IPA, 0)
	acc := accept(b1)
	dial(da1)
	old := <-acc
	if old == nil {
		t.FailNow()
	}
	vanish(t, da1)

	da2 := openAt(t, verbstest.IPA, da1.Addr().Port())
	acc = accept(b2)
	a2, _ := dial(da2)
	nc := <-acc
	if nc == nil {
		t.FailNow()
	}
	waitEnded(t, "the old connection", old, ErrPeerRestarted)
	sendRecv(t, a2, b2, 100)
	if nc.Err() != nil {
		t.Errorf("new connection: %v", nc.Err())
	}
	if n := DeviceCounters(db).PeerRestarts; n != 1 {
		t.Errorf("PeerRestarts = %d, want 1", n)
	}
}

// A listening device vanishes and a new one opens at its address and port (one that runs
// no connection manager): the dialer's next keep-alive probe is answered with the new
// incarnation, and the dialer's connection ends with ErrPeerRestarted, not after
// KeepAliveMisses silent probes, nor never.
func TestPeerRestartedProbed(t *testing.T) {
	da := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	db1 := openAt(t, verbstest.IPB, 0)
	a, b := newEndpoint(t, da, 1), newEndpoint(t, db1, 1)
	p := fast(nil)
	p.KeepAlive = 20 * time.Millisecond
	ca, _ := handshake(t, a, b, p, nil)
	vanish(t, db1)
	start := time.Now()
	openAt(t, verbstest.IPB, db1.Addr().Port())
	waitEnded(t, "the dialer's connection", ca, ErrPeerRestarted)
	t.Logf("ended %v after the new device opened (keep-alive period %v)", time.Since(start), p.KeepAlive)
	s := DeviceCounters(da)
	if s.PeerRestarts != 1 || s.PeersLost != 0 {
		t.Errorf("PeerRestarts %d, PeersLost %d; want 1, 0", s.PeerRestarts, s.PeersLost)
	}
}

// A keep-alive probe and its answer carry the incarnations; a probe without one (a
// standard CM's, or an older softrnic's) is answered without, as before.
func TestProbeCarriesIncarnation(t *testing.T) {
	dev := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	m, port := recordedManager(t, dev)
	src := netip.MustParseAddrPort("127.0.0.9:4791")
	var b [mad.Size]byte
	for _, soft := range []bool{true, false} {
		port.mu.Lock()
		port.sent = nil
		port.mu.Unlock()
		mad.PutClassPortInfoGet(b[:], 7)
		if soft {
			mad.PutIncarnation(b[:], 0xabc1)
		}
		m.HandleMAD(src, 1, b[:])
		port.mu.Lock()
		if len(port.sent) != 1 {
			t.Fatalf("%d answers to a probe", len(port.sent))
		}
		inc, ok := mad.Incarnation(port.sent[0].b)
		port.mu.Unlock()
		switch {
		case soft && (!ok || inc != m.guid):
			t.Errorf("answer to a softrnic probe carries incarnation %#x (%v), want %#x", inc, ok, m.guid)
		case !soft && ok:
			t.Errorf("answer to a standard probe carries an incarnation")
		}
	}
}

// Disconnect from a peer that does not answer (its process hung) returns within one
// keep-alive period with ErrTimeout, long before the DisconnectRequest's retries run
// out; DisconnectContext with a cancelled context returns at once with its error. Either
// way the connection is ended here.
func TestDisconnectSilentPeer(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	a1, b1 := newEndpoint(t, da, 1), newEndpoint(t, db, 1)
	a2, b2 := newEndpoint(t, da, 1), newEndpoint(t, db, 1)
	p := fast(nil) // responses wait 100 ms, 15 retries: 1.5 s of DisconnectRequests
	p.KeepAlive = 500 * time.Millisecond
	c1, _ := handshake(t, a1, b1, p, nil)
	l, _ := Listen(db, testPort+1)
	defer l.Close()
	go func() {
		if r, err := l.Accept(testutil.Context(t)); err == nil {
			r.Accept(b2.QP, nil)
		}
	}()
	p2 := fast(nil)
	p2.DevicePort = db.Addr().Port()
	c2, err := Dial(testutil.Context(t), da, netip.AddrPortFrom(db.Addr().Addr(), testPort+1), a2.QP, p2)
	if err != nil {
		t.Fatal(err)
	}
	silence(t, db)

	start := time.Now()
	err = c1.Disconnect()
	took := time.Since(start)
	if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrPeerUnreachable) {
		t.Errorf("Disconnect from a silent peer: %v, want ErrTimeout", err)
	}
	if r := DeviceCounters(da).DREQRetries; r >= uint64(p.MaxRetries) {
		t.Errorf("Disconnect returned after %d DisconnectRequest retries: it waited them all out", r)
	}
	t.Logf("Disconnect from a silent peer: %v after %v (keep-alive period %v)", err, took, p.KeepAlive)
	waitEnded(t, "the disconnected connection", c1, ErrDisconnected)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	err = c2.DisconnectContext(ctx)
	t.Logf("DisconnectContext, cancelled: %v after %v", err, time.Since(start))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("DisconnectContext with a cancelled context: %v, want context.Canceled", err)
	}
	waitEnded(t, "the connection disconnected with a cancelled context", c2, ErrDisconnected)
}
