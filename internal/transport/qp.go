package transport

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// MaxMessage is the largest message (sum of a work request's scatter/gather list), 2^31
// bytes as in InfiniBand.
const MaxMessage = 1 << 31

// packetsFor returns how many packets of mtu bytes a message of n bytes takes (at least
// one: a zero-length message is one packet), computed without the uint32 wrap that
// (n+mtu-1)/mtu has for n near 2^32.
func packetsFor(n, mtu uint32) uint32 {
	return uint32(max((uint64(n)+uint64(mtu)-1)/uint64(mtu), 1))
}

// Service is a QP's transport service.
type Service uint8

// Services.
const (
	ServiceRC Service = iota // reliable connected
	ServiceUD                // unreliable datagram
)

func (s Service) String() string {
	if s == ServiceUD {
		return "UD"
	}
	return "RC"
}

// QPConfig holds what a QP is created with.
type QPConfig struct {
	Service        Service
	PD             uint32
	SendCQ, RecvCQ *CQ
	SRQ            *RecvQueue // nil: the QP gets its own receive queue
	MaxSendWR      int
	MaxRecvWR      int
	MaxSendSGE     int
	MaxRecvSGE     int
	MaxInline      int
	SigAll         bool
	// GSI makes the QP the device's general services interface: a UD QP with QP number
	// 1, the one CM MADs are sent to. There is at most one; it does not count against
	// MaxQP.
	GSI bool
}

// QP is a reliable-connected queue pair.
type QP struct {
	// Set at creation, read without a lock.
	service    Service
	dev        *Device
	qpn        uint32
	pd         uint32
	sendCQ     *CQ
	recvCQ     *CQ
	rq         *RecvQueue
	home       *queue // the receive queue the QP lives on (see queue), set with qpn
	srq        bool
	sigAll     bool
	maxSendSGE int
	maxInline  int

	// Owner is the verbs object wrapping this QP.
	Owner any

	// mu guards every field from here to the timer's (see the package doc), except
	// srqPolled (atomic).
	mu        mutex
	state     QPState
	destroyed bool
	attr      Attr // as last set (for QueryQP)
	mtu       uint32
	// peer is replaced, never modified, by ModifyQP: batches being sent without q.mu keep
	// pointing at the address they were built for.
	peer      *netio.Addr
	txFlow    wire.Flow
	txPrefix  wire.PrefixCache // the ICRC pseudo-header's CRC for what it sends last (q.mu)
	src       int              // the device socket its packets leave from (netio source; see sourceFor)
	sqdNotify bool

	sq sendQueue // posted by PostSend, sent by the requester, retired by the completer

	svc   service     // RC or UD (service.go); set at creation
	req   requester   // RC: sends requests (requester.go)
	comp  completer   // RC: handles their responses (completer.go)
	resp  responder   // RC: answers the peer's requests (responder.go)
	ord   ordered     // ordered mode's parts of the three roles (ordered*.go)
	weak  *weakState  // weak mode's roles; nil unless the QP is weakly ordered (weak*.go)
	lq    *limitQueue // limit queue; nil: no limits
	stats Stats

	share     float64       // statistical share of the SRQ, WQEs per second (SetShare)
	srqTaken  uint64        // receive WQEs taken from the SRQ
	srqPolled atomic.Uint64 // their completions polled by the consumer

	txOwner    bool      // a goroutine is building/sending this QP's requests (see the package doc)
	txIdle     sync.Cond // signalled (L: mu) when a destroyed QP's transmit owner lets go
	txPending  bool      // more requester work arrived while another goroutine owned transmit
	txMore     bool      // the receive path's last fill stopped on a full batch
	kickQueued bool      // on the receive path's kick list
	commEst    bool

	// Guarded by the device's timerQueue.mu.
	timerAt  int64 // deadline the timer heap holds for this QP (0: none)
	timerIdx int
}

