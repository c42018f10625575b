package cm

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/verbs"
)

// Listener takes connection requests for one service port of a device (rdma_listen).
type Listener struct {
	m       *manager
	port    uint16
	backlog chan *conn
	closed  chan struct{}
	isClose bool
}

// Listen starts taking connection requests for port (the service ID 0x01060000 | port, as
// rdma_cm's TCP port space) at dev. A port has one listener per device.
func Listen(dev *verbs.Device, port uint16) (_ *Listener, err error) {
	defer nameCall("Listen", &err)
	return addListener(dev, port, "Listen", "",
		func(m *manager) map[uint16]*Listener { return m.listeners },
		func(m *manager) *Listener {
			return &Listener{m: m, port: port, backlog: make(chan *conn, Backlog), closed: make(chan struct{})}
		})
}

// addListener makes a listener for port with newL and enters it in the listener table
// of one port space of dev's connection manager (table, read with mu held): what Listen
// and ListenUD share. A port has one listener per device and port space; op names the
// caller and space the port space ("UDP " or "") in errors.
func addListener[L comparable](dev *verbs.Device, port uint16, op, space string,
	table func(*manager) map[uint16]L, newL func(*manager) L) (L, error) {
	var none L
	m, err := managerFor(dev)
	if err != nil {
		return none, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return none, errDeviceClosed
	}
	t := table(m)
	if t[port] != none {
		return none, fmt.Errorf("cm: %s: %sport %d already has a listener on %v", op, space, port, m.local)
	}
	l := newL(m)
	t[port] = l
	return l, nil
}

// Addr is the listener's device address with the service port.
func (l *Listener) Addr() netip.AddrPort { return netip.AddrPortFrom(l.m.local.Addr(), l.port) }

// Close stops the listener: pending and later Accepts return ErrClosed, requests not yet
// accepted are rejected, and new ones are rejected as having no listener. It returns at
// once: it waits for no peer (connections already accepted are not touched).
func (l *Listener) Close() error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	l.closeLocked()
	return nil
}

func (l *Listener) closeLocked() {
	closeListener(l, l.port, l.m.listeners, &l.isClose, l.closed, l.backlog, func(c *conn) {
		if c.state == stReqRcvd || c.state == stMRASent {
			c.reject(mad.RejInvalidServiceID, nil)
		}
	})
}

// closeListener closes a listener l of either port space (mu held), once: it marks it
// closed (isClose, and closed, which ends its Accepts), takes it out of its port space's
// table if it is still port's listener there, and hands each request left in its backlog
// to drop, which tells the requester that nothing listens (in that port space's words).
func closeListener[L comparable, R any](l L, port uint16, table map[uint16]L, isClose *bool, closed chan struct{},
	backlog chan R, drop func(R)) {
	if *isClose {
		return
	}
	*isClose = true
	close(closed)
	if table[port] == l {
		delete(table, port)
	}
	for {
		select {
		case r := <-backlog:
			drop(r)
		default:
			return
		}
	}
}

// Request is a connection request taken by Accept: answer it with Accept or Reject.
type Request struct {
	c *conn
	// Remote is the requesting device's address and UDP port; RemoteQPN its QP.
	Remote    netip.AddrPort
	RemoteQPN uint32
	// PrivateData is the requester's private data (56 bytes, zero-padded).
	PrivateData []byte
	// MTU, MaxRdAtomic and Ordering are what the requester offers.
	MTU         verbs.MTU
	MaxRdAtomic uint8
	Ordering    verbs.Ordering
}

