package cm

import (
	"context"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// The conventions of Linux's CM (drivers/infiniband/core/cm.c) that a standard peer relies
// on, checked on what this side sends and how it sets its QP. The peer here is a recorded
// QP1: what the manager sends is captured, what the peer would send is handed to
// HandleMAD from the addresses a Linux peer uses (its MADs leave from a source port of
// its own, here linuxSrc; it listens on RoCEv2Port only).

var (
	linuxSrc = netip.MustParseAddrPort("127.0.0.1:55410")
	linuxDev = netip.AddrPortFrom(linuxSrc.Addr(), RoCEv2Port)
)

// recordedManager installs a manager for dev whose QP1 records instead of sending.
func recordedManager(t *testing.T, dev *verbs.Device) (*manager, *recordPort) {
	t.Helper()
	port := &recordPort{local: dev.Addr()}
	m := newManager(dev, port)
	managersMu.Lock()
	managers[dev] = m
	managersMu.Unlock()
	t.Cleanup(func() {
		managersMu.Lock()
		delete(managers, dev)
		managersMu.Unlock()
		m.mu.Lock()
		m.closed = true
		for _, c := range m.ids {
			c.stopTimer()
		}
		m.mu.Unlock()
	})
	return m, port
}

// sentMsg waits until port recorded a MAD of attribute attr and decodes it into msg,
// returning where it went.
func sentMsg(t *testing.T, port *recordPort, msg mad.Message) netip.AddrPort {
	t.Helper()
	var to netip.AddrPort
	verbstest.WaitUntil(t, "a "+msg.Attr().String()+" sent", func() bool {
		port.mu.Lock()
		defer port.mu.Unlock()
		for _, s := range port.sent {
			if h, err := mad.DecodeHeader(s.b); err == nil && h.AttrID == msg.Attr() {
				if _, err := mad.Decode(s.b, msg); err != nil {
					t.Fatalf("decoding the %v sent: %v", msg.Attr(), err)
				}
				to = s.to
				return true
			}
		}
		return false
	})
	return to
}

func handle(m *manager, src netip.AddrPort, msg mad.Message) {
	var b [mad.Size]byte
	mad.Put(b[:], 0x1234, msg)
	m.HandleMAD(src, 1, b[:])
}

// Passive side, a Linux requester: the REP goes to RoCEv2Port; its Starting PSN is the
// PSN the QP receives first, and the QP sends from the REQ's Starting PSN; the reserved
// Local EECN stays zero; RTU and DREQ are taken from any source port of the address.
func TestLinuxRequester(t *testing.T) {
	dev := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	m, port := recordedManager(t, dev)
	l, err := Listen(dev, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	e := newEndpoint(t, dev, 1)
	const reqPSN = 0x65ec3e
	req := mad.REQ{LocalCommID: 0x1111, ServiceID: mad.ServiceID(testPort), LocalQPN: 0x11, StartingPSN: reqPSN,
		TransportType: mad.TransportRC, PathMTU: uint8(verbs.MTU1024), MaxCMRetries: 15, LocalCMResponseTimeout: 20,
		ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7,
		Primary: mad.Path{LocalACKTimeout: 19}}
	h := mad.CMAHeader{SrcPort: 40000, Src: linuxSrc.Addr(), Dst: dev.Addr().Addr()}
	h.Put(req.PrivateData[:])
	handle(m, linuxSrc, &req)
	r, err := l.Accept(testutil.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if r.Remote != linuxDev {
		t.Errorf("Request.Remote %v, want %v (the standard peer's device port)", r.Remote, linuxDev)
	}
	accepted := make(chan error, 1)
	go func() {
		_, err := r.Accept(e.QP, nil)
		accepted <- err
	}()
	var rep mad.REP
	if to := sentMsg(t, port, &rep); to != linuxDev {
		t.Errorf("REP sent to %v, want %v", to, linuxDev)
	}
	if rep.LocalEECN != 0 {
		t.Errorf("REP Local EECN %#x to a standard peer, want 0 (reserved for RC)", rep.LocalEECN)
	}
	if rep.TargetACKDelay != targetACKDelay {
		t.Errorf("REP Target ACK Delay %d, want %d", rep.TargetACKDelay, targetACKDelay)
	}
	attr, _ := e.QP.QueryQP()
	if attr.SQPSN != reqPSN || attr.RQPSN != rep.StartingPSN {
		t.Errorf("QP sends from %#x and receives from %#x; want the REQ's %#x and the REP's %#x",
			attr.SQPSN, attr.RQPSN, reqPSN, rep.StartingPSN)
	}
	if attr.AHAttr.DestPort != RoCEv2Port || attr.AHAttr.SrcPort != 0 {
		t.Errorf("QP sends to port %d and accepts source port %d; want %d and any (0)", attr.AHAttr.DestPort, attr.AHAttr.SrcPort, RoCEv2Port)
	}
	if attr.Timeout != 19 || attr.RetryCnt != 7 || attr.RNRRetry != 7 {
		t.Errorf("QP's local ACK timeout %d, retries %d, RNR retries %d; want the REQ's 19, 7, 7", attr.Timeout, attr.RetryCnt, attr.RNRRetry)
	}
	handle(m, netip.AddrPortFrom(linuxSrc.Addr(), 55411), &mad.RTU{LocalCommID: req.LocalCommID, RemoteCommID: rep.LocalCommID})
	if err := <-accepted; err != nil {
		t.Fatalf("Accept: %v", err)
	}
	handle(m, linuxSrc, &mad.DREQ{LocalCommID: req.LocalCommID, RemoteCommID: rep.LocalCommID, RemoteQPN: e.QP.QPNum()})
	var drep mad.DREP
	if to := sentMsg(t, port, &drep); to != linuxDev || drep.RemoteCommID != req.LocalCommID {
		t.Errorf("DREP %+v sent to %v, want one for %#x to %v", drep, to, req.LocalCommID, linuxDev)
	}
	if s := e.QP.State(); s != verbs.StateErr {
		t.Errorf("QP in %v after the peer's DREQ", s)
	}
}

// Active side, a Linux listener: the REQ goes to RoCEv2Port and its Starting PSN is the
// PSN the QP receives first; the REP, from any source port of the listener's address,
// gives the PSN the QP sends from; the RTU goes to RoCEv2Port. A REP from another address
// is not taken.
func TestLinuxListener(t *testing.T) {
	dev := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	m, port := recordedManager(t, dev)
	e := newEndpoint(t, dev, 1)
	type result struct {
		c   *Conn
		err error
	}
	dialed := make(chan result, 1)
	go func() {
		c, err := Dial(testutil.Context(t), dev, netip.AddrPortFrom(linuxSrc.Addr(), testPort), e.QP, &DialParams{KeepAlive: -1})
		dialed <- result{c, err}
	}()
	var req mad.REQ
	if to := sentMsg(t, port, &req); to != linuxDev {
		t.Errorf("REQ sent to %v, want %v", to, linuxDev)
	}
	const repPSN = 0x5762e9
	rep := mad.REP{LocalCommID: 0x2222, RemoteCommID: req.LocalCommID, LocalQPN: 0x12, StartingPSN: repPSN,
		ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7, TargetACKDelay: 15}
	handle(m, netip.MustParseAddrPort("127.0.0.9:55410"), &rep) // a stranger
	if s := e.QP.State(); s == verbs.StateRTS {
		t.Fatal("a REP from another address connected the QP")
	}
	handle(m, linuxSrc, &rep)
	res := <-dialed
	if res.err != nil {
		t.Fatalf("Dial: %v", res.err)
	}
	attr, _ := e.QP.QueryQP()
	if attr.SQPSN != repPSN || attr.RQPSN != req.StartingPSN {
		t.Errorf("QP sends from %#x and receives from %#x; want the REP's %#x and the REQ's %#x",
			attr.SQPSN, attr.RQPSN, repPSN, req.StartingPSN)
	}
	if attr.AHAttr.DestPort != RoCEv2Port || attr.AHAttr.SrcPort != 0 {
		t.Errorf("QP sends to port %d and accepts source port %d; want %d and any (0)", attr.AHAttr.DestPort, attr.AHAttr.SrcPort, RoCEv2Port)
	}
	var rtu mad.RTU
	if to := sentMsg(t, port, &rtu); to != linuxDev || rtu.RemoteCommID != rep.LocalCommID {
		t.Errorf("RTU %+v sent to %v, want one for %#x to %v", rtu, to, rep.LocalCommID, linuxDev)
	}
	if res.c.RemoteQPN() != rep.LocalQPN {
		t.Errorf("connected to QP %#x, want %#x", res.c.RemoteQPN(), rep.LocalQPN)
	}
}

// A softrnic listener answers from the device port it was dialled at: a REP with the
// extension from another port of its address is not taken.
func TestSoftrnicREPFromOtherPort(t *testing.T) {
	dev := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	m, port := recordedManager(t, dev)
	e := newEndpoint(t, dev, 1)
	peerDev := netip.MustParseAddrPort("127.0.0.1:5000")
	ctx, cancel := context.WithCancel(testutil.Context(t))
	done := make(chan error, 1)
	go func() {
		_, err := Dial(ctx, dev, netip.AddrPortFrom(peerDev.Addr(), testPort), e.QP, &DialParams{DevicePort: peerDev.Port(), KeepAlive: -1})
		done <- err
	}()
	var req mad.REQ
	if to := sentMsg(t, port, &req); to != peerDev {
		t.Fatalf("REQ sent to %v, want %v", to, peerDev)
	}
	rep := mad.REP{LocalCommID: 0x3333, RemoteCommID: req.LocalCommID, LocalQPN: 0x13, StartingPSN: 1,
		ResponderResources: 1, InitiatorDepth: 1, LocalEECN: ext(verbs.OrderingOrdered, 0, verbs.MTU1024)}
	handle(m, netip.AddrPortFrom(peerDev.Addr(), 5001), &rep)
	m.mu.Lock()
	state := m.ids[req.LocalCommID].state
	m.mu.Unlock()
	if state != stReqSent {
		t.Errorf("a softrnic REP from another port moved the connection to state %d", state)
	}
	cancel()
	<-done
}
