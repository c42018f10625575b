package cm

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/verbs"
)

// Service ID resolution (SIDR): rdma_cm's UDP port space (RDMA_PS_UDP). There is no
// connection: ResolveUD (rdma_connect on a UDP id) asks the peer device's CM which UD QP
// serves a port, and gets its QP number and Q_Key (RDMA_CM_EVENT_ESTABLISHED with the
// "ud" parameters); a UDListener (rdma_listen on a UDP id) takes those requests and
// answers each with a UD QP (rdma_accept) or a reject (rdma_reject).

// UDPQKey is the Q_Key of every UD QP of rdma_cm's UDP port space (RDMA_UDP_QKEY). A
// Linux peer answers with it, and a Linux requester refuses an answer with another.
const UDPQKey = mad.UDPQKey

// SIDRStatus is the status of a ServiceIDResolutionResponse (IBTA Table 120).
type SIDRStatus uint8

// The statuses. Linux answers SIDRUnsupported when nothing listens on the port and
// SIDRReject for rdma_reject.
const (
	SIDRUnsupported        SIDRStatus = mad.SIDRUnsupported
	SIDRReject             SIDRStatus = mad.SIDRReject
	SIDRNoQP               SIDRStatus = mad.SIDRNoQP
	SIDRRedirect           SIDRStatus = mad.SIDRRedirect
	SIDRUnsupportedVersion SIDRStatus = mad.SIDRUnsupportedVersion
)

var sidrStatusNames = map[SIDRStatus]string{
	SIDRUnsupported: "service ID not supported (no listener)", SIDRReject: "rejected by the service",
	SIDRNoQP: "no QP", SIDRRedirect: "redirect", SIDRUnsupportedVersion: "class version not supported",
}

func (s SIDRStatus) String() string {
	if n, ok := sidrStatusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("status %d", uint8(s))
}

// SIDRError is the error of a resolution the peer answered with a status other than
// success: the status, and the private data the answer carried (the whole field, 136
// bytes, as rdma_cm gives it).
type SIDRError struct {
	Status      SIDRStatus
	PrivateData []byte
}

func (e *SIDRError) Error() string { return "cm: service ID resolution failed: " + e.Status.String() }

// Is makes errors.Is(err, ErrRejected) true for every status, and ErrNoListener for
// SIDRUnsupported, as for a *RejectError.
func (e *SIDRError) Is(target error) bool {
	switch target {
	case ErrRejected:
		return true
	case ErrNoListener:
		return e.Status == SIDRUnsupported
	}
	return false
}

// SIDRCounters count a device's service ID resolutions. MADs that were malformed or
// matched nothing count in Counters.Dropped, requests a full backlog dropped in
// Counters.BacklogDrops, as for connections.
type SIDRCounters struct {
	// Requester side: requests sent, resent after the response timeout, answered
	// (Resolved: with success; Failed: with another status), given up (Timeouts).
	REQSent, REQRetries, Resolved, Failed, Timeouts uint64
	// Listener side: requests taken, duplicates (answered again if answered), replies
	// sent (the first time; Unsupported counts those for no listener).
	REQReceived, REQDuplicates, REPSent, Unsupported uint64
}