// Accept returns the next connection request, waiting for one until ctx is done or the
// listener is closed (ErrClosed).
func (l *Listener) Accept(ctx context.Context) (_ *Request, err error) {
	defer nameCall("Accept", &err)
	if err := ctx.Err(); err != nil {
		return nil, err // an ended context takes no request, even one already waiting
	}
	for {
		select {
		case c := <-l.backlog:
			m := l.m
			m.mu.Lock()
			live := c.state == stReqRcvd || c.state == stMRASent
			m.mu.Unlock()
			if !live {
				continue // the requester gave up while it waited
			}
			r := &Request{c: c, Remote: c.peer, RemoteQPN: c.req.LocalQPN,
				PrivateData: append([]byte(nil), c.req.PrivateData[mad.CMAHeaderLen:]...),
				MTU:         verbs.MTU(c.req.PathMTU), MaxRdAtomic: c.req.ResponderResources}
			if e := parseExt(c.req.LocalEECN); e.weak {
				r.Ordering = verbs.OrderingWeak
			}
			return r, nil
		case <-l.closed:
			if l.m.isClosed() {
				return nil, errDeviceClosed
			}
			return nil, errListenerClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// onREQ: a connection request, new or resent (mu held).
func (m *manager) onREQ(src netip.AddrPort, tid uint64, r *mad.REQ) bool {
	soft := parseExt(r.LocalEECN).ok
	src = peerOf(src, soft)
	if soft {
		// A softrnic device's CA GUID is its incarnation: a new one at src ends the
		// connections made with the old one, before this request is looked at.
		m.seeIncarnation(src, r.LocalCAGUID)
	}
	if c := m.byRemote[remoteKey{src, r.LocalCommID}]; c != nil {
		m.stats.REQDuplicates++
		switch c.state {
		case stReqRcvd, stMRASent:
			// The application has not answered yet: ask the requester to wait.
			c.state = stMRASent
			m.stats.MRASent++
			m.sendOnce(src, c.tid, &mad.MRA{LocalCommID: c.id, RemoteCommID: c.remoteID, MessageMRAed: mad.MsgREQ, ServiceTimeout: mraServiceTimeout})
		case stRepSent:
			c.resend()
		case stTimewait:
			if c.msgAttr == mad.AttrREJ {
				c.resend()
			}
		}
		return true
	}
	port, ok := mad.ServicePort(r.ServiceID)
	hdr, herr := mad.DecodeCMAHeader(r.PrivateData[:])
	if r.TransportType != mad.TransportRC || r.LocalQPN <= 1 || r.LocalCommID == 0 {
		m.rejectREQ(src, tid, r, mad.RejInvalidTransportType, nil)
		return true
	}
	l := m.listeners[port]
	if !ok || herr != nil || l == nil || (hdr.Dst.IsValid() && !m.local.Addr().IsUnspecified() && hdr.Dst.Unmap() != m.local.Addr()) {
		m.rejectREQ(src, tid, r, mad.RejInvalidServiceID, nil)
		return true
	}
	if !validMTU(verbs.MTU(r.PathMTU)) {
		m.rejectREQ(src, tid, r, mad.RejInvalidMTU, nil)
		return true
	}
	if old := m.byQP[remoteKey{src, r.LocalQPN}]; old != nil {
		// The peer's QP is connected here under another communication ID: it was
		// reused (the peer restarted). Reject the request as stale, and end the old
		// connection (IBTA 12.9.8.3.2).
		m.stats.StaleRejects++
		m.rejectREQ(src, tid, r, mad.RejStaleConn, nil)
		old.logEvent(slog.LevelWarn, evClosed, "the peer's QP asked to connect again: the connection is stale")
		old.toErr()
		old.end(ErrDisconnected)
		old.state = stDreqSent
		old.retries = 0
		old.sendDREQ()
		old.arm(old.timeout)
		delete(m.byQP, remoteKey{src, r.LocalQPN})
		m.detachPeer(old)
		return true
	}
	c := m.newConn(false, src)
	c.softPeer = soft
	c.tid = tid
	c.remoteID, c.peerQPN, c.req, c.state = r.LocalCommID, r.LocalQPN, *r, stReqRcvd
	c.timeout = clampWait(codeDuration(r.LocalCMResponseTimeout))
	c.maxRetries = int(r.MaxCMRetries)
	select {
	case l.backlog <- c:
		m.byRemote[remoteKey{src, r.LocalCommID}] = c
		if soft {
			c.setPeerInc(r.LocalCAGUID)
		}
	default:
		m.stats.BacklogDrops++
		delete(m.ids, c.id) // the requester resends
	}
	return true
}

// requester returns the passive connection a requester at src opened with its
// communication ID id, if any (mu held).
func (m *manager) requester(src netip.AddrPort, id uint32) *conn {
	if c := m.byRemote[remoteKey{src, id}]; c != nil && c.from(src) {
		return c
	}
	if c := m.byRemote[remoteKey{peerOf(src, false), id}]; c != nil && c.from(src) {
		return c
	}
	return nil
}

// mraServiceTimeout is the wait an MRA asks for: 4.096 µs × 2^22, 17 s.
const mraServiceTimeout = 22

// targetACKDelay is the REP's Target ACK Delay code, the longest this side takes to
// acknowledge (4.096 µs × 2^t). A Linux requester adds it into its QP's local ACK
// timeout; 15 (134 ms) is what rxe reports as its local_ca_ack_delay, so a Linux peer's
// QP times out as it would against rxe.
const targetACKDelay = 15

// rejectREQ answers a request that created no connection (mu held).
func (m *manager) rejectREQ(src netip.AddrPort, tid uint64, r *mad.REQ, reason uint16, data []byte) {
	m.stats.REJSent++
	logEvent(m.dev.Logger(), slog.LevelWarn, evRejectedRequest, m.local, src, 0, r.LocalQPN, RejectReason(reason).String())
	rej := mad.REJ{RemoteCommID: r.LocalCommID, MessageRejected: mad.MsgREQ, Reason: reason}
	copy(rej.PrivateData[:], data)
	m.sendOnce(src, tid, &rej)
}

// reject rejects a request that is waiting for the application (mu held).
func (c *conn) reject(reason uint16, data []byte) {
	rej := mad.REJ{LocalCommID: c.id, RemoteCommID: c.remoteID, MessageRejected: mad.MsgREQ, Reason: reason}
	copy(rej.PrivateData[:], data)
	c.m.stats.REJSent++
	level := slog.LevelWarn
	if reason == mad.RejConsumerReject {
		level = slog.LevelInfo // the application's choice, not a failure
	}
	c.logEvent(level, evRejectedRequest, RejectReason(reason).String())
	c.keep(&rej) // kept: a resent REQ gets the same answer
	c.finish(ErrState)
	c.timewait()
}

// Reject refuses the request with "consumer reject" and private data (at most 148
// bytes), as rdma_reject does: Dial returns a *RejectError carrying it.
func (r *Request) Reject(privateData []byte) (err error) {
	defer nameCall("Reject", &err)
	if len(privateData) > mad.RejectPrivateMax {
		return fmt.Errorf("%w: %d bytes, a reject carries at most %d", ErrPrivateData, len(privateData), mad.RejectPrivateMax)
	}
	c := r.c
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.state != stReqRcvd && c.state != stMRASent {
		return fmt.Errorf("cm: Reject: the request was already answered or withdrawn: %w", ErrState)
	}
	c.reject(mad.RejConsumerReject, privateData)
	return nil
}

// AcceptParams are what Accept answers with; every field may be left zero.
type AcceptParams struct {
	// PrivateData goes to the requester with the reply (at most 196 bytes).
	PrivateData []byte
	// Options are this side's QP attributes (verbs.ConnectOptions). MTU 0 takes the
	// requester's, if the device's active MTU allows it; a smaller one (or a smaller
	// active MTU) is used if the requester is a softrnic device, else the request is
	// rejected with ReasonInvalidMTU (IB CM cannot lower a standard peer's path MTU). MaxRdAtomic is lowered to what the
	// requester offers; Ordering weak is used only if the requester offers it too.
	// RetryCnt and RNRRetry come from the requester, as with IB CM, and so does Timeout
	// unless it is set here (the REQ's local ACK timeout for the path).
	Options verbs.ConnectOptions
	// KeepAlive is how often the peer device is probed once connected
	// (DefaultKeepAlive; negative: never).
	KeepAlive time.Duration
	// Logger, if set, receives the connection's events (established, closed, failed)
	// instead of the device's logger (verbs.DeviceConfig.Logger).
	Logger *slog.Logger
}

// Accept connects qp (an RC QP of the listener's device in RESET or INIT) to the
// requester, as rdma_accept does: the QP goes to RTS, the reply is sent, and Accept
// returns once ReadyToUse came. ErrTimeout if it did not after the requester's number of
// CM retries; a *RejectError if the requester gave up.
func (r *Request) Accept(qp *verbs.QP, p *AcceptParams) (_ *Conn, err error) {
	defer nameCall("Accept", &err)
	if p == nil {
		p = &AcceptParams{}
	}
	if len(p.PrivateData) > mad.AcceptPrivateMax {
		return nil, fmt.Errorf("%w: %d bytes, an accept carries at most %d", ErrPrivateData, len(p.PrivateData), mad.AcceptPrivateMax)
	}
	c := r.c
	m := c.m
	if err := checkQP(m.dev, qp); err != nil {
		return nil, err
	}
	userMTU := p.Options.MTU
	o := p.Options.WithDefaults()
	m.mu.Lock()
	if c.state != stReqRcvd && c.state != stMRASent {
		m.mu.Unlock()
		return nil, fmt.Errorf("cm: Accept: the request was already answered or withdrawn: %w", ErrState)
	}
	req := &c.req
	e := parseExt(req.LocalEECN)
	mtu := verbs.MTU(req.PathMTU)
	limit, why := userMTU, "the accept's"
	if port, _ := m.dev.QueryPort(1); limit == 0 || port.ActiveMTU < limit {
		limit, why = port.ActiveMTU, "the device's active"
	}
	if limit < mtu {
		if !e.ok {
			// IB CM has no field for a REP to lower the path MTU: a standard requester
			// uses its own (Linux's passive side fails its QP's RTR transition then).
			c.reject(mad.RejInvalidMTU, nil)
			m.mu.Unlock()
			return nil, fmt.Errorf("cm: Accept: the requester's path MTU %d is above %s MTU %d, and a standard peer cannot lower it", mtu.Bytes(), why, limit.Bytes())
		}
		mtu = limit
	}
	o.MTU = mtu
	o.MaxRdAtomic = min(o.MaxRdAtomic, req.ResponderResources, req.InitiatorDepth)
	o.RetryCnt, o.RNRRetry = req.RetryCount, req.RNRRetryCount
	if p.Options.Timeout == 0 && p.Options.Zero&verbs.ZeroTimeout == 0 && req.Primary.LocalACKTimeout != 0 {
		// As Linux's passive side: the QP's local ACK timeout is the one the requester
		// computed for the path (rdma_cm on RoCE sends 19, 2.1 s).
		o.Timeout = req.Primary.LocalACKTimeout
	}
	// A standard peer (no softrnic extension) sends its QP's packets from a source port of
	// its own: only its address is checked.
	// Starting PSNs as Linux's CM has them: the REP's is the PSN this side receives first
	// (drawn here), the REQ's the one it sends first (the requester drew it to receive).
	rqPSN := verbs.RandomPSN()
	remote := verbs.Endpoint{GID: verbs.GIDFromAddr(c.peer.Addr()), Port: c.peer.Port(), QPNum: req.LocalQPN, PSN: rqPSN,
		AnySourcePort: !e.ok}
	c.ordering = verbs.OrderingOrdered
	maxHole := uint32(0)
	if e.weak && o.Ordering == verbs.OrderingWeak {
		maxHole = min(e.maxHole, orDefault(o.MaxHole, verbs.DefaultMaxHole))
		remote.Ordering, remote.MaxHole = verbs.OrderingWeak, maxHole
		c.ordering = verbs.OrderingWeak
	} else {
		o.Ordering = verbs.OrderingOrdered
	}
	repRNR := p.Options.WithDefaults().RNRRetry
	zeroes(&o)
	// A QP in INIT keeps its access (InitQP's) unless the options set one.
	o.Access, o.NoRemoteAccess = p.Options.Access, p.Options.NoRemoteAccess
	if err := qp.Connect(req.StartingPSN, remote, o); err != nil {
		c.reject(mad.RejNoQP, nil)
		m.mu.Unlock()
		return nil, fmt.Errorf("cm: Accept: configuring QP %#x: %w", qp.QPNum(), err)
	}
	c.qp = qp
	c.keepAlive = keepAliveOr(p.KeepAlive)
	c.log = p.Logger
	c.peerData = r.PrivateData
	rep := mad.REP{LocalCommID: c.id, RemoteCommID: c.remoteID, LocalQPN: qp.QPNum(), StartingPSN: rqPSN,
		ResponderResources: o.MaxRdAtomic, InitiatorDepth: o.MaxRdAtomic, RNRRetryCount: repRNR & 7,
		TargetACKDelay: targetACKDelay, LocalCAGUID: m.guid}
	if e.ok {
		// The extension answers a softrnic requester only: a standard one gets the
		// REP's Local EECN as IBTA has it for RC, zero.
		rep.LocalEECN = ext(c.ordering, maxHole, mtu)
	}
	if _, init := qp.QueryQP(); init.SRQ != nil {
		rep.SRQ = true
	}
	copy(rep.PrivateData[:], p.PrivateData)
	c.state = stRepSent
	c.retries = 0
	m.stats.REPSent++
	c.keep(&rep)
	c.arm(c.timeout)
	m.mu.Unlock()
	<-c.ready
	if c.readyErr != nil {
		return nil, c.readyErr
	}
	return newConn(c), nil
}

func orDefault(v, d uint32) uint32 {
	if v == 0 {
		return d
	}
	return v
}

// onRTU: the requester is ready; the connection is established (mu held).
func (m *manager) onRTU(src netip.AddrPort, r *mad.RTU) bool {
	c := m.lookup(src, r.RemoteCommID)
	if c == nil || c.active || r.LocalCommID != c.remoteID {
		return false
	}
	if c.state == stRepSent {
		c.establish()
	}
	return true
}