// CreateQP creates a QP in the RESET state.
func (d *Device) CreateQP(c QPConfig) (*QP, error) {
	if c.SendCQ == nil || c.RecvCQ == nil {
		return nil, errors.New("QP needs a send CQ and a receive CQ")
	}
	if c.MaxSendWR < 1 {
		c.MaxSendWR = 1
	}
	q := &QP{
		service: c.Service, dev: d, pd: c.PD, sendCQ: c.SendCQ, recvCQ: c.RecvCQ, sigAll: c.SigAll,
		maxSendSGE: c.MaxSendSGE, maxInline: c.MaxInline, timerIdx: -1,
	}
	q.svc = rc{q}
	if c.Service == ServiceUD {
		q.svc = newUDService(q)
		q.mtu = uint32(wire.MTUBytes(d.cfg.MTU)) // a UD message is one packet of up to the port's MTU
	}
	q.mu.rank = rankQP
	q.txIdle.L = &q.mu
	q.sq.init(c.MaxSendWR, c.MaxSendSGE, c.MaxInline)
	if c.SRQ != nil {
		q.rq, q.srq = c.SRQ, true
	} else {
		q.rq = d.NewRecvQueue(c.PD, max(c.MaxRecvWR, 1), c.MaxRecvSGE, false)
	}
	if c.GSI && c.Service != ServiceUD {
		return nil, errors.New("the GSI QP is a UD QP")
	}
	q.resp.init(q)
	q.req.q, q.comp.q = q, q
	q.setOrdering(Ordered, 0)
	if c.GSI {
		if err := d.claimGSI(q); err != nil {
			return nil, err
		}
	} else if err := d.allocQPN(q); err != nil {
		return nil, err
	}
	q.sendCQ.addQueue(q.home)
	q.recvCQ.addQueue(q.home)
	return q, nil
}

// QPN returns the QP number.
func (q *QP) QPN() uint32 { return q.qpn }

// State returns the current state.
func (q *QP) State() QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// Device returns the device the QP belongs to.
func (q *QP) Device() *Device { return q.dev }

// Destroy removes the QP. Outstanding work is dropped without completions, as
// ibv_destroy_qp does. When it returns, nothing of the QP is in flight any more: no
// goroutine is sending its packets (which reference registered memory).
func (q *QP) Destroy() {
	q.mu.Lock()
	// An ACK held back to ride along with the next send (ackDelay) is owed for messages
	// this side has already completed: it goes out now. Dropped, it would leave the peer's
	// last SEND or WRITE unacknowledged, to end in its retry-exceeded error once this QP is
	// gone (ibv_rc_pingpong's server: the client destroys its QP as soon as the server's
	// last SEND completes there).
	if q.resp.ackDeferred && q.state != StateReset && q.state != StateErr {
		q.flushAckRelock() // releases and retakes q.mu
	}
	q.destroyed = true
	q.state = StateReset
	for q.txOwner {
		q.txIdle.Wait()
	}
	q.mu.Unlock()
	// Whoever holds the receive path sends what it built before releasing it.
	q.dev.Quiesce()
	q.home.timers.cancel(q)
	q.dev.freeQPN(q)
}

// Attribute mask bits (ibv_qp_attr_mask values).
const (
	MaskState           uint32 = 1 << 0
	MaskCurState        uint32 = 1 << 1
	MaskEnSQDAsyncNotif uint32 = 1 << 2
	MaskAccessFlags     uint32 = 1 << 3
	MaskPKeyIndex       uint32 = 1 << 4
	MaskPort            uint32 = 1 << 5
	MaskQKey            uint32 = 1 << 6
	MaskAV              uint32 = 1 << 7
	MaskPathMTU         uint32 = 1 << 8
	MaskTimeout         uint32 = 1 << 9
	MaskRetryCnt        uint32 = 1 << 10
	MaskRNRRetry        uint32 = 1 << 11
	MaskRQPSN           uint32 = 1 << 12
	MaskMaxQPRdAtomic   uint32 = 1 << 13
	MaskAltPath         uint32 = 1 << 14
	MaskMinRNRTimer     uint32 = 1 << 15
	MaskSQPSN           uint32 = 1 << 16
	MaskMaxDestRdAtomic uint32 = 1 << 17
	MaskPathMigState    uint32 = 1 << 18
	MaskCap             uint32 = 1 << 19
	MaskDestQPN         uint32 = 1 << 20
	// MaskOrdering selects Attr.Ordering and Attr.MaxHole (a softrnic extension, in a
	// bit libibverbs does not use); allowed on INIT -> RTR.
	MaskOrdering uint32 = 1 << 30
	maskAll      uint32 = 1<<21 - 1 | MaskOrdering
)