// DeviceSIDRCounters returns the SIDR counters of dev's connection manager (zero if it has none).
func DeviceSIDRCounters(dev *verbs.Device) SIDRCounters {
	managersMu.Lock()
	m := managers[dev]
	managersMu.Unlock()
	if m == nil {
		return SIDRCounters{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sidr == nil {
		return SIDRCounters{}
	}
	return m.sidr.stats
}

// sidrTimewait is how long an answered request is remembered, so that a resent request
// (the answer was lost) gets the same answer instead of reaching the application again:
// longer than Linux's interval between resends (4.096 s).
var sidrTimewait = 10 * time.Second

// sidrTable is a device's SIDR state, guarded by its manager's mu.
type sidrTable struct {
	listeners map[uint16]*UDListener
	out       map[uint32]*sidrOut   // requests sent, by request ID
	in        map[remoteKey]*sidrIn // requests received, by requester and request ID
	stats     SIDRCounters
}

// sidrs returns m's SIDR state, made on first use (mu held).
func (m *manager) sidrs() *sidrTable {
	if m.sidr == nil {
		m.sidr = &sidrTable{listeners: map[uint16]*UDListener{}, out: map[uint32]*sidrOut{}, in: map[remoteKey]*sidrIn{}}
	}
	return m.sidr
}

// closeSIDR ends everything SIDR as the device closes (mu held).
func (m *manager) closeSIDR() {
	st := m.sidr
	if st == nil {
		return
	}
	for _, o := range st.out {
		o.finish(nil, errDeviceClosed)
	}
	for _, in := range st.in {
		in.forget()
	}
	for _, l := range st.listeners {
		l.closeLocked()
	}
}

// ResolveParams are what ResolveUD sends; every field may be left zero.
type ResolveParams struct {
	// PrivateData goes to the listener with the request (at most 180 bytes: rdma_cm's
	// addressing header takes the first 36 of the request's 216).
	PrivateData []byte
	// DevicePort is the peer device's UDP port (0: 4791, the RoCEv2 port).
	DevicePort uint16
	// ResponseTimeout is how long to wait for the answer before resending the request
	// (DefaultResponseTimeout); MaxRetries how many times to resend (DefaultMaxRetries;
	// negative: none).
	ResponseTimeout time.Duration
	MaxRetries      int
}

// UDRemote is a resolved UD service: what rdma_cm's RDMA_CM_EVENT_ESTABLISHED gives a
// UDP-port-space id (event->param.ud).
type UDRemote struct {
	// Addr is the peer device's address and UDP port.
	Addr netip.AddrPort
	// QPN and QKey are the peer UD QP's number and Q_Key, to send to (SendWR.RemoteQPN,
	// RemoteQKey).
	QPN, QKey uint32
	// AHAttr is the address vector of the peer's device, for PD.CreateAH.
	AHAttr verbs.AHAttr
	// PrivateData is the listener's private data (136 bytes, zero-padded).
	PrivateData []byte
}

// sidrOut is a request this side sent (mu held for every field).
type sidrOut struct {
	m          *manager
	id         uint32
	tid        uint64
	peer       netip.AddrPort
	serviceID  uint64
	msg        [mad.Size]byte
	timeout    time.Duration
	retries    int
	maxRetries int
	timer      *time.Timer
	gen        uint64
	done       chan struct{}
	res        *UDRemote
	err        error
}

// ResolveUD finds the UD QP that serves remote's port (rdma_cm's UDP port space, service
// ID 0x01110000 | port) at the device with remote's address, as rdma_connect does for a
// UDP id: it sends a ServiceIDResolutionRequest, resent after the response timeout, and
// returns the answer: the QP number and Q_Key to send to, an address vector for the
// peer's device and its private data. Errors: a *SIDRError (errors.Is ErrRejected;
// ErrNoListener when nothing listens on the port), ErrTimeout (no answer after the
// retries), ErrPeerUnreachable (Linux: no device at the address's device port, reported
// within the request's round trip), the context's error, ErrClosed, or a check of the
// arguments. At most
// MaxREQInFlight requests (connection requests and resolutions together) wait for an
// answer per device; more wait their turn.
func ResolveUD(ctx context.Context, dev *verbs.Device, remote netip.AddrPort, p *ResolveParams) (_ *UDRemote, err error) {
	defer nameCall("ResolveUD", &err)
	if p == nil {
		p = &ResolveParams{}
	}
	m, err := requestManager(dev, "ResolveUD", remote, p.PrivateData, mad.SIDRPrivateMax, "a resolution")
	if err != nil {
		return nil, err
	}
	peer := peerDevice(remote, p.DevicePort)
	timeout := responseTimeout(p.ResponseTimeout)
	if err := m.takeREQSlot(ctx); err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		<-m.reqSlots
		return nil, errDeviceClosed
	}
	st := m.sidrs()
	o := &sidrOut{m: m, id: m.newSIDRID(), tid: randUint64(), peer: peer, serviceID: mad.UDPServiceID(remote.Port()),
		timeout: timeout, maxRetries: (&DialParams{MaxRetries: p.MaxRetries}).retries(), done: make(chan struct{})}
	st.out[o.id] = o
	req := mad.SIDRREQ{RequestID: o.id, PKey: 0xFFFF, Reserved: mad.SoftrnicSIDRMark, ServiceID: o.serviceID}
	local := m.local.Addr()
	h := mad.CMAHeader{SrcPort: m.local.Port(), Src: local, Dst: peer.Addr()}
	h.Put(req.PrivateData[:])
	copy(req.PrivateData[mad.CMAHeaderLen:], p.PrivateData)
	mad.Put(o.msg[:], o.tid, &req)
	st.stats.REQSent++
	m.send(o.peer, o.msg[:])
	o.arm()
	m.mu.Unlock()

	select {
	case <-o.done:
	case <-ctx.Done():
		m.mu.Lock()
		o.finish(nil, ctx.Err()) // nothing to tell the listener: SIDR has no withdrawal
		m.mu.Unlock()
		<-o.done
	}
	return o.res, o.err
}

// newSIDRID returns a request ID that no request or connection of m uses (mu held).
func (m *manager) newSIDRID() uint32 {
	for {
		id := m.newID()
		if m.sidr.out[id] == nil {
			return id
		}
	}
}

// arm starts the request's response timer (mu held).
func (o *sidrOut) arm() {
	o.gen++
	gen := o.gen
	if o.timer != nil {
		o.timer.Stop()
	}
	o.timer = time.AfterFunc(o.timeout, func() { o.m.onSIDRTimer(o, gen) })
}

// finish ends the request with its answer or err, once (mu held).
func (o *sidrOut) finish(res *UDRemote, err error) {
	st := o.m.sidr
	if st.out[o.id] != o {
		return
	}
	delete(st.out, o.id)
	o.gen++
	if o.timer != nil {
		o.timer.Stop()
	}
	<-o.m.reqSlots
	o.res, o.err = res, err
	close(o.done)
}

// onSIDRTimer resends the request, or gives up (its own goroutine).
func (m *manager) onSIDRTimer(o *sidrOut, gen uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if o.gen != gen || m.sidr.out[o.id] != o {
		return
	}
	if m.closed {
		o.finish(nil, errDeviceClosed)
		return
	}
	st := m.sidr
	if o.retries < o.maxRetries {
		o.retries++
		st.stats.REQRetries++
		m.send(o.peer, o.msg[:])
		o.arm()
		return
	}
	st.stats.Timeouts++
	o.finish(nil, fmt.Errorf("%w (%d retries, %v each)", ErrTimeout, o.retries, o.timeout))
}

// onSIDRREP: the answer to a request of ours, from the device it was sent to (any
// source port of its address if that device is at RoCEv2Port, where a standard peer
// listens; else exactly the port, a softrnic device's), with the request's transaction
// and service IDs (mu held).
func (m *manager) onSIDRREP(src netip.AddrPort, tid uint64, r *mad.SIDRREP) bool {
	if m.sidr == nil {
		return false
	}
	st := m.sidr
	o := st.out[r.RequestID]
	if o == nil || tid != o.tid || r.ServiceID != o.serviceID || src.Addr() != o.peer.Addr() ||
		(o.peer.Port() != RoCEv2Port && src != o.peer) {
		return false
	}
	data := append([]byte(nil), r.PrivateData[:]...)
	if r.Status != mad.SIDRSuccess {
		st.stats.Failed++
		o.finish(nil, &SIDRError{Status: SIDRStatus(r.Status), PrivateData: data})
		return true
	}
	if r.QPN <= 1 {
		return false // QP0 and QP1 serve no application
	}
	st.stats.Resolved++
	o.finish(&UDRemote{Addr: o.peer, QPN: r.QPN, QKey: r.QKey, PrivateData: data,
		AHAttr: verbs.AHAttr{DGID: verbs.GIDFromAddr(o.peer.Addr()), DestPort: o.peer.Port(), PortNum: 1, IsGlobal: true, HopLimit: 64}}, nil)
	return true
}

// UDListener takes service ID resolution requests for one port of rdma_cm's UDP port
// space at a device (rdma_listen on a UDP id).
type UDListener struct {
	m       *manager
	port    uint16
	backlog chan *sidrIn
	closed  chan struct{}
	isClose bool
}

// ListenUD starts taking resolution requests for port (the service ID 0x01110000 | port,
// as rdma_cm's UDP port space) at dev. A port has one UD listener per device; the UDP
// and TCP port spaces are apart, as in rdma_cm (Listen and ListenUD may take one port).
func ListenUD(dev *verbs.Device, port uint16) (_ *UDListener, err error) {
	defer nameCall("ListenUD", &err)
	return addListener(dev, port, "ListenUD", "UDP ",
		func(m *manager) map[uint16]*UDListener { return m.sidrs().listeners },
		func(m *manager) *UDListener {
			return &UDListener{m: m, port: port, backlog: make(chan *sidrIn, Backlog), closed: make(chan struct{})}
		})
}

// Addr is the listener's device address with the service port.
func (l *UDListener) Addr() netip.AddrPort { return netip.AddrPortFrom(l.m.local.Addr(), l.port) }

// Close stops the listener: pending and later Accepts return ErrClosed, requests not yet
// accepted are answered "service ID not supported", as later ones are. Requests already
// accepted may still be answered.
func (l *UDListener) Close() error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	l.closeLocked()
	return nil
}

