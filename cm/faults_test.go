package cm

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// Under loss, duplication, reordering and corruption of every datagram (CM MADs and data
// alike), every Dial is established exactly once on both sides, data flows, and after
// the disconnects both managers forget every connection: nothing is left half-open.
func TestFaults(t *testing.T) {
	const n = 60
	faults := &verbs.Faults{Loss: 0.05, Dup: 0.05, Reorder: 0.05, Corrupt: 0.01, Seed: 7}
	da, db := devs(t, verbs.DeviceConfig{Faults: faults})
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	as := make([]*endpoint, n)
	bs := make([]*endpoint, n)
	for i := range as {
		as[i], bs[i] = newEndpoint(t, da, 1), newEndpoint(t, db, 1)
	}
	accepted := acceptEach(t, l, n, func(i int) (*verbs.QP, error) { return bs[i].QP, nil }, &AcceptParams{KeepAlive: -1})
	qps := make([]*verbs.QP, n)
	for i := range qps {
		qps[i] = as[i].QP
	}
	dialed := dialEach(t, da, db, qps, func() *DialParams { return &DialParams{ResponseTimeout: 50 * time.Millisecond, KeepAlive: -1} })
	collect(t, accepted, n)
	sa, sb := DeviceCounters(da), DeviceCounters(db)
	if sa.Established != n || sb.Established != n {
		t.Errorf("established %d (dialer) and %d (listener), want %d each", sa.Established, sb.Established, n)
	}
	t.Logf("dialer: %d REQ retries, %d duplicate REPs answered; listener: %d duplicate REQs, %d REP retries, %d MRAs",
		sa.REQRetries, sa.RTUSent-n, sb.REQDuplicates, sb.REPRetries, sb.MRASent)
	// Which accepted QP pairs with which dialed one is up to the handshake order: find
	// each dialer's peer by QP number, and send through a few.
	byQPN := map[uint32]*endpoint{}
	for _, b := range bs {
		byQPN[b.QP.QPNum()] = b
	}
	for i := 0; i < 5; i++ {
		sendRecv(t, as[i], byQPN[dialed[i].RemoteQPN()], 300)
	}
	var wg sync.WaitGroup
	for _, c := range dialed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Disconnect(); err != nil && !errors.Is(err, ErrTimeout) {
				t.Errorf("Disconnect: %v", err)
			}
		}()
	}
	wg.Wait()
	for _, m := range []*verbs.Device{da, db} {
		mgr, _ := managerFor(m)
		verbstest.WaitUntil(t, "every connection forgotten after time-wait", func() bool {
			mgr.mu.Lock()
			defer mgr.mu.Unlock()
			return len(mgr.ids) == 0 && len(mgr.byRemote) == 0 && len(mgr.byQP) == 0
		})
	}
	for _, b := range bs {
		if s := b.QP.State(); s != verbs.StateErr {
			t.Errorf("listener's QP %#x in %v after the dialer disconnected", b.QP.QPNum(), s)
		}
	}
}

// A ConnectRequest from a peer QP that is connected here under another communication ID
// (the peer restarted and reused the QP number) is rejected as stale, and the old
// connection ends.
func TestStaleConnection(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	a, b := newEndpoint(t, da, 1), newEndpoint(t, db, 1)
	_, cb := handshake(t, a, b, fast(nil), nil)
	m, _ := managerFor(db)
	// The REQ the restarted peer would send: same device address, same QP number, a
	// new communication ID, softrnic's extension.
	req := mad.REQ{LocalCommID: 0x5157A1E, ServiceID: mad.ServiceID(testPort), LocalQPN: a.QP.QPNum(),
		TransportType: mad.TransportRC, PathMTU: uint8(verbs.MTU1024), StartingPSN: 1, MaxCMRetries: 3,
		LocalEECN: ext(verbs.OrderingOrdered, 0, verbs.MTU1024)}
	injectREQ(m, da.Addr(), db, &req)
	<-cb.Done()
	if !errors.Is(cb.Err(), ErrDisconnected) {
		t.Errorf("old connection: %v, want ErrDisconnected", cb.Err())
	}
	if s := DeviceCounters(db); s.StaleRejects != 1 {
		t.Errorf("%d stale rejects, want 1", s.StaleRejects)
	}
	if s := b.QP.State(); s != verbs.StateErr {
		t.Errorf("old connection's QP in %v", s)
	}
}

// A Dial cancelled while its request waits for an answer leaves the listener nothing
// half-open: the REJ it sends withdraws the request, and Accept skips it.
func TestDialCancelledWithdrawsRequest(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	a := newEndpoint(t, da, 0)
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		p := fast(nil)
		_, err := Dial(ctx, da, remote(db, p), a.QP, p)
		errc <- err
	}()
	m, _ := managerFor(db)
	verbstest.WaitUntil(t, "the request in the backlog", func() bool { return len(l.backlog) == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial: %v", err)
	}
	verbstest.WaitUntil(t, "the request withdrawn", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.ids) == 0
	})
	actx, acancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer acancel()
	if r, err := l.Accept(actx); err == nil {
		t.Errorf("Accept returned the withdrawn request from %v", r.Remote)
	}
}

// Between softrnic devices both QPs accept packets only from the peer device's UDP port;
// a QP accepting the request of a standard CM (no softrnic extension in its Local EECN)
// accepts its peer's packets from any source port of the peer's address, as a standard
// RoCEv2 peer sends each QP's packets from a port of its own choosing.
func TestSourcePortByPeerKind(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	a, b := newEndpoint(t, da, 1), newEndpoint(t, db, 1)
	handshake(t, a, b, fast(nil), nil)
	for _, c := range []struct {
		e    *endpoint
		peer *verbs.Device
	}{{a, db}, {b, da}} {
		if attr, _ := c.e.QP.QueryQP(); attr.AHAttr.SrcPort != c.peer.Addr().Port() {
			t.Errorf("softrnic peers: QP %#x accepts source port %d, want the peer device's %d", c.e.QP.QPNum(), attr.AHAttr.SrcPort, c.peer.Addr().Port())
		}
	}

	dc := verbstest.OpenDevice(t, netip.MustParseAddr("127.0.0.3"), verbs.DeviceConfig{})
	l, err := Listen(dc, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := newEndpoint(t, dc, 1)
	req := mad.REQ{LocalCommID: 0x57D, ServiceID: mad.ServiceID(testPort), LocalQPN: 0x1234,
		TransportType: mad.TransportRC, PathMTU: uint8(verbs.MTU1024), StartingPSN: 1, MaxCMRetries: 3,
		ResponderResources: 4, InitiatorDepth: 4, RetryCount: 7, RNRRetryCount: 7}
	m, _ := managerFor(dc)
	injectREQ(m, netip.AddrPortFrom(da.Addr().Addr(), 4791), dc, &req)
	r, err := l.Accept(testutil.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	go r.Accept(c.QP, nil) // waits for an RTU that does not come; the QP is connected before the REP
	verbstest.WaitUntil(t, "the QP connected", func() bool { return c.QP.State() == verbs.StateRTS })
	if attr, _ := c.QP.QueryQP(); attr.AHAttr.SrcPort != 0 || attr.DestQPNum != 0x1234 {
		t.Errorf("standard peer: QP accepts source port %d (want 0: any), connected to %#x", attr.AHAttr.SrcPort, attr.DestQPNum)
	}
}