var maskNames = [...]string{0: "STATE", "CUR_STATE", "EN_SQD_ASYNC_NOTIFY", "ACCESS_FLAGS", "PKEY_INDEX",
	"PORT", "QKEY", "AV", "PATH_MTU", "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "RQ_PSN",
	"MAX_QP_RD_ATOMIC", "ALT_PATH", "MIN_RNR_TIMER", "SQ_PSN", "MAX_DEST_RD_ATOMIC",
	"PATH_MIG_STATE", "CAP", "DEST_QPN", 30: "ORDERING"}

// MaskString names the bits of an attribute mask, e.g. "AV|PATH_MTU".
func MaskString(m uint32) string {
	var s []string
	for i, n := range maskNames {
		if n != "" && m&(1<<i) != 0 {
			s = append(s, n)
		}
	}
	if m&^maskAll != 0 {
		s = append(s, fmt.Sprintf("%#x", m&^maskAll))
	}
	return strings.Join(s, "|")
}

// Attr are QP attributes (ibv_qp_attr fields that apply to RC).
type Attr struct {
	State           QPState
	CurState        QPState
	PathMTU         uint8 // wire.MTU256..MTU4096
	DestQPN         uint32
	RQPSN, SQPSN    wire.PSN
	MaxRdAtomic     uint8 // initiator depth
	MaxDestRdAtomic uint8 // responder resources
	MinRNRTimer     uint8
	Timeout         uint8
	RetryCnt        uint8
	RNRRetry        uint8
	Access          tpt.Access
	PKeyIndex       uint16
	Port            uint8
	SQDNotify       bool
	Peer            netip.AddrPort // from the address vector: peer IP and UDP port
	// PeerSrcPort, if not 0, is the only UDP source port packets are accepted from (the
	// peer's address is always checked).
	PeerSrcPort uint16
	// Ordering selects ordered (standard RC) or weakly-ordered mode; both sides must
	// agree. MaxHole is weak mode's arrival-bitmap span in PSNs (the largest hole and the
	// requester's window; 0: DefaultMaxHole).
	Ordering Ordering
	MaxHole  uint32
	// QKey is a UD QP's Q_Key: datagrams carrying another are dropped.
	QKey uint32
}

// Ordering is a QP's delivery mode.
type Ordering uint8

// Orderings.
const (
	Ordered Ordering = iota // standard RC: in-order placement, go-back-N
	Weak                    // out-of-order placement, in-order completion, selective retransmission
)

func (o Ordering) String() string {
	if o == Weak {
		return "weak"
	}
	return "ordered"
}

// Weak-mode limits.
const (
	DefaultMaxHole = 2048
	MinMaxHole     = 64
	MaxMaxHole     = 1 << 16
)

type transition struct{ req, opt uint32 }

// transitions are the IBTA/ibv_modify_qp state tables, by service: which attributes
// each transition requires and which it allows.
var transitions = [...]map[[2]QPState]transition{ServiceRC: rcTransitions, ServiceUD: udTransitions}

// udTransitions is the UD column: no peer, no PSN to expect, no retries; a Q_Key.
var udTransitions = func() map[[2]QPState]transition {
	t := map[[2]QPState]transition{}
	for s := StateReset; s <= StateErr; s++ {
		t[[2]QPState{s, StateReset}] = transition{}
		t[[2]QPState{s, StateErr}] = transition{}
	}
	t[[2]QPState{StateReset, StateInit}] = transition{req: MaskPKeyIndex | MaskPort | MaskQKey}
	t[[2]QPState{StateInit, StateInit}] = transition{opt: MaskPKeyIndex | MaskPort | MaskQKey}
	t[[2]QPState{StateInit, StateRTR}] = transition{opt: MaskPKeyIndex | MaskQKey}
	t[[2]QPState{StateRTR, StateRTS}] = transition{req: MaskSQPSN, opt: MaskCurState | MaskQKey}
	t[[2]QPState{StateRTS, StateRTS}] = transition{opt: MaskCurState | MaskQKey}
	t[[2]QPState{StateRTS, StateSQD}] = transition{opt: MaskEnSQDAsyncNotif}
	t[[2]QPState{StateSQD, StateRTS}] = transition{opt: MaskCurState | MaskQKey}
	t[[2]QPState{StateSQD, StateSQD}] = transition{opt: MaskPKeyIndex | MaskQKey}
	t[[2]QPState{StateSQE, StateRTS}] = transition{opt: MaskCurState | MaskQKey}
	return t
}()

