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
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

const testUDPort = 7174 // udaddy's

// udEnd is a UD QP in RTS with Q_Key UDPQKey, its CQ and a registered buffer.
type udEnd struct {
	ctx *verbs.Device
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR
}

func newUDEnd(t *testing.T, ctx *verbs.Device) *udEnd {
	t.Helper()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	e := &udEnd{ctx: ctx, pd: pd, cq: verbstest.MustCQ(t, ctx, 64, nil)}
	e.qp, err = pd.CreateQP(&verbs.QPInitAttr{QPType: verbs.QPTypeUD, SendCQ: e.cq, RecvCQ: e.cq, Cap: verbstest.DefaultCap})
	if err != nil {
		t.Fatal(err)
	}
	if err := InitUDQP(e.qp, 0); err != nil {
		t.Fatal(err)
	}
	e.mr = verbstest.MustReg(t, pd, make([]byte, 8192), verbs.AccessLocalWrite)
	return e
}

func resolveCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A resolution between two devices, as udaddy does it: the listener answers with a UD QP
// whose receives are posted; the requester gets its QP number, rdma_cm's Q_Key, both
// sides' private data, and an address vector through which a datagram reaches that QP.
func TestResolveUD(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	a, b := newUDEnd(t, da), newUDEnd(t, db)
	verbstest.MustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: verbstest.SGL(b.mr, 0, 4096)})
	l, err := ListenUD(db, testUDPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type acc struct {
		r   *UDRequest
		err error
	}
	accepted := make(chan acc, 1)
	go func() {
		r, err := l.Accept(resolveCtx(t))
		if err == nil {
			err = r.Accept(b.qp, &UDAcceptParams{PrivateData: []byte("welcome")})
		}
		accepted <- acc{r, err}
	}()
	rem, err := ResolveUD(resolveCtx(t), da, netip.AddrPortFrom(db.Addr().Addr(), testUDPort),
		&ResolveParams{PrivateData: []byte("hello"), DevicePort: db.Addr().Port(), ResponseTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("ResolveUD: %v", err)
	}
	ac := <-accepted
	if ac.err != nil {
		t.Fatalf("Accept: %v", ac.err)
	}
	if ac.r.Remote != da.Addr() {
		t.Errorf("request from %v, want the requesting device %v (a softrnic device is answered at its port)", ac.r.Remote, da.Addr())
	}
	if len(ac.r.PrivateData) != mad.SIDRPrivateMax || !bytes.HasPrefix(ac.r.PrivateData, []byte("hello")) {
		t.Errorf("listener's private data %q (%d bytes), want \"hello\" padded to %d", ac.r.PrivateData[:8], len(ac.r.PrivateData), mad.SIDRPrivateMax)
	}
	if rem.QPN != b.qp.QPNum() || rem.QKey != UDPQKey || rem.Addr != db.Addr() {
		t.Errorf("resolved QPN %#x Q_Key %#x at %v, want %#x %#x at %v", rem.QPN, rem.QKey, rem.Addr, b.qp.QPNum(), UDPQKey, db.Addr())
	}
	if len(rem.PrivateData) != mad.SIDRREPPrivateLen || !bytes.HasPrefix(rem.PrivateData, []byte("welcome")) {
		t.Errorf("requester's private data %q (%d bytes)", rem.PrivateData[:8], len(rem.PrivateData))
	}
	ah, err := a.pd.CreateAH(&rem.AHAttr)
	if err != nil {
		t.Fatal(err)
	}
	copy(a.mr.Buf(), "datagram")
	verbstest.MustPostSend(t, a.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRSendWithImm, SendFlags: verbs.SendSignaled, ImmData: a.qp.QPNum(),
		SGList: verbstest.SGL(a.mr, 0, 8), AH: ah, RemoteQPN: rem.QPN, RemoteQKey: rem.QKey})
	verbstest.WantSendWC(t, verbstest.PollOne(t, a.cq), 2, verbs.WCSend, a.qp)
	wc := verbstest.PollOne(t, b.cq)
	if wc.Status != verbs.WCSuccess || wc.ImmData != a.qp.QPNum() || wc.ByteLen != verbs.GRHLen+8 ||
		!bytes.Equal(b.mr.Buf()[verbs.GRHLen:verbs.GRHLen+8], []byte("datagram")) {
		t.Errorf("datagram through the resolved address: %+v", wc)
	}
	sa, sb := DeviceSIDRCounters(da), DeviceSIDRCounters(db)
	if sa.REQSent != 1 || sa.Resolved != 1 || sb.REQReceived != 1 || sb.REPSent != 1 {
		t.Errorf("counters: requester %+v, listener %+v", sa, sb)
	}
	if err := ac.r.Reject(nil); !errors.Is(err, ErrState) {
		t.Errorf("Reject after Accept: %v, want ErrState", err)
	}
}