func (l *UDListener) closeLocked() {
	st := l.m.sidr
	closeListener(l, l.port, st.listeners, &l.isClose, l.closed, l.backlog, func(in *sidrIn) {
		if !in.answered && !l.m.closed {
			st.stats.Unsupported++
			in.answer(&mad.SIDRREP{Status: mad.SIDRUnsupported})
		}
	})
}

// sidrIn is a request this side received (mu held for every field).
type sidrIn struct {
	m        *manager
	key      remoteKey // requester (its device address) and request ID
	tid      uint64
	req      mad.SIDRREQ
	answered bool
	msg      [mad.Size]byte // the answer, sent again to a duplicate
	timer    *time.Timer
}

// UDRequest is a resolution request taken by Accept: answer it with Accept or Reject.
type UDRequest struct {
	in *sidrIn
	// Remote is the requesting device's address and the UDP port its datagrams are
	// answered at: its device port if it is a softrnic device, else RoCEv2Port.
	Remote netip.AddrPort
	// PrivateData is the requester's private data (180 bytes, zero-padded, as rdma_cm
	// gives it: what follows the addressing header).
	PrivateData []byte
}

// Accept returns the next resolution request, waiting for one until ctx is done or the
// listener is closed (ErrClosed).
func (l *UDListener) Accept(ctx context.Context) (_ *UDRequest, err error) {
	defer nameCall("Accept", &err)
	select {
	case in := <-l.backlog:
		return &UDRequest{in: in, Remote: in.key.addr, PrivateData: append([]byte(nil), in.req.PrivateData[mad.CMAHeaderLen:]...)}, nil
	case <-l.closed:
		if l.m.isClosed() {
			return nil, errDeviceClosed
		}
		return nil, errListenerClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// UDAcceptParams are what Accept answers with; may be nil.
type UDAcceptParams struct {
	// PrivateData goes to the requester with the answer (at most 136 bytes).
	PrivateData []byte
}

// Accept answers the request with qp, a UD QP of the listener's device, as rdma_accept
// does for a UDP id: the requester learns its QP number and Q_Key. A QP in RESET is first
// brought to RTS with UDPQKey (InitUDQP), one in INIT or RTR to RTS; post its receives
// before Accept, as the requester may send as soon as the answer arrives. Accept does
// not wait for anything: SIDR has no further message.
func (r *UDRequest) Accept(qp *verbs.QP, p *UDAcceptParams) (err error) {
	defer nameCall("Accept", &err)
	if p == nil {
		p = &UDAcceptParams{}
	}
	if len(p.PrivateData) > mad.SIDRREPPrivateLen {
		return fmt.Errorf("%w: %d bytes, an accept carries at most %d", ErrPrivateData, len(p.PrivateData), mad.SIDRREPPrivateLen)
	}
	m := r.in.m
	if err := checkUDQP(m.dev, qp); err != nil {
		return err
	}
	if err := readyUDQP(qp); err != nil {
		return err
	}
	attr, _ := qp.QueryQP()
	rep := mad.SIDRREP{Status: mad.SIDRSuccess, QPN: qp.QPNum(), QKey: attr.QKey}
	copy(rep.PrivateData[:], p.PrivateData)
	return r.answer("Accept", &rep)
}

// Reject refuses the request with private data (at most 136 bytes), as rdma_reject does
// for a UDP id: ResolveUD returns a *SIDRError with status SIDRReject carrying it.
func (r *UDRequest) Reject(privateData []byte) (err error) {
	defer nameCall("Reject", &err)
	if len(privateData) > mad.SIDRREPPrivateLen {
		return fmt.Errorf("%w: %d bytes, a reject carries at most %d", ErrPrivateData, len(privateData), mad.SIDRREPPrivateLen)
	}
	rep := mad.SIDRREP{Status: mad.SIDRReject}
	copy(rep.PrivateData[:], privateData)
	return r.answer("Reject", &rep)
}

func (r *UDRequest) answer(op string, rep *mad.SIDRREP) error {
	m := r.in.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errDeviceClosed
	}
	if r.in.answered {
		return fmt.Errorf("cm: %s: the request was already answered: %w", op, ErrState)
	}
	r.in.answer(rep)
	return nil
}

// answer sends rep (its request ID and service ID filled in) and keeps it for
// duplicates a while (mu held).
func (in *sidrIn) answer(rep *mad.SIDRREP) {
	m := in.m
	rep.RequestID, rep.ServiceID = in.req.RequestID, in.req.ServiceID
	mad.Put(in.msg[:], in.tid, rep)
	in.answered = true
	m.sidr.stats.REPSent++
	m.send(in.key.addr, in.msg[:])
	in.timer = time.AfterFunc(sidrTimewait, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		in.forget()
	})
}