// rcTransitions is the RC column.
var rcTransitions = func() map[[2]QPState]transition {
	t := map[[2]QPState]transition{}
	for s := StateReset; s <= StateErr; s++ {
		t[[2]QPState{s, StateReset}] = transition{}
		t[[2]QPState{s, StateErr}] = transition{}
	}
	t[[2]QPState{StateReset, StateInit}] = transition{req: MaskPKeyIndex | MaskPort | MaskAccessFlags}
	t[[2]QPState{StateInit, StateInit}] = transition{opt: MaskPKeyIndex | MaskPort | MaskAccessFlags}
	t[[2]QPState{StateInit, StateRTR}] = transition{
		req: MaskAV | MaskPathMTU | MaskDestQPN | MaskRQPSN | MaskMaxDestRdAtomic | MaskMinRNRTimer,
		opt: MaskAltPath | MaskAccessFlags | MaskPKeyIndex | MaskOrdering}
	t[[2]QPState{StateRTR, StateRTS}] = transition{
		req: MaskTimeout | MaskRetryCnt | MaskRNRRetry | MaskSQPSN | MaskMaxQPRdAtomic,
		opt: MaskCurState | MaskAltPath | MaskAccessFlags | MaskMinRNRTimer | MaskPathMigState}
	t[[2]QPState{StateRTS, StateRTS}] = transition{
		opt: MaskCurState | MaskAccessFlags | MaskAltPath | MaskPathMigState | MaskMinRNRTimer}
	t[[2]QPState{StateRTS, StateSQD}] = transition{opt: MaskEnSQDAsyncNotif}
	t[[2]QPState{StateSQD, StateRTS}] = transition{
		opt: MaskCurState | MaskAltPath | MaskAccessFlags | MaskMinRNRTimer | MaskPathMigState}
	t[[2]QPState{StateSQD, StateSQD}] = transition{
		opt: MaskPKeyIndex | MaskPort | MaskAV | MaskAccessFlags | MaskTimeout | MaskRetryCnt |
			MaskRNRRetry | MaskMaxQPRdAtomic | MaskMaxDestRdAtomic | MaskAltPath | MaskMinRNRTimer |
			MaskPathMigState}
	t[[2]QPState{StateSQE, StateRTS}] = transition{opt: MaskCurState}
	return t
}()

// Limits the engine enforces on attribute values.
type Limits struct {
	MaxRdAtomic     int
	MaxDestRdAtomic int
}

// Modify applies attrs selected by mask and performs the state transition, with
// ibv_modify_qp's rules. On error nothing changes.
func (q *QP) Modify(a *Attr, mask uint32, lim Limits) error {
	q.mu.Lock()
	// An ACK held back to ride along with the next send is owed for messages this side
	// has already completed: it goes out before the QP leaves for ERR or RESET, as at
	// Destroy. Dropped, the peer's last SEND or WRITE stays unacknowledged (rdma_cm's
	// disconnect moves the QP to ERR as soon as the peer's last message completed here).
	if mask&MaskState != 0 && (a.State == StateErr || a.State == StateReset) && !q.destroyed &&
		q.resp.ackDeferred && q.state != StateReset && q.state != StateErr {
		q.flushAckRelock() // releases and retakes q.mu
	}
	cur := q.state
	err := q.modifyLocked(a, mask, lim)
	if err == nil && cur == StateSQD && q.state == StateRTS {
		q.pushTxUnlock() // resume what the drain held back; releases q.mu
		return nil
	}
	q.mu.Unlock()
	return err
}