// Nothing listening on the UDP port (a TCP-port-space listener on the same number does
// not count): ErrNoListener at once, from the "not supported" answer. A rejecting
// listener: ErrRejected with its private data.
func TestResolveUDRefused(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	rl, err := Listen(db, testUDPort)
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	remote := netip.AddrPortFrom(db.Addr().Addr(), testUDPort)
	p := &ResolveParams{DevicePort: db.Addr().Port(), ResponseTimeout: time.Minute}
	_, err = ResolveUD(resolveCtx(t), da, remote, p)
	var se *SIDRError
	if !errors.Is(err, ErrNoListener) || !errors.As(err, &se) || se.Status != SIDRUnsupported {
		t.Fatalf("no UD listener: %v, want ErrNoListener (SIDRUnsupported)", err)
	}

	l, err := ListenUD(db, testUDPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := ListenUD(db, testUDPort); err == nil {
		t.Error("a second UD listener on one port")
	}
	go func() {
		if r, err := l.Accept(resolveCtx(t)); err == nil {
			_ = r.Reject([]byte("go away"))
		}
	}()
	_, err = ResolveUD(resolveCtx(t), da, remote, p)
	if !errors.Is(err, ErrRejected) || errors.Is(err, ErrNoListener) || !errors.As(err, &se) || se.Status != SIDRReject ||
		!bytes.HasPrefix(se.PrivateData, []byte("go away")) {
		t.Fatalf("rejected: %v", err)
	}
}

// sidrRig is a manager whose QP1 records what it sends (the requester side or the
// listener side), for driving the SIDR state machine MAD by MAD.
type sidrRig struct {
	dev  *verbs.Device
	m    *manager
	port *recordPort
}

func newSIDRRig(t *testing.T) *sidrRig {
	dev := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	m, port := recordedManager(t, dev)
	t.Cleanup(func() {
		m.mu.Lock()
		m.closeSIDR()
		m.mu.Unlock()
	})
	return &sidrRig{dev: dev, m: m, port: port}
}

// sent returns the MADs of attribute attr sent so far, and where each went.
func (r *sidrRig) sent(attr mad.AttrID) (to []netip.AddrPort, b [][]byte) {
	r.port.mu.Lock()
	defer r.port.mu.Unlock()
	for _, s := range r.port.sent {
		if h, err := mad.DecodeHeader(s.b); err == nil && h.AttrID == attr {
			to, b = append(to, s.to), append(b, s.b)
		}
	}
	return to, b
}

func (r *sidrRig) waitSent(t *testing.T, attr mad.AttrID, n int) (to []netip.AddrPort, b [][]byte) {
	t.Helper()
	verbstest.WaitUntil(t, "the MADs sent", func() bool {
		_, b := r.sent(attr)
		return len(b) >= n
	})
	return r.sent(attr)
}

func (r *sidrRig) dropped() uint64 {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.m.stats.Dropped
}

func (r *sidrRig) handle(src netip.AddrPort, tid uint64, msg mad.Message) {
	var b [mad.Size]byte
	mad.Put(b[:], tid, msg)
	r.m.HandleMAD(src, 1, b[:])
}

// The requester's side, as a Linux listener sees it: the SIDR_REQ names the UDP port
// space's service ID with rdma_cm's addressing header, is resent while no answer comes
// (a lost request or answer) and each copy is the same; answers that do not match in
// every respect (request ID, transaction ID, service ID, sender, QPN) change nothing and
// are counted dropped; the genuine one, from a standard peer's own source port,
// resolves.
func TestResolveUDRetriesAndChecks(t *testing.T) {
	r := newSIDRRig(t)
	peer := netip.MustParseAddrPort("127.0.0.1:4791") // a standard peer: RoCEv2Port
	type res struct {
		rem *UDRemote
		err error
	}
	done := make(chan res, 1)
	go func() {
		rem, err := ResolveUD(resolveCtx(t), r.dev, netip.AddrPortFrom(peer.Addr(), testUDPort),
			&ResolveParams{PrivateData: []byte("hi"), ResponseTimeout: 10 * time.Millisecond, MaxRetries: 15})
		done <- res{rem, err}
	}()
	to, reqs := r.waitSent(t, mad.AttrSIDRREQ, 3) // the first and two resends
	var req mad.SIDRREQ
	h, err := mad.Decode(reqs[0], &req)
	if err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if to[i] != peer || !bytes.Equal(reqs[i], reqs[0]) {
			t.Fatalf("request %d to %v differs from the first, or not to %v", i, to[i], peer)
		}
	}
	hdr, herr := mad.DecodeCMAHeader(req.PrivateData[:])
	if req.ServiceID != mad.UDPServiceID(testUDPort) || req.PKey != 0xFFFF || req.RequestID == 0 || herr != nil ||
		hdr.Src != verbstest.IPB || hdr.Dst != peer.Addr() || string(req.PrivateData[mad.CMAHeaderLen:mad.CMAHeaderLen+2]) != "hi" {
		t.Fatalf("SIDR_REQ %+v, header %+v %v", req, hdr, herr)
	}
	good := mad.SIDRREP{RequestID: req.RequestID, Status: mad.SIDRSuccess, QPN: 0x1234, ServiceID: req.ServiceID, QKey: UDPQKey}
	src := netip.MustParseAddrPort("127.0.0.1:55410") // a Linux CM's own source port
	bad := []struct {
		what string
		src  netip.AddrPort
		tid  uint64
		f    func(*mad.SIDRREP)
	}{
		{"another request ID", src, h.TID, func(m *mad.SIDRREP) { m.RequestID++ }},
		{"another transaction ID", src, h.TID + 1, func(*mad.SIDRREP) {}},
		{"another service ID", src, h.TID, func(m *mad.SIDRREP) { m.ServiceID = mad.ServiceID(testUDPort) }},
		{"another address", netip.MustParseAddrPort("127.0.0.9:4791"), h.TID, func(*mad.SIDRREP) {}},
		{"QP1", src, h.TID, func(m *mad.SIDRREP) { m.QPN = 1 }},
	}
	for i, c := range bad {
		m := good
		c.f(&m)
		r.handle(c.src, c.tid, &m)
		if d := r.dropped(); d != uint64(i+1) {
			t.Fatalf("%s: %d dropped, want %d", c.what, d, i+1)
		}
	}
	select {
	case got := <-done:
		t.Fatalf("resolved by a wrong answer: %+v %v", got.rem, got.err)
	default:
	}
	r.handle(src, h.TID, &good)
	got := <-done
	if got.err != nil || got.rem.QPN != 0x1234 || got.rem.QKey != UDPQKey || got.rem.Addr != peer ||
		got.rem.AHAttr.DGID != verbs.GIDFromAddr(peer.Addr()) || got.rem.AHAttr.DestPort != RoCEv2Port {
		t.Fatalf("resolved: %+v, %v", got.rem, got.err)
	}
	r.handle(src, h.TID, &good) // a late duplicate: nothing waits for it
	if d := r.dropped(); d != uint64(len(bad)+1) {
		t.Errorf("a late duplicate answer not dropped (%d dropped)", d)
	}
	if s := DeviceSIDRCounters(r.dev); s.REQRetries < 2 || s.Resolved != 1 {
		t.Errorf("counters %+v", s)
	}
	if n := len(r.m.reqSlots); n != 0 {
		t.Errorf("%d request slots still taken", n)
	}
}

