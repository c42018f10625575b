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

// DialParams are what Dial offers; every field may be left zero.
type DialParams struct {
	// PrivateData goes to the listener with the request (at most 56 bytes).
	PrivateData []byte
	// DevicePort is the peer device's UDP port (0: 4791, the RoCEv2 port).
	DevicePort uint16
	// Options are the QP attributes this side wants (verbs.ConnectOptions; zero
	// fields take its defaults; MTU 0 is the device's active MTU, as rdma_cm takes the
	// link's). MTU, MaxRdAtomic and Ordering are offers that the
	// peer may lower; RetryCnt and RNRRetry are also the values the listener's QP uses.
	Options verbs.ConnectOptions
	// ResponseTimeout is how long to wait for the listener's answer before resending
	// the request (DefaultResponseTimeout); MaxRetries how many times to resend
	// (DefaultMaxRetries; at most 15, the field's limit; negative: none).
	ResponseTimeout time.Duration
	MaxRetries      int
	// KeepAlive is how often the peer device is probed once connected
	// (DefaultKeepAlive; negative: never, and a vanished peer goes unnoticed).
	KeepAlive time.Duration
	// Logger, if set, receives the connection's events (established, rejected, closed,
	// failed) instead of the device's logger (verbs.DeviceConfig.Logger).
	Logger *slog.Logger
}

func (p *DialParams) retries() int {
	switch {
	case p.MaxRetries < 0:
		return 0
	case p.MaxRetries == 0:
		return DefaultMaxRetries
	}
	return min(p.MaxRetries, 15)
}

func keepAliveOr(d time.Duration) time.Duration {
	if d == 0 {
		return DefaultKeepAlive
	}
	return d
}

// InitQP moves an RC QP from RESET to INIT with the given remote access, so that
// receives can be posted before Dial or Accept (as rdma_create_qp leaves a QP). Dial and
// Accept keep that access unless their Options set Access or NoRemoteAccess, which
// replace it: InitQP(qp, 0) and then Accept(qp, nil) gives the peer no remote access.
func InitQP(qp *verbs.QP, access verbs.AccessFlags) error {
	return qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateInit, PortNum: 1, QPAccessFlags: access},
		verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags)
}

// checkQP checks that qp is an RC QP of dev in RESET or INIT.
func checkQP(dev *verbs.Device, qp *verbs.QP) error {
	if qp == nil {
		return fmt.Errorf("cm: %w: nil QP", verbs.ErrInvalid)
	}
	if qp.PD().Device() != dev {
		return fmt.Errorf("cm: %w: QP %#x belongs to another device", verbs.ErrInvalid, qp.QPNum())
	}
	_, init := qp.QueryQP()
	if init.QPType != verbs.QPTypeRC {
		return fmt.Errorf("cm: %w: QP %#x is %v: only RC QPs are connected", verbs.ErrInvalid, qp.QPNum(), init.QPType)
	}
	if s := qp.State(); s != verbs.StateReset && s != verbs.StateInit {
		return fmt.Errorf("cm: QP %#x is in %v, not RESET or INIT: %w", qp.QPNum(), s, ErrState)
	}
	return nil
}

// requestManager checks what Dial and ResolveUD are given alike, the private data (at
// most max bytes: what, a connect or a resolution, carries no more) and the remote
// address, and returns dev's connection manager. op names the caller in errors.
func requestManager(dev *verbs.Device, op string, remote netip.AddrPort, private []byte, max int, what string) (*manager, error) {
	if len(private) > max {
		return nil, fmt.Errorf("%w: %d bytes, %s carries at most %d", ErrPrivateData, len(private), what, max)
	}
	if !remote.Addr().IsValid() {
		return nil, fmt.Errorf("cm: %s: %w: address %v", op, verbs.ErrInvalid, remote)
	}
	return managerFor(dev)
}