func (q *QP) modifyLocked(a *Attr, mask uint32, lim Limits) error {
	if q.destroyed {
		return errors.New("QP was destroyed")
	}
	cur := q.state
	if mask&MaskCurState != 0 {
		if cur != StateRTR && cur != StateRTS && cur != StateSQD && cur != StateSQE {
			return fmt.Errorf("cur_state may only be given in RTR, RTS, SQD or SQE (the QP is in %v)", cur)
		}
		if a.CurState != cur {
			return fmt.Errorf("cur_state %v does not match the QP's state %v", a.CurState, cur)
		}
	}
	next := cur
	if mask&MaskState != 0 {
		next = a.State
	}
	if next > StateErr {
		return fmt.Errorf("invalid QP state %d", next)
	}
	tr, ok := transitions[q.service][[2]QPState{cur, next}]
	if !ok {
		return fmt.Errorf("transition %v -> %v is not allowed for a %v QP", cur, next, q.service)
	}
	if missing := tr.req &^ mask; missing != 0 {
		return fmt.Errorf("transition %v -> %v requires %s", cur, next, MaskString(missing))
	}
	if extra := mask &^ (tr.req | tr.opt | MaskState); extra != 0 {
		return fmt.Errorf("transition %v -> %v does not take %s", cur, next, MaskString(extra))
	}
	var peer netio.Addr
	if err := q.checkAttr(a, mask, lim, &peer); err != nil {
		return err
	}
	q.apply(a, mask, peer)
	q.setState(next)
	return nil
}

func (q *QP) checkAttr(a *Attr, mask uint32, lim Limits, peer *netio.Addr) error {
	if mask&MaskPathMTU != 0 && wire.MTUBytes(a.PathMTU) == 0 {
		return fmt.Errorf("path_mtu %d is not an MTU enum value (1=256 .. 5=4096)", a.PathMTU)
	}
	if mask&MaskDestQPN != 0 && a.DestQPN > wire.PSNMask {
		return fmt.Errorf("dest_qp_num %#x does not fit 24 bits", a.DestQPN)
	}
	if mask&MaskRQPSN != 0 && a.RQPSN > wire.PSNMask {
		return fmt.Errorf("rq_psn %#x does not fit 24 bits", a.RQPSN)
	}
	if mask&MaskSQPSN != 0 && a.SQPSN > wire.PSNMask {
		return fmt.Errorf("sq_psn %#x does not fit 24 bits", a.SQPSN)
	}
	if mask&MaskTimeout != 0 && a.Timeout > 31 {
		return fmt.Errorf("timeout %d is out of range 0..31", a.Timeout)
	}
	if mask&MaskRetryCnt != 0 && a.RetryCnt > 7 {
		return fmt.Errorf("retry_cnt %d is out of range 0..7", a.RetryCnt)
	}
	if mask&MaskRNRRetry != 0 && a.RNRRetry > 7 {
		return fmt.Errorf("rnr_retry %d is out of range 0..7", a.RNRRetry)
	}
	if mask&MaskMinRNRTimer != 0 && a.MinRNRTimer > 31 {
		return fmt.Errorf("min_rnr_timer %d is out of range 0..31", a.MinRNRTimer)
	}
	if mask&MaskMaxQPRdAtomic != 0 && int(a.MaxRdAtomic) > lim.MaxRdAtomic {
		return fmt.Errorf("max_rd_atomic %d exceeds the device's max_qp_init_rd_atom %d", a.MaxRdAtomic, lim.MaxRdAtomic)
	}
	if mask&MaskMaxDestRdAtomic != 0 && int(a.MaxDestRdAtomic) > lim.MaxDestRdAtomic {
		return fmt.Errorf("max_dest_rd_atomic %d exceeds the device's max_qp_rd_atom %d", a.MaxDestRdAtomic, lim.MaxDestRdAtomic)
	}
	if mask&MaskAccessFlags != 0 && a.Access&^(tpt.LocalWrite|tpt.RemoteWrite|tpt.RemoteRead|tpt.RemoteAtomic) != 0 {
		return fmt.Errorf("qp_access_flags %#x has unknown bits", uint32(a.Access))
	}
	if mask&MaskPort != 0 && a.Port != 1 {
		return fmt.Errorf("port_num %d: the device has one port, number 1", a.Port)
	}
	if mask&MaskPKeyIndex != 0 && a.PKeyIndex != 0 {
		return fmt.Errorf("pkey_index %d: the device has one P_Key, at index 0", a.PKeyIndex)
	}
	if mask&MaskOrdering != 0 {
		if a.Ordering > Weak {
			return fmt.Errorf("ordering %d: want ordered (0) or weak (1)", a.Ordering)
		}
		if a.MaxHole != 0 && (a.MaxHole < MinMaxHole || a.MaxHole > MaxMaxHole) {
			return fmt.Errorf("max hole %d out of range %d..%d", a.MaxHole, MinMaxHole, MaxMaxHole)
		}
	}
	if mask&MaskAV != 0 {
		if !a.Peer.Addr().IsValid() || a.Peer.Port() == 0 {
			return fmt.Errorf("address vector has no destination (%v)", a.Peer)
		}
		p, err := q.dev.conn.MakeAddr(a.Peer)
		if err != nil {
			return err
		}
		*peer = p
	}
	return nil
}