// A softrnic listener (not at RoCEv2Port) answers from its device port only; no answer
// at all: ErrTimeout after the retries; cancelled: the context's error. Every slot is
// given back.
func TestResolveUDTimeoutAndCancel(t *testing.T) {
	r := newSIDRRig(t)
	peer := netip.MustParseAddrPort("127.0.0.1:40000")
	remote := netip.AddrPortFrom(peer.Addr(), testUDPort)
	done := make(chan error, 1)
	go func() {
		_, err := ResolveUD(resolveCtx(t), r.dev, remote, &ResolveParams{DevicePort: peer.Port(), ResponseTimeout: 5 * time.Millisecond, MaxRetries: 2})
		done <- err
	}()
	_, reqs := r.waitSent(t, mad.AttrSIDRREQ, 1)
	var req mad.SIDRREQ
	h, _ := mad.Decode(reqs[0], &req)
	r.handle(netip.AddrPortFrom(peer.Addr(), 4791), h.TID, &mad.SIDRREP{RequestID: req.RequestID, ServiceID: req.ServiceID, QPN: 9})
	if err := <-done; !errors.Is(err, ErrTimeout) {
		t.Fatalf("no answer: %v, want ErrTimeout", err)
	}
	if _, reqs := r.sent(mad.AttrSIDRREQ); len(reqs) != 3 {
		t.Errorf("%d requests sent, want 1 and 2 retries", len(reqs))
	}
	if d := r.dropped(); d != 1 {
		t.Errorf("an answer from another port than the softrnic listener's: %d dropped, want 1", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, err := ResolveUD(ctx, r.dev, remote, &ResolveParams{DevicePort: peer.Port()})
		done <- err
	}()
	r.waitSent(t, mad.AttrSIDRREQ, 4)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	if n := len(r.m.reqSlots); n != 0 {
		t.Errorf("%d request slots still taken", n)
	}
	if s := DeviceSIDRCounters(r.dev); s.Timeouts != 1 || s.REQSent != 2 || s.REQRetries != 2 {
		t.Errorf("counters %+v", s)
	}
}

// The listener's side: a standard peer's request (no mark) is answered at RoCEv2Port
// whatever port it came from, a softrnic device's (marked) at the port it came from; a
// request resent before the application answered reaches it once and is not answered
// (SIDR has no MRA); one resent after (the answer was lost) gets the same answer again;
// once the answer's time-wait is over it is forgotten. Requests for another port space,
// with no addressing header or for another address are answered "not supported", as is
// any with no listener.
func TestUDListenerDuplicatesAndChecks(t *testing.T) {
	old := sidrTimewait
	sidrTimewait = 50 * time.Millisecond
	t.Cleanup(func() { sidrTimewait = old })
	r := newSIDRRig(t)
	l, err := ListenUD(r.dev, testUDPort)
	if err != nil {
		t.Fatal(err)
	}
	e := newUDEnd(t, r.dev)
	linux := netip.MustParseAddrPort("127.0.0.1:55410")
	soft := netip.MustParseAddrPort("127.0.0.3:40000")
	mk := func(id uint32, from netip.AddrPort, mark uint16) *mad.SIDRREQ {
		req := &mad.SIDRREQ{RequestID: id, PKey: 0xFFFF, Reserved: mark, ServiceID: mad.UDPServiceID(testUDPort)}
		(&mad.CMAHeader{SrcPort: 33000, Src: from.Addr(), Dst: verbstest.IPB}).Put(req.PrivateData[:])
		copy(req.PrivateData[mad.CMAHeaderLen:], "data")
		return req
	}
	for i, c := range []struct {
		from, answerAt netip.AddrPort
		mark           uint16
	}{{linux, netip.AddrPortFrom(linux.Addr(), RoCEv2Port), 0}, {soft, soft, mad.SoftrnicSIDRMark}} {
		id := uint32(0x100 + i)
		req := mk(id, c.from, c.mark)
		r.handle(c.from, 77, req)
		r.handle(c.from, 77, req) // resent before the application answered
		ur, err := l.Accept(resolveCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(l.backlog) != 0 {
			t.Fatalf("a duplicate request reached the application")
		}
		if ur.Remote != c.answerAt || !bytes.HasPrefix(ur.PrivateData, []byte("data")) {
			t.Errorf("request from %v: Remote %v, want %v; private data %q", c.from, ur.Remote, c.answerAt, ur.PrivateData[:4])
		}
		if _, reps := r.sent(mad.AttrSIDRREP); len(reps) != 2*i {
			t.Fatalf("a request the application has not answered was answered")
		}
		if err := ur.Accept(e.qp, &UDAcceptParams{PrivateData: []byte("ok")}); err != nil {
			t.Fatal(err)
		}
		r.handle(c.from, 77, req) // the answer was lost
		to, reps := r.waitSent(t, mad.AttrSIDRREP, 2*(i+1))
		a, b := reps[2*i], reps[2*i+1]
		var rep mad.SIDRREP
		h, err := mad.Decode(a, &rep)
		if err != nil || !bytes.Equal(a, b) || to[2*i] != c.answerAt || to[2*i+1] != c.answerAt {
			t.Fatalf("answers to %v, %v: not the same twice to %v (%v)", to[2*i], to[2*i+1], c.answerAt, err)
		}
		if h.TID != 77 || rep.RequestID != id || rep.Status != mad.SIDRSuccess || rep.QPN != e.qp.QPNum() || rep.QKey != UDPQKey ||
			rep.ServiceID != mad.UDPServiceID(testUDPort) || string(rep.PrivateData[:2]) != "ok" {
			t.Errorf("SIDR_REP tid %d %+v", h.TID, rep)
		}
	}
	verbstest.WaitUntil(t, "the answered requests forgotten", func() bool {
		r.m.mu.Lock()
		defer r.m.mu.Unlock()
		return len(r.m.sidr.in) == 0
	})
	if s := DeviceSIDRCounters(r.dev); s.REQReceived != 2 || s.REQDuplicates != 4 || s.REPSent != 2 {
		t.Errorf("counters %+v", s)
	}

	_, before := r.sent(mad.AttrSIDRREP)
	tcp := mk(0x200, linux, 0)
	tcp.ServiceID = mad.ServiceID(testUDPort)
	noHdr := mk(0x201, linux, 0)
	noHdr.PrivateData[1] = 0x50 // IP version 5
	other := mk(0x202, linux, 0)
	(&mad.CMAHeader{SrcPort: 1, Src: linux.Addr(), Dst: netip.MustParseAddr("127.0.0.77")}).Put(other.PrivateData[:])
	noListener := mk(0x203, linux, 0)
	noListener.ServiceID = mad.UDPServiceID(testUDPort + 1)
	for _, q := range []*mad.SIDRREQ{tcp, noHdr, other, noListener} {
		r.handle(linux, 5, q)
	}
	to, reps := r.waitSent(t, mad.AttrSIDRREP, len(before)+4)
	for i, b := range reps[len(before):] {
		var rep mad.SIDRREP
		if _, err := mad.Decode(b, &rep); err != nil || rep.Status != mad.SIDRUnsupported || rep.RequestID != uint32(0x200+i) ||
			to[len(before)+i] != netip.AddrPortFrom(linux.Addr(), RoCEv2Port) {
			t.Errorf("request %#x: answered %+v at %v, want not supported", 0x200+i, rep, to[len(before)+i])
		}
	}
	if len(l.backlog) != 0 || r.dropped() != 0 {
		t.Errorf("%d requests in the backlog, %d dropped", len(l.backlog), r.dropped())
	}

	// Closing the listener answers what waits in the backlog; Accept then fails.
	r.handle(linux, 6, mk(0x300, linux, 0))
	l.Close()
	if _, err := l.Accept(resolveCtx(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
	_, reps = r.sent(mad.AttrSIDRREP)
	var rep mad.SIDRREP
	if _, err := mad.Decode(reps[len(reps)-1], &rep); err != nil || rep.RequestID != 0x300 || rep.Status != mad.SIDRUnsupported {
		t.Errorf("the request in the backlog at Close: answered %+v", rep)
	}
}

// A full backlog drops requests (the requester resends), counted; closing the device
// fails a waiting ResolveUD and Accept with ErrClosed.
func TestSIDRBacklogAndClose(t *testing.T) {
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: verbstest.IPB, Port: verbs.AnyPort})
	if err != nil {
		t.Fatal(err)
	}
	l, err := ListenUD(dev, testUDPort)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := managerFor(dev)
	from := netip.MustParseAddrPort("127.0.0.1:4791")
	for i := range Backlog + 3 {
		req := &mad.SIDRREQ{RequestID: uint32(i + 1), ServiceID: mad.UDPServiceID(testUDPort)}
		(&mad.CMAHeader{Src: from.Addr(), Dst: verbstest.IPB}).Put(req.PrivateData[:])
		var b [mad.Size]byte
		mad.Put(b[:], 1, req)
		m.HandleMAD(from, 1, b[:])
	}
	if s := DeviceCounters(dev); s.BacklogDrops != 3 || len(l.backlog) != Backlog {
		t.Errorf("%d backlog drops, %d in the backlog; want 3, %d", s.BacklogDrops, len(l.backlog), Backlog)
	}
	l2, err := ListenUD(dev, testUDPort+1)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() {
		_, err := l2.Accept(context.Background())
		errs <- err
	}()
	// To a socket that answers nothing (not even with ICMP port unreachable, as a closed
	// port would, which fails the resolution before the close): the request waits.
	sink, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 99)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	go func() {
		_, err := ResolveUD(context.Background(), dev, netip.MustParseAddrPort("127.0.0.99:7174"),
			&ResolveParams{ResponseTimeout: time.Hour, DevicePort: uint16(sink.LocalAddr().(*net.UDPAddr).Port)})
		errs <- err
	}()
	verbstest.WaitUntil(t, "the request sent", func() bool { return DeviceSIDRCounters(dev).REQSent == 1 })
	dev.Close()
	for range 2 {
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Errorf("after the device closed: %v, want ErrClosed", err)
		}
	}
}