// forget drops the request (mu held).
func (in *sidrIn) forget() {
	if in.timer != nil {
		in.timer.Stop()
	}
	if st := in.m.sidr; st.in[in.key] == in {
		delete(st.in, in.key)
	}
}

// onSIDRREQ: a resolution request, new or resent (mu held).
func (m *manager) onSIDRREQ(src netip.AddrPort, tid uint64, r *mad.SIDRREQ) bool {
	st := m.sidrs()
	peer := peerOf(src, r.FromSoftrnic())
	key := remoteKey{peer, r.RequestID}
	if in := st.in[key]; in != nil {
		// A duplicate: the answer, if there is one already, was lost; with none yet the
		// application has the request (SIDR has no MRA: the requester keeps resending).
		st.stats.REQDuplicates++
		if in.answered {
			m.send(peer, in.msg[:])
		}
		return true
	}
	port, ok := mad.UDPServicePort(r.ServiceID)
	hdr, herr := mad.DecodeCMAHeader(r.PrivateData[:])
	l := st.listeners[port]
	if !ok || herr != nil || l == nil || (hdr.Dst.IsValid() && !m.local.Addr().IsUnspecified() && hdr.Dst.Unmap() != m.local.Addr()) {
		// Nothing serves it here: "service ID not supported", as Linux's CM answers. Not
		// kept: a duplicate gets the same answer made again.
		st.stats.Unsupported++
		st.stats.REPSent++
		rep := mad.SIDRREP{RequestID: r.RequestID, Status: mad.SIDRUnsupported, ServiceID: r.ServiceID}
		m.sendOnce(peer, tid, &rep)
		return true
	}
	in := &sidrIn{m: m, key: key, tid: tid, req: *r}
	select {
	case l.backlog <- in:
		st.stats.REQReceived++
		st.in[key] = in
	default:
		m.stats.BacklogDrops++ // the requester resends
	}
	return true
}