func (q *QP) apply(a *Attr, mask uint32, peer netio.Addr) {
	at := &q.attr
	if mask&MaskAccessFlags != 0 {
		at.Access = a.Access
	}
	if mask&MaskPKeyIndex != 0 {
		at.PKeyIndex = a.PKeyIndex
	}
	if mask&MaskPort != 0 {
		at.Port = a.Port
	}
	if mask&MaskAV != 0 {
		at.Peer, at.PeerSrcPort = peer.AP, a.PeerSrcPort
		p := peer
		q.peer = &p
		q.src = 0
		if a.PeerSrcPort == 0 {
			q.src = sourceFor(q.qpn, q.dev.conn.Sources())
		}
		local := q.dev.local
		q.txFlow = wire.Flow{Src: local.Addr(), Dst: peer.AP.Addr(), SrcPort: q.dev.conn.SourcePort(q.src), DstPort: peer.AP.Port(), DF: q.dev.v4}
	}
	if mask&MaskPathMTU != 0 {
		at.PathMTU = a.PathMTU
		q.mtu = uint32(wire.MTUBytes(a.PathMTU))
	}
	if mask&MaskDestQPN != 0 {
		at.DestQPN = a.DestQPN
	}
	if mask&MaskRQPSN != 0 {
		at.RQPSN = a.RQPSN
		q.resp.epsn = a.RQPSN
	}
	if mask&MaskSQPSN != 0 {
		at.SQPSN = a.SQPSN // the service begins there when the QP enters RTS
	}
	if mask&MaskMaxDestRdAtomic != 0 {
		at.MaxDestRdAtomic = a.MaxDestRdAtomic
		q.resp.setResources(int(a.MaxDestRdAtomic))
	}
	if mask&MaskMaxQPRdAtomic != 0 {
		at.MaxRdAtomic = a.MaxRdAtomic
	}
	if mask&MaskMinRNRTimer != 0 {
		at.MinRNRTimer = a.MinRNRTimer
	}
	if mask&MaskTimeout != 0 {
		at.Timeout = a.Timeout
	}
	if mask&MaskRetryCnt != 0 {
		at.RetryCnt = a.RetryCnt
		q.comp.retryLeft = a.RetryCnt
	}
	if mask&MaskRNRRetry != 0 {
		at.RNRRetry = a.RNRRetry
		q.comp.rnrLeft = a.RNRRetry
	}
	if mask&MaskEnSQDAsyncNotif != 0 {
		q.sqdNotify = a.SQDNotify
	}
	if mask&MaskQKey != 0 {
		at.QKey = a.QKey
	}
	if mask&MaskOrdering != 0 {
		at.Ordering, at.MaxHole = a.Ordering, a.MaxHole
		if at.Ordering == Weak && at.MaxHole == 0 {
			at.MaxHole = DefaultMaxHole
		}
	}
}

// setState enters a new state and does what entering it means.
func (q *QP) setState(s QPState) {
	old := q.state
	q.state = s
	q.attr.State = s
	switch s {
	case StateReset:
		q.resetQueues()
	case StateRTR:
		q.setOrdering(q.attr.Ordering, q.attr.MaxHole)
	case StateRTS:
		if old == StateRTR {
			q.svc.begin(q.attr.SQPSN)
		}
	case StateErr:
		if old != StateErr {
			q.flush(StatusWRFlushErr, 0)
		}
	case StateSQD:
		q.comp.checkDrained()
	}
}