// Under loss, duplication and reordering of every datagram, every resolution succeeds
// and the listener's application sees each request exactly once: lost requests and
// answers are resent, duplicates answered the same way.
func TestSIDRFaults(t *testing.T) {
	const n = 30
	faults := &verbs.Faults{Loss: 0.2, Dup: 0.1, Reorder: 0.1, Seed: 11}
	da, db := devs(t, verbs.DeviceConfig{Faults: faults})
	l, err := ListenUD(db, testUDPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b := newUDEnd(t, db)
	seen := make(chan []byte, 2*n)
	go func() {
		for {
			r, err := l.Accept(resolveCtx(t))
			if err != nil {
				return
			}
			seen <- r.PrivateData[:1]
			if err := r.Accept(b.qp, &UDAcceptParams{PrivateData: r.PrivateData[:1]}); err != nil {
				t.Errorf("Accept: %v", err)
			}
		}
	}()
	errs := make(chan error, n)
	for i := range n {
		go func() {
			rem, err := ResolveUD(resolveCtx(t), da, netip.AddrPortFrom(db.Addr().Addr(), testUDPort),
				&ResolveParams{PrivateData: []byte{byte(i)}, DevicePort: db.Addr().Port(), ResponseTimeout: 20 * time.Millisecond})
			if err == nil && (rem.QPN != b.qp.QPNum() || rem.PrivateData[0] != byte(i)) {
				err = errors.New("wrong answer")
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("ResolveUD: %v", err)
		}
	}
	got := map[byte]int{}
	for len(seen) > 0 {
		got[(<-seen)[0]]++
	}
	for i := range n {
		if got[byte(i)] != 1 {
			t.Errorf("request %d reached the application %d times", i, got[byte(i)])
		}
	}
	sa, sb := DeviceSIDRCounters(da), DeviceSIDRCounters(db)
	t.Logf("requester %+v; listener %+v", sa, sb)
	if sa.Resolved != n {
		t.Errorf("%d resolved, want %d", sa.Resolved, n)
	}
}

// FuzzHandleSIDR: hostile SIDR MADs from two senders (the device a resolution is waiting
// on, and a stranger) never panic, keep the state bounded by what arrived, answer only
// the senders with well-formed MADs, and a stranger's never end the resolution.
func FuzzHandleSIDR(f *testing.F) {
	const id = 0x5151
	put := func(who byte, tid uint64, m mad.Message) []byte {
		b := make([]byte, 1+mad.Size)
		b[0] = who
		mad.Put(b[1:], tid, m)
		return b
	}
	req := &mad.SIDRREQ{RequestID: 9, ServiceID: mad.UDPServiceID(testUDPort)}
	(&mad.CMAHeader{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2")}).Put(req.PrivateData[:])
	rep := &mad.SIDRREP{RequestID: id, ServiceID: mad.UDPServiceID(testUDPort), QPN: 0x42, QKey: UDPQKey}
	f.Add(put(0, 1, req))
	f.Add(append(put(0, 1, req), put(1, 1, req)...))
	f.Add(put(0, 7, rep))
	f.Add(append(put(1, 7, rep), put(0, 7, &mad.SIDRREP{RequestID: id, Status: 2})...))
	dev, _, _ := fuzzDevice(f)
	senders := [2]netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:4791"), netip.MustParseAddrPort("127.0.0.9:4791")}
	f.Fuzz(func(t *testing.T, data []byte) {
		port := &recordPort{local: netip.MustParseAddrPort("127.0.0.2:4791")}
		m := newManager(dev, port)
		st := m.sidrs()
		l := &UDListener{m: m, port: testUDPort, backlog: make(chan *sidrIn, 8), closed: make(chan struct{})}
		st.listeners[testUDPort] = l
		m.reqSlots <- struct{}{}
		o := &sidrOut{m: m, id: id, tid: 7, peer: senders[0], serviceID: mad.UDPServiceID(testUDPort), timeout: time.Hour, done: make(chan struct{})}
		st.out[id] = o
		defer func() {
			m.mu.Lock()
			m.closed = true
			m.closeSIDR()
			m.mu.Unlock()
		}()
		msgs, peerSent := 0, false
		for len(data) > mad.Size && msgs < 8 {
			from := senders[data[0]&1]
			m.HandleMAD(from, 1, data[1:1+mad.Size])
			data = data[1+mad.Size:]
			msgs++
			peerSent = peerSent || from == senders[0]
		}
		select {
		case <-o.done:
			if !peerSent {
				t.Fatalf("a stranger's MADs ended the resolution: %v", o.err)
			}
		default:
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if len(st.in) > msgs || len(l.backlog) > msgs || len(st.out) > 1 {
			t.Fatalf("%d messages left %d requests, %d in the backlog, %d resolutions", msgs, len(st.in), len(l.backlog), len(st.out))
		}
		port.mu.Lock()
		defer port.mu.Unlock()
		for _, s := range port.sent {
			if s.to.Addr() != senders[0].Addr() && s.to.Addr() != senders[1].Addr() {
				t.Fatalf("sent a MAD to %v, which sent nothing", s.to)
			}
			if _, err := mad.DecodeHeader(s.b); err != nil {
				t.Fatalf("sent a malformed MAD: %v", err)
			}
		}
	})
}