// InitUDQP moves a UD QP from RESET to RTS with Q_Key qkey (0: UDPQKey), as
// rdma_create_qp does for an rdma_cm UDP id: post receives after it (a UD QP in RESET
// takes none).
func InitUDQP(qp *verbs.QP, qkey uint32) error {
	if qkey == 0 {
		qkey = UDPQKey
	}
	if err := qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateInit, PortNum: 1, QKey: qkey},
		verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrQKey); err != nil {
		return err
	}
	return readyUDQP(qp)
}

// readyUDQP brings a UD QP in INIT or RTR to RTS (one in RESET with UDPQKey).
func readyUDQP(qp *verbs.QP) error {
	for {
		var err error
		switch s := qp.State(); s {
		case verbs.StateRTS:
			return nil
		case verbs.StateReset:
			return InitUDQP(qp, UDPQKey)
		case verbs.StateInit:
			err = qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateRTR}, verbs.QPAttrState)
		case verbs.StateRTR:
			err = qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateRTS, SQPSN: verbs.RandomPSN()}, verbs.QPAttrState|verbs.QPAttrSQPSN)
		default:
			return fmt.Errorf("cm: UD QP %#x is in %v: %w", qp.QPNum(), s, ErrState)
		}
		if err != nil {
			return err
		}
	}
}

// checkUDQP checks that qp is a UD QP of dev.
func checkUDQP(dev *verbs.Device, qp *verbs.QP) error {
	if qp == nil {
		return fmt.Errorf("cm: %w: nil QP", verbs.ErrInvalid)
	}
	if qp.PD().Device() != dev {
		return fmt.Errorf("cm: %w: QP %#x belongs to another device", verbs.ErrInvalid, qp.QPNum())
	}
	if _, init := qp.QueryQP(); init.QPType != verbs.QPTypeUD {
		return fmt.Errorf("cm: %w: QP %#x is %v: a UD service is a UD QP", verbs.ErrInvalid, qp.QPNum(), init.QPType)
	}
	return nil
}