// peerDevice is the address of the device a request to remote goes to: remote's address
// (IPv4 unmapped) at devPort, the peer device's UDP port (0: RoCEv2Port).
func peerDevice(remote netip.AddrPort, devPort uint16) netip.AddrPort {
	if devPort == 0 {
		devPort = RoCEv2Port
	}
	return netip.AddrPortFrom(remote.Addr().Unmap(), devPort)
}

// responseTimeout is how long a request waits for its answer before it is resent: d, or
// DefaultResponseTimeout if d is not above zero.
func responseTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultResponseTimeout
	}
	return d
}

// takeREQSlot waits for a turn to send a request (a connection request or a resolution):
// at most MaxREQInFlight wait for an answer per device. The slot is given back when the
// request is answered or given up; the error is ctx's, with no slot taken.
func (m *manager) takeREQSlot(ctx context.Context) error {
	select {
	case m.reqSlots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Dial connects qp (an RC QP of dev in RESET or INIT) to the listener on remote's port
// at the device with remote's address, as rdma_connect does. It returns when the QP is
// in RTS and ReadyToUse was sent, with the listener's private data, or with an error:
// a *RejectError (errors.Is ErrRejected, ErrNoListener for no listener), ErrTimeout
// (no answer after the retries), ErrPeerUnreachable (Linux: the host at remote's address
// reports that nothing is bound to the device port, within the first request's round
// trip; see unreach.go), the context's error, ErrClosed (the device was closed), or a
// check of the arguments (ErrPrivateData, ErrState, verbs.ErrInvalid); each names Dial
// ("cm: Dial: ..."). On error the QP is left in INIT (reject, timeout, unreachable,
// cancellation) and may dial again.
func Dial(ctx context.Context, dev *verbs.Device, remote netip.AddrPort, qp *verbs.QP, p *DialParams) (_ *Conn, err error) {
	defer nameCall("Dial", &err)
	if p == nil {
		p = &DialParams{}
	}
	m, err := requestManager(dev, "Dial", remote, p.PrivateData, mad.CMAPrivateMax, "a connect")
	if err != nil {
		return nil, err
	}
	if err := checkQP(dev, qp); err != nil {
		return nil, err
	}
	o := p.Options.WithDefaults()
	port, _ := dev.QueryPort(1)
	if p.Options.MTU == 0 {
		o.MTU = port.ActiveMTU // as rdma_cm's route: the link's
	}
	if !validMTU(o.MTU) {
		return nil, fmt.Errorf("cm: Dial: %w: %v", verbs.ErrInvalid, o.MTU)
	}
	if o.MTU > port.ActiveMTU {
		return nil, fmt.Errorf("cm: Dial: path MTU %d is above the device's active MTU %d (link MTU %d): %w",
			o.MTU.Bytes(), port.ActiveMTU.Bytes(), port.LinkMTU, verbs.ErrInvalid)
	}
	if qp.State() == verbs.StateReset {
		if err := InitQP(qp, o.Access); err != nil {
			return nil, err
		}
	}
	// The QP is in INIT: Connect keeps its access unless the options set one.
	o.Access, o.NoRemoteAccess = p.Options.Access, p.Options.NoRemoteAccess
	peer := peerDevice(remote, p.DevicePort)
	if err := m.takeREQSlot(ctx); err != nil {
		return nil, err
	}
	timeout := responseTimeout(p.ResponseTimeout)
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		<-m.reqSlots
		return nil, errDeviceClosed
	}
	c := m.newConn(true, peer)
	c.holdsSlot = true
	c.qp, c.params, c.timeout, c.maxRetries, c.keepAlive = qp, o, timeout, p.retries(), keepAliveOr(p.KeepAlive)
	c.log = p.Logger
	// Starting PSNs as Linux's CM has them: the REQ's is the PSN this side receives
	// first, the REP's the one it sends first.
	rqPSN := verbs.RandomPSN()
	local := m.local.Addr()
	req := mad.REQ{
		LocalCommID: c.id, ServiceID: mad.ServiceID(remote.Port()), LocalCAGUID: m.guid,
		LocalQPN: qp.QPNum(), ResponderResources: o.MaxRdAtomic, InitiatorDepth: o.MaxRdAtomic,
		LocalEECN:               ext(o.Ordering, o.MaxHole, o.MTU),
		RemoteCMResponseTimeout: timeoutCode(timeout), LocalCMResponseTimeout: timeoutCode(timeout),
		TransportType: mad.TransportRC, StartingPSN: rqPSN, RetryCount: o.RetryCnt & 7, RNRRetryCount: o.RNRRetry & 7,
		PKey: 0xFFFF, PathMTU: uint8(o.MTU), MaxCMRetries: uint8(c.maxRetries),
		Primary: mad.Path{LocalLID: 0xFFFF, RemoteLID: 0xFFFF, LocalGID: mad.GID(local), RemoteGID: mad.GID(peer.Addr()),
			HopLimit: 64, LocalACKTimeout: o.Timeout & 0x1F},
	}
	if _, init := qp.QueryQP(); init.SRQ != nil {
		req.SRQ = true
	}
	h := mad.CMAHeader{SrcPort: m.local.Port(), Src: local, Dst: peer.Addr()}
	h.Put(req.PrivateData[:])
	copy(req.PrivateData[mad.CMAHeaderLen:], p.PrivateData)
	c.req = req
	c.sendREQ()
	m.mu.Unlock()

	select {
	case <-c.ready:
	case <-ctx.Done():
		m.mu.Lock()
		if !c.readyDone {
			// Give up: tell the listener, so that it keeps nothing half-open.
			m.stats.REJSent++
			c.keep(&mad.REJ{LocalCommID: c.id, RemoteCommID: c.remoteID, MessageRejected: mad.MsgREQ, Reason: mad.RejTimeout})
			c.finish(ctx.Err())
			c.end(ctx.Err())
			c.timewait()
		} else if c.readyErr == nil {
			// Established just now: undo, the caller gets the context's error.
			c.toErr()
			c.state = stDreqSent
			c.sendDREQ()
			c.arm(c.timeout)
			c.end(ctx.Err())
		}
		m.mu.Unlock()
		return nil, ctx.Err()
	}
	if c.readyErr != nil {
		return nil, c.readyErr
	}
	return newConn(c), nil
}

// sendREQ sends the request and arms its timer (mu held).
func (c *conn) sendREQ() {
	c.state = stReqSent
	c.m.stats.REQSent++
	c.keep(&c.req)
	c.arm(c.timeout)
}

// onREP: the listener accepted. Configure the QP from the negotiated parameters, move it
// to RTS and send RTU. A duplicate REP (our RTU was lost) gets the RTU again (mu held).
func (m *manager) onREP(src netip.AddrPort, r *mad.REP) bool {
	c := m.lookup(src, r.RemoteCommID)
	if c == nil || !c.active {
		return false
	}
	switch c.state {
	case stReqSent:
	case stEstablished, stDreqSent, stTimewait:
		if r.LocalCommID == c.remoteID && c.state == stEstablished {
			m.stats.RTUSent++
			m.sendOnce(c.peer, c.tid, &mad.RTU{LocalCommID: c.id, RemoteCommID: c.remoteID})
			return true
		}
		return false
	default:
		return false
	}
	if r.LocalQPN == 0 || r.LocalQPN == 1 {
		return false
	}
	e := parseExt(r.LocalEECN)
	if e.ok && src != c.peer {
		return false // a softrnic device answers from the port it was dialled at
	}
	if e.ok {
		// Its CA GUID is its incarnation: a new one at this address ends the
		// connections made with the old one (incarnation.go).
		m.seeIncarnation(src, r.LocalCAGUID)
		c.setPeerInc(r.LocalCAGUID)
	}
	c.remoteID, c.peerQPN = r.LocalCommID, r.LocalQPN
	c.peerData = append([]byte(nil), r.PrivateData[:]...)
	o := c.params
	c.softPeer = e.ok
	if e.ok && validMTU(e.mtu) && e.mtu < o.MTU {
		o.MTU = e.mtu
	}
	o.MaxRdAtomic = min(o.MaxRdAtomic, r.ResponderResources)
	o.RNRRetry = r.RNRRetryCount
	// A standard peer (no softrnic extension) sends its QP's packets from a source port of
	// its own: only its address is checked.
	remote := verbs.Endpoint{GID: verbs.GIDFromAddr(c.peer.Addr()), Port: c.peer.Port(), QPNum: r.LocalQPN, PSN: c.req.StartingPSN,
		AnySourcePort: !e.ok}
	if e.weak && o.Ordering == verbs.OrderingWeak {
		remote.Ordering, remote.MaxHole = verbs.OrderingWeak, e.maxHole
		c.ordering = verbs.OrderingWeak
	} else {
		o.Ordering = verbs.OrderingOrdered
	}
	zeroes(&o)
	if err := c.qp.Connect(r.StartingPSN, remote, o); err != nil {
		c.logEvent(slog.LevelWarn, evFailed, fmt.Sprintf("configuring the QP from the peer's reply: %v", err))
		rej := mad.REJ{LocalCommID: c.id, RemoteCommID: c.remoteID, MessageRejected: mad.MsgREP, Reason: mad.RejNoQP}
		m.stats.REJSent++
		c.keep(&rej)
		c.finish(fmt.Errorf("cm: Dial: configuring QP %#x: %w", c.qp.QPNum(), err))
		c.timewait()
		return true
	}
	m.stats.RTUSent++
	m.sendOnce(c.peer, c.tid, &mad.RTU{LocalCommID: c.id, RemoteCommID: c.remoteID})
	c.establish()
	return true
}

// onMRA: the peer needs more time; wait its service timeout on top of ours (mu held).
func (m *manager) onMRA(src netip.AddrPort, r *mad.MRA) bool {
	c := m.lookup(src, r.RemoteCommID)
	if c == nil {
		return false
	}
	m.stats.MRAReceived++
	switch {
	case c.active && c.state == stReqSent && r.MessageMRAed == mad.MsgREQ:
	case !c.active && c.state == stRepSent && r.MessageMRAed == mad.MsgREP && r.LocalCommID == c.remoteID:
	default:
		return false
	}
	c.arm(clampWait(codeDuration(r.ServiceTimeout) + c.timeout))
	return true
}

// onREJ: the peer rejected our REQ or REP, or gave up on the connection (mu held).
func (m *manager) onREJ(src netip.AddrPort, r *mad.REJ) bool {
	c := m.lookup(src, r.RemoteCommID)
	if c == nil {
		// A requester that gives up before it learned our ID names its own.
		if c = m.requester(src, r.LocalCommID); c == nil || r.RemoteCommID != 0 {
			return false
		}
	}
	if c.remoteID != 0 && r.LocalCommID != c.remoteID {
		return false
	}
	m.stats.REJReceived++
	err := &RejectError{Reason: RejectReason(r.Reason), PrivateData: append([]byte(nil), r.PrivateData[:]...)}
	switch c.state {
	case stReqSent, stRepSent:
		c.logEvent(slog.LevelWarn, evRejected, err.Reason.String())
	case stEstablished:
		c.logEvent(slog.LevelWarn, evClosed, "the peer gave up on it: "+err.Reason.String())
	}
	switch c.state {
	case stReqSent:
		c.finish(err)
		c.forget()
	case stReqRcvd, stMRASent:
		c.finish(err)
		c.forget() // Accept skips it
	case stRepSent:
		c.toErr()
		c.finish(err)
		c.timewait()
	case stEstablished:
		// A REJ after RTU: the peer timed out waiting for something we sent; the
		// connection is gone for it.
		c.toErr()
		c.end(ErrDisconnected)
		c.timewait()
	default:
		return false
	}
	return true
}