// Query returns the QP's attributes.
func (q *QP) Query() Attr {
	q.mu.Lock()
	defer q.mu.Unlock()
	a := q.attr
	a.State, a.CurState = q.state, q.state
	return a
}

// resetQueues empties both queues without completions and resets transport state.
func (q *QP) resetQueues() {
	q.sq.reset()
	if !q.srq {
		q.rq.reset()
	}
	q.req = requester{q: q}
	q.req.setWindow(q.dev.winBase)
	q.comp = completer{q: q}
	q.resp.reset()
	// Keep the counters of weak mode's bookkeeping, which goes away.
	opened, closed := q.weak.holeCounts()
	q.stats.HolesOpened += opened
	q.stats.HolesClosed += closed
	q.setOrdering(Ordered, 0)
	q.commEst = false
	q.attr = Attr{}
	if q.service != ServiceUD {
		q.mtu = 0 // set again by ModifyQP (path MTU)
	}
}

// errorState moves the QP to ERR because of a failure: the WQE at the tail (if the
// failure is the requester's) completes with status, the rest flush.
func (q *QP) errorState(status uint8, verr uint32) {
	if q.state == StateErr {
		return
	}
	q.state = StateErr
	q.attr.State = StateErr
	q.flush(status, verr)
}

// flush completes every outstanding send WQE (the first with status, if it is not
// WR_FLUSH_ERR) and every receive WQE with WR_FLUSH_ERR.
func (q *QP) flush(first uint8, verr uint32) {
	st := first
	for !q.sq.empty() {
		w := q.sq.oldest()
		q.sendCQ.push(&CQE{WRID: w.wrID, QPN: q.qpn, Status: st, Opcode: wcOpcode(w.op), VendorErr: verr})
		clear(w.segs)
		q.sq.retire()
		st, verr = StatusWRFlushErr, 0
	}
	q.req.rdOut = 0
	q.resp.abort()
	if !q.srq {
		q.rq.flush(q.recvCQ, q.qpn)
	} else {
		q.dev.raise(Event{Type: EventQPLastWQE, QP: q, Detail: "QP on an SRQ entered the error state"})
	}
	q.home.timers.cancel(q)
}

func wcOpcode(op uint8) uint8 {
	switch op {
	case WRWrite, WRWriteImm:
		return WCWrite
	case WRRead:
		return WCRead
	case WRAtomicCmpSwap:
		return WCCompSwap
	case WRAtomicFetch:
		return WCFetchAdd
	}
	return WCSend
}

// Errors of PostSend and PostRecv.
var (
	ErrQPState = errors.New("QP state does not allow posting")
	// ErrDeviceClosed is returned by posts after the device was closed.
	ErrDeviceClosed = errors.New("device closed")
	ErrSQFull       = errors.New("send queue full")
)

// PostSend posts work requests in order. It returns how many were posted and, if not all,
// why the next one was refused.
func (q *QP) PostSend(wrs []SendWR) (int, error) {
	if q.dev.closed.Load() {
		return 0, ErrDeviceClosed
	}
	q.mu.Lock()
	switch q.state {
	case StateRTS, StateSQD, StateErr:
	default:
		st := q.state
		q.mu.Unlock()
		return 0, fmt.Errorf("%w: PostSend in state %v (needs RTS)", ErrQPState, st)
	}
	for i := range wrs {
		if err := q.postOne(&wrs[i]); err != nil {
			q.finishPostUnlock(i)
			return i, err
		}
	}
	q.finishPostUnlock(len(wrs))
	return len(wrs), nil
}

// finishPostUnlock starts transmission of what was posted (or flushes it in ERR); it releases
// q.mu.
func (q *QP) finishPostUnlock(n int) {
	if n == 0 {
		q.mu.Unlock()
		return
	}
	if q.state == StateErr {
		q.flush(StatusWRFlushErr, 0)
		q.mu.Unlock()
		return
	}
	q.pushTxUnlock()
}

func (q *QP) postOne(wr *SendWR) error {
	if q.sq.full() {
		return ErrSQFull
	}
	var total uint64 // the message's length
	for _, s := range wr.SG {
		total += uint64(s.Length)
	}
	if err := q.svc.checkPost(wr.Opcode, wr.AH != nil, wr.RemoteQPN, total); err != nil {
		return err
	}
	if len(wr.SG) > q.maxSendSGE {
		return fmt.Errorf("%d SGEs exceed the QP's max_send_sge %d", len(wr.SG), q.maxSendSGE)
	}
	w := q.sq.slot()
	w.segs = w.segs[:0]
	w.verr = 0
	inline := wr.Flags&FlagInline != 0
	switch wr.Opcode {
	case WRSend, WRSendImm, WRWrite, WRWriteImm:
	case WRRead:
		if inline {
			return errors.New("INLINE is not valid for RDMA_READ")
		}
	case WRAtomicCmpSwap, WRAtomicFetch:
		if inline {
			return errors.New("INLINE is not valid for atomics")
		}
		if len(wr.SG) != 1 || wr.SG[0].Length != 8 {
			return errors.New("an atomic work request needs exactly one 8-byte SGE")
		}
	default:
		return fmt.Errorf("opcode %d is not supported on an RC QP", wr.Opcode)
	}
	if inline {
		w.inline = w.inline[:0]
		if total > uint64(q.maxInline) {
			return fmt.Errorf("inline data of %d bytes exceeds the QP's max_inline_data %d", total, q.maxInline)
		}
		for _, s := range wr.SG {
			b, st := q.dev.mrs.Lookup(s.LKey).Check(q.pd, s.Addr, uint64(s.Length), tpt.LocalRead)
			if st != tpt.OK {
				// Inline data may come from unregistered memory in libibverbs; here all
				// memory is reached through registrations, so an unknown key is an error.
				return fmt.Errorf("inline SGE lkey %#x: %v", s.LKey, st)
			}
			w.inline = append(w.inline, b...)
		}
		if len(w.inline) > 0 {
			w.segs = append(w.segs, w.inline)
		}
	} else {
		need := tpt.LocalRead
		if wr.Opcode == WRRead || wr.Opcode >= WRAtomicCmpSwap {
			need = tpt.LocalWrite
		}
		for _, s := range wr.SG {
			b, st := q.dev.mrs.Check(s.LKey, q.pd, s.Addr, uint64(s.Length), need)
			if st != tpt.OK {
				if w.verr == 0 {
					w.verr = localVendorErr(st)
				}
				continue
			}
			if len(b) > 0 {
				w.segs = append(w.segs, b)
			}
		}
	}
	if total > MaxMessage {
		clear(w.segs)
		return fmt.Errorf("message of %d bytes exceeds the maximum of 2^31", total)
	}
	w.wrID = wr.WRID
	w.op = wr.Opcode
	w.flags = wr.Flags
	w.signaled = q.sigAll || wr.Flags&FlagSignaled != 0
	w.imm = wr.Imm
	w.raddr = wr.RemoteAddr
	w.rkey = wr.RKey
	w.compareAdd = wr.CompareAdd
	w.swap = wr.Swap
	w.length = uint32(total)
	w.ah, w.remoteQPN, w.qkey = wr.AH, wr.RemoteQPN, wr.RemoteQKey
	if wr.RemoteQKey&0x80000000 != 0 {
		w.qkey = q.attr.QKey // a controlled Q_Key: the QP's own is sent instead
	}
	q.sq.post()
	return nil
}

// PostRecv posts receive work requests to the QP's own receive queue.
func (q *QP) PostRecv(wrs []RecvWR) (int, error) {
	if q.dev.closed.Load() {
		return 0, ErrDeviceClosed
	}
	if q.srq {
		return 0, errors.New("QP uses a shared receive queue; post to the SRQ")
	}
	q.mu.Lock()
	st := q.state
	q.mu.Unlock()
	if st == StateReset {
		return 0, fmt.Errorf("%w: PostRecv in state RESET", ErrQPState)
	}
	for i := range wrs {
		if err := q.rq.post(&wrs[i]); err != nil {
			return i, err
		}
	}
	if st == StateErr {
		q.mu.Lock()
		if q.state == StateErr {
			q.rq.flush(q.recvCQ, q.qpn)
		}
		q.mu.Unlock()
	}
	return len(wrs), nil
}
