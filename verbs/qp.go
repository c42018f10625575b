package verbs

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/transport"
	"github.com/softrnic/softrnic/internal/wire"
)

// QPType is the transport service of a QP (ibv_qp_type values): reliable connection
// or unreliable datagram.
type QPType int

// QP types.
const (
	QPTypeRC QPType = 2
	// QPTypeUD is the unreliable datagram service: a QP sends one-packet SENDs (at most
	// the 4096-byte MTU) to any UD QP through an address handle (CreateAH), with the
	// peer's QP number and Q_Key in the work request; nothing acknowledges them. Receive
	// buffers start with the 40-byte GRH area (ParseGRH). QP0 and QP1 are the device's.
	QPTypeUD QPType = 4
)

func (t QPType) String() string {
	switch t {
	case QPTypeRC:
		return "RC"
	case QPTypeUD:
		return "UD"
	}
	return fmt.Sprintf("QP type %d", int(t))
}

// QPCap are a QP's queue sizes (ibv_qp_cap).
type QPCap struct {
	MaxSendWR     int
	MaxRecvWR     int
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int
}

// QPInitAttr is what CreateQP takes (ibv_qp_init_attr).
type QPInitAttr struct {
	SendCQ *CQ
	RecvCQ *CQ
	// SRQ, if set, is the shared receive queue the QP takes its receive WQEs from; the QP
	// then has no receive queue of its own (Cap.MaxRecvWR and MaxRecvSGE are ignored) and
	// PostRecv on it fails.
	SRQ *SRQ
	Cap QPCap
	// QPType is QPTypeRC (zero means QPTypeRC) or QPTypeUD.
	QPType QPType
	// SQSigAll makes every send work request signaled.
	SQSigAll bool
}

// QP is a queue pair (ibv_qp): reliable connected or unreliable datagram.
type QP struct {
	pd   *PD
	qp   *transport.QP
	init QPInitAttr
	dead bool

	mu sync.Mutex
	ah AHAttr // the address vector as last set, for QueryQP
}

// CreateQP creates a queue pair in the RESET state.
func (pd *PD) CreateQP(attr *QPInitAttr) (*QP, error) {
	if attr == nil {
		return nil, fmt.Errorf("verbs: CreateQP: %w: nil attributes", ErrInvalid)
	}
	a := *attr
	if a.QPType == 0 {
		a.QPType = QPTypeRC
	}
	service := transport.ServiceRC
	switch a.QPType {
	case QPTypeRC:
	case QPTypeUD:
		service = transport.ServiceUD
	default:
		return nil, fmt.Errorf("verbs: CreateQP: %w: %v (RC and UD are supported)", ErrInvalid, a.QPType)
	}
	c := pd.ctx
	if a.SendCQ == nil || a.RecvCQ == nil {
		return nil, fmt.Errorf("verbs: CreateQP: %w: a send CQ and a receive CQ are required", ErrInvalid)
	}
	if a.SendCQ.ctx != c || a.RecvCQ.ctx != c {
		return nil, fmt.Errorf("verbs: CreateQP: %w: CQ belongs to another device", ErrInvalid)
	}
	cp := &a.Cap
	switch {
	case cp.MaxSendWR < 1 || cp.MaxSendWR > maxQPWR:
		return nil, fmt.Errorf("verbs: CreateQP: %w: max_send_wr %d not in 1..%d", ErrInvalid, cp.MaxSendWR, maxQPWR)
	case a.SRQ == nil && (cp.MaxRecvWR < 1 || cp.MaxRecvWR > maxQPWR):
		return nil, fmt.Errorf("verbs: CreateQP: %w: max_recv_wr %d not in 1..%d", ErrInvalid, cp.MaxRecvWR, maxQPWR)
	case cp.MaxSendSGE < 0 || cp.MaxSendSGE > maxSGE:
		return nil, fmt.Errorf("verbs: CreateQP: %w: max_send_sge %d not in 0..%d", ErrInvalid, cp.MaxSendSGE, maxSGE)
	case cp.MaxRecvSGE < 0 || cp.MaxRecvSGE > maxSGE:
		return nil, fmt.Errorf("verbs: CreateQP: %w: max_recv_sge %d not in 0..%d", ErrInvalid, cp.MaxRecvSGE, maxSGE)
	case cp.MaxInlineData < 0 || cp.MaxInlineData > maxInline:
		return nil, fmt.Errorf("verbs: CreateQP: %w: max_inline_data %d not in 0..%d", ErrInvalid, cp.MaxInlineData, maxInline)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if a.SendCQ.dead || a.RecvCQ.dead {
		return nil, fmt.Errorf("verbs: CreateQP: CQ was destroyed: %w", ErrClosed)
	}
	var srq *transport.RecvQueue
	if a.SRQ != nil {
		if a.SRQ.dead {
			return nil, fmt.Errorf("verbs: CreateQP: SRQ was destroyed: %w", ErrClosed)
		}
		if a.SRQ.pd != pd {
			return nil, fmt.Errorf("verbs: CreateQP: %w: the SRQ belongs to another protection domain", ErrInvalid)
		}
		srq = a.SRQ.rq
		cp.MaxRecvWR, cp.MaxRecvSGE = 0, 0
	}
	if c.qps >= maxQP {
		return nil, fmt.Errorf("verbs: CreateQP: %w (max_qp %d)", ErrLimit, maxQP)
	}
	if err := pd.use(); err != nil {
		return nil, fmt.Errorf("verbs: CreateQP: %w", err)
	}
	tq, err := c.dev.CreateQP(transport.QPConfig{
		Service: service, PD: pd.id, SendCQ: a.SendCQ.cq, RecvCQ: a.RecvCQ.cq, SRQ: srq,
		MaxSendWR: cp.MaxSendWR, MaxRecvWR: cp.MaxRecvWR, MaxSendSGE: cp.MaxSendSGE,
		MaxRecvSGE: cp.MaxRecvSGE, MaxInline: cp.MaxInlineData, SigAll: a.SQSigAll,
	})
	if err != nil {
		pd.users--
		return nil, fmt.Errorf("verbs: CreateQP: %w: %v", ErrLimit, err)
	}
	q := &QP{pd: pd, qp: tq, init: a}
	tq.Owner = q
	a.SendCQ.users++
	a.RecvCQ.users++
	if a.SRQ != nil {
		a.SRQ.qps++
	}
	c.qps++
	c.qpSet[q] = struct{}{}
	return q, nil
}

// QPNum returns the QP number peers send to.
func (q *QP) QPNum() uint32 { return q.qp.QPN() }

// State returns the QP's current state.
func (q *QP) State() QPState { return QPState(q.qp.State()) }

// PD returns the QP's protection domain.
func (q *QP) PD() *PD { return q.pd }

// DestroyQP destroys the QP. Work still queued is dropped without completions, as
// ibv_destroy_qp does; it waits until the QP's asynchronous events taken with
// GetAsyncEvent were acknowledged.
func (q *QP) DestroyQP() error {
	c := q.pd.ctx
	c.mu.Lock()
	if q.dead {
		c.mu.Unlock()
		return fmt.Errorf("verbs: DestroyQP: %w", ErrClosed)
	}
	q.dead = true
	q.init.SendCQ.users--
	q.init.RecvCQ.users--
	if q.init.SRQ != nil {
		q.init.SRQ.qps--
	}
	q.pd.users--
	c.qps--
	delete(c.qpSet, q)
	c.mu.Unlock()
	q.qp.Destroy()
	c.events.forget(q)
	return nil
}

// QPState is a QP state (ibv_qp_state values).
type QPState int

// QP states.
const (
	StateReset QPState = QPState(transport.StateReset)
	StateInit  QPState = QPState(transport.StateInit)
	StateRTR   QPState = QPState(transport.StateRTR)
	StateRTS   QPState = QPState(transport.StateRTS)
	StateSQD   QPState = QPState(transport.StateSQD)
	StateSQE   QPState = QPState(transport.StateSQE)
	StateErr   QPState = QPState(transport.StateErr)
)

func (s QPState) String() string { return transport.QPState(s).String() }

// MTU is a path MTU enum value (ibv_mtu).
type MTU int

// Path MTUs.
const (
	MTU256  MTU = wire.MTU256
	MTU512  MTU = wire.MTU512
	MTU1024 MTU = wire.MTU1024
	MTU2048 MTU = wire.MTU2048
	MTU4096 MTU = wire.MTU4096
)

// Bytes returns the MTU's payload size, or 0 for an invalid value.
func (m MTU) Bytes() int { return wire.MTUBytes(uint8(m)) }

// MTUFromBytes returns the MTU enum for 256, 512, 1024, 2048 or 4096.
func MTUFromBytes(n int) (MTU, error) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, nil
		}
	}
	return 0, fmt.Errorf("%w: MTU %d (want 256, 512, 1024, 2048 or 4096)", ErrInvalid, n)
}

// AHAttr is an address vector (ibv_ah_attr): where the peer QP is. For RoCEv2 the
// destination GID is the peer device's IP address.
type AHAttr struct {
	DGID         GID
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
	FlowLabel    uint32
	SL           uint8
	PortNum      uint8
	IsGlobal     bool
	// DestPort is the peer device's UDP port (a softrnic extension; 0 means 4791).
	DestPort uint16
	// SrcPort, when not 0, is the only UDP source port the QP accepts packets from (a
	// softrnic extension). A softrnic device sends every packet from its own port, so
	// Connect sets it to the peer Endpoint's Port; standard RoCEv2 peers choose a source
	// port per QP (flow entropy) that the connection setup does not carry, so for them it
	// stays 0 and only the peer's address is checked. See docs/security.md.
	SrcPort uint16
}

// QPAttr are QP attributes (ibv_qp_attr fields used by RC and UD QPs).
type QPAttr struct {
	QPState QPState
	// QKey is a UD QP's Q_Key (set on RESET->INIT, QPAttrQKey): datagrams that carry
	// another are dropped and counted (Counters().QKeyErrors).
	QKey             uint32
	CurQPState       QPState
	PathMTU          MTU
	QPAccessFlags    AccessFlags
	PKeyIndex        uint16
	PortNum          uint8
	AHAttr           AHAttr
	DestQPNum        uint32
	RQPSN            uint32
	SQPSN            uint32
	MaxRdAtomic      uint8 // outstanding READ/atomic as initiator
	MaxDestRdAtomic  uint8 // READ/atomic responder resources
	MinRNRTimer      uint8
	Timeout          uint8
	RetryCnt         uint8
	RNRRetry         uint8
	EnSQDAsyncNotify bool
	Cap              QPCap // reported by QueryQP
	// Ordering (a softrnic extension, set on INIT->RTR with QPAttrOrdering) selects
	// ordered (standard RC) or weakly-ordered mode; both sides must use the same. MaxHole
	// is weak mode's arrival bitmap span in PSNs: the largest hole, and the requester's
	// window (0: 2048; a power of two from 64 to 65536).
	Ordering Ordering
	MaxHole  uint32
}

// Ordering is a QP's delivery mode.
type Ordering int

// Orderings.
const (
	// OrderingOrdered (the zero value, the default) is standard RC: packets are placed in
	// order; a lost packet makes the requester go back and resend everything after it
	// (go-back-N).
	OrderingOrdered Ordering = Ordering(transport.Ordered)
	// OrderingWeak places every packet the moment it arrives (packets carry what is needed
	// to place them, in manufacturer-specific opcodes), completes work requests in order
	// when the holes before them close, and resends only lost packets (selective
	// acknowledgement). Bytes of a message may land in any order: wait for a completion,
	// do not poll the last byte of a buffer.
	OrderingWeak Ordering = Ordering(transport.Weak)
)

func (o Ordering) String() string { return transport.Ordering(o).String() }

// QPAttrMask selects the QPAttr fields ModifyQP applies (ibv_qp_attr_mask values).
type QPAttrMask uint32

// Attribute mask bits.
const (
	QPAttrState            QPAttrMask = QPAttrMask(transport.MaskState)
	QPAttrCurState         QPAttrMask = QPAttrMask(transport.MaskCurState)
	QPAttrEnSQDAsyncNotify QPAttrMask = QPAttrMask(transport.MaskEnSQDAsyncNotif)
	QPAttrAccessFlags      QPAttrMask = QPAttrMask(transport.MaskAccessFlags)
	QPAttrPKeyIndex        QPAttrMask = QPAttrMask(transport.MaskPKeyIndex)
	QPAttrPort             QPAttrMask = QPAttrMask(transport.MaskPort)
	QPAttrQKey             QPAttrMask = QPAttrMask(transport.MaskQKey)
	QPAttrAV               QPAttrMask = QPAttrMask(transport.MaskAV)
	QPAttrPathMTU          QPAttrMask = QPAttrMask(transport.MaskPathMTU)
	QPAttrTimeout          QPAttrMask = QPAttrMask(transport.MaskTimeout)
	QPAttrRetryCnt         QPAttrMask = QPAttrMask(transport.MaskRetryCnt)
	QPAttrRNRRetry         QPAttrMask = QPAttrMask(transport.MaskRNRRetry)
	QPAttrRQPSN            QPAttrMask = QPAttrMask(transport.MaskRQPSN)
	QPAttrMaxQPRdAtomic    QPAttrMask = QPAttrMask(transport.MaskMaxQPRdAtomic)
	QPAttrAltPath          QPAttrMask = QPAttrMask(transport.MaskAltPath)
	QPAttrMinRNRTimer      QPAttrMask = QPAttrMask(transport.MaskMinRNRTimer)
	QPAttrSQPSN            QPAttrMask = QPAttrMask(transport.MaskSQPSN)
	QPAttrMaxDestRdAtomic  QPAttrMask = QPAttrMask(transport.MaskMaxDestRdAtomic)
	QPAttrPathMigState     QPAttrMask = QPAttrMask(transport.MaskPathMigState)
	QPAttrCap              QPAttrMask = QPAttrMask(transport.MaskCap)
	QPAttrDestQPN          QPAttrMask = QPAttrMask(transport.MaskDestQPN)
	// QPAttrOrdering applies QPAttr.Ordering and QPAttr.MaxHole (softrnic extension; allowed
	// on INIT->RTR).
	QPAttrOrdering QPAttrMask = QPAttrMask(transport.MaskOrdering)
)

// String names the mask's bits, e.g. "STATE|AV|PATH_MTU"; "0" for none.
func (m QPAttrMask) String() string {
	if m == 0 {
		return "0"
	}
	return transport.MaskString(uint32(m))
}

// ModifyQP changes the QP's attributes and state with ibv_modify_qp's rules: each
// transition requires and allows exactly the attributes the IBTA state table lists for
// RC (RESET->INIT: PKEY_INDEX, PORT, ACCESS_FLAGS; INIT->RTR: AV, PATH_MTU, DEST_QPN,
// RQ_PSN, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER; RTR->RTS: TIMEOUT, RETRY_CNT, RNR_RETRY,
// SQ_PSN, MAX_QP_RD_ATOMIC; any state -> RESET or ERR). An invalid mask, transition or
// value is an error and changes nothing.
func (q *QP) ModifyQP(attr *QPAttr, mask QPAttrMask) error {
	if attr == nil {
		return fmt.Errorf("verbs: ModifyQP: %w: nil attributes", ErrInvalid)
	}
	ta := transport.Attr{
		State: transport.QPState(attr.QPState), CurState: transport.QPState(attr.CurQPState),
		PathMTU: uint8(attr.PathMTU), DestQPN: attr.DestQPNum, RQPSN: wire.PSN(attr.RQPSN), SQPSN: wire.PSN(attr.SQPSN),
		MaxRdAtomic: attr.MaxRdAtomic, MaxDestRdAtomic: attr.MaxDestRdAtomic, MinRNRTimer: attr.MinRNRTimer,
		Timeout: attr.Timeout, RetryCnt: attr.RetryCnt, RNRRetry: attr.RNRRetry,
		Access: tpt.Access(attr.QPAccessFlags), PKeyIndex: attr.PKeyIndex, Port: attr.PortNum,
		SQDNotify: attr.EnSQDAsyncNotify, Ordering: transport.Ordering(attr.Ordering), MaxHole: attr.MaxHole,
		QKey: attr.QKey,
	}
	if attr.Ordering < OrderingOrdered || attr.Ordering > OrderingWeak {
		ta.Ordering = 255
	}
	if attr.QPState < StateReset || attr.QPState > StateErr {
		ta.State = 255
	}
	if mask&QPAttrAV != 0 {
		ah := &attr.AHAttr
		if ah.DGID.IsZero() {
			return fmt.Errorf("verbs: ModifyQP: %w: address vector has no destination GID", ErrInvalid)
		}
		port := ah.DestPort
		if port == 0 {
			port = DefaultPort
		}
		ta.Peer = netip.AddrPortFrom(ah.DGID.Addr(), port)
		ta.PeerSrcPort = ah.SrcPort
	}
	if mask&QPAttrPathMTU != 0 && q.init.QPType != QPTypeUD {
		if err := q.pd.ctx.checkPathMTU(attr.PathMTU); err != nil {
			return fmt.Errorf("verbs: ModifyQP: %w", err)
		}
	}
	if mask&QPAttrPort != 0 && attr.PortNum == 0 {
		return fmt.Errorf("verbs: ModifyQP: %w: port_num 0 (the device's port is 1)", ErrInvalid)
	}
	if err := q.qp.Modify(&ta, uint32(mask), transport.DeviceCaps{MaxRdAtomic: maxQPRdAtom, MaxDestRdAtomic: maxQPRdAtom}); err != nil {
		if errors.Is(err, transport.ErrDestroyed) {
			return fmt.Errorf("verbs: ModifyQP: %v: %w", err, ErrClosed)
		}
		return fmt.Errorf("verbs: ModifyQP: %w: %v", ErrInvalid, err)
	}
	q.mu.Lock()
	switch {
	case mask&QPAttrAV != 0:
		q.ah = attr.AHAttr
		if q.ah.DestPort == 0 {
			q.ah.DestPort = DefaultPort
		}
	case mask&QPAttrState != 0 && attr.QPState == StateReset:
		q.ah = AHAttr{}
	}
	q.mu.Unlock()
	return nil
}

// QueryQP returns the QP's attributes and creation attributes.
func (q *QP) QueryQP() (QPAttr, QPInitAttr) {
	a := q.qp.Query()
	attr := QPAttr{
		QPState: QPState(a.State), CurQPState: QPState(a.State), PathMTU: MTU(a.PathMTU),
		QPAccessFlags: AccessFlags(a.Access), PKeyIndex: a.PKeyIndex, PortNum: a.Port,
		DestQPNum: a.DestQPN, RQPSN: uint32(a.RQPSN), SQPSN: uint32(a.SQPSN), MaxRdAtomic: a.MaxRdAtomic,
		MaxDestRdAtomic: a.MaxDestRdAtomic, MinRNRTimer: a.MinRNRTimer, Timeout: a.Timeout,
		RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry, Cap: q.init.Cap,
		Ordering: Ordering(a.Ordering), MaxHole: a.MaxHole, QKey: a.QKey,
	}
	q.mu.Lock()
	attr.AHAttr = q.ah
	q.mu.Unlock()
	return attr, q.init
}

// WROpcode is a send work request's operation (ibv_wr_opcode values).
type WROpcode int

// Send work request opcodes.
const (
	WRRDMAWrite         WROpcode = WROpcode(transport.WRWrite)
	WRRDMAWriteWithImm  WROpcode = WROpcode(transport.WRWriteImm)
	WRSend              WROpcode = WROpcode(transport.WRSend)
	WRSendWithImm       WROpcode = WROpcode(transport.WRSendImm)
	WRRDMARead          WROpcode = WROpcode(transport.WRRead)
	WRAtomicCmpAndSwp   WROpcode = WROpcode(transport.WRAtomicCmpSwap)
	WRAtomicFetchAndAdd WROpcode = WROpcode(transport.WRAtomicFetch)
)

// SendFlags modify a send work request (ibv_send_flags values).
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = SendFlags(transport.FlagFence)     // wait for earlier READs and atomics
	SendSignaled  SendFlags = SendFlags(transport.FlagSignaled)  // generate a completion
	SendSolicited SendFlags = SendFlags(transport.FlagSolicited) // set the solicited event bit
	SendInline    SendFlags = SendFlags(transport.FlagInline)    // copy the data at post time
)

// SGE is a scatter/gather element (ibv_sge): its fields say Length bytes at Addr (an IOVA)
// of the region with LKey. It is the engine's own type (an alias), so a scatter/gather
// list goes to the engine as it is, with no copy and no conversion.
type SGE = transport.SGE

// SendWR is a send work request (ibv_send_wr, with the rdma and atomic fields flattened).
type SendWR struct {
	WRID      uint64
	SGList    []SGE
	Opcode    WROpcode
	SendFlags SendFlags
	ImmData   uint32 // host byte order; sent big-endian
	// RemoteAddr and RKey address the peer's memory for RDMA and atomic operations.
	RemoteAddr uint64
	RKey       uint32
	// CompareAdd is the compare value of CmpAndSwp or the addend of FetchAndAdd; Swap is
	// CmpAndSwp's new value.
	CompareAdd uint64
	Swap       uint64
	// UD (ibv_send_wr.wr.ud): the address handle of the peer's device, the peer QP's
	// number and the Q_Key to send (one with the high bit set sends the QP's own Q_Key).
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

// RecvWR is a receive work request (ibv_recv_wr).
type RecvWR struct {
	WRID   uint64
	SGList []SGE
}

// PostError says which work request of a post was refused and why. The ones before it
// were posted; it and the ones after were not. Err wraps ErrInvalid (a work request the
// QP cannot take: its opcode, flags, number of SGEs, or an SGE outside its region),
// ErrLimit (the queue is full) or ErrClosed (the QP, SRQ or device was destroyed or
// closed).
type PostError struct {
	Op    string // the refused call: "PostSend", "PostRecv" or "PostSRQRecv"
	Index int
	Err   error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("verbs: %s: work request %d refused: %v", e.Op, e.Index, e.Err)
}

// Unwrap returns the reason.
func (e *PostError) Unwrap() error { return e.Err }

// postChunk is how many work requests are converted per step (on the stack).
const postChunk = 16

// PostSend posts send work requests. A *PostError says which one was refused. Every SGE
// must lie within the region its LKey names: one that reaches outside is refused here,
// with the indices of its work request and of the SGE (libibverbs leaves that to the
// device, which fails the work request with a local protection error).
func (q *QP) PostSend(wrs []SendWR) error {
	var buf [postChunk]transport.SendWR
	for done := 0; done < len(wrs); {
		n := min(postChunk, len(wrs)-done)
		for i := 0; i < n; i++ {
			w := &wrs[done+i]
			if w.Opcode < WRRDMAWrite || w.Opcode > WRAtomicFetchAndAdd {
				if posted, err := q.qp.PostSend(buf[:i]); err != nil {
					return &PostError{Op: "PostSend", Index: done + posted, Err: postReason(err)}
				}
				return &PostError{Op: "PostSend", Index: done + i, Err: fmt.Errorf("%w: unknown opcode %d", ErrInvalid, int(w.Opcode))}
			}
			buf[i] = transport.SendWR{
				WRID: w.WRID, SG: w.SGList, Opcode: uint8(w.Opcode), Flags: uint8(w.SendFlags),
				Imm: w.ImmData, RemoteAddr: w.RemoteAddr, RKey: w.RKey, CompareAdd: w.CompareAdd, Swap: w.Swap,
				RemoteQPN: w.RemoteQPN, RemoteQKey: w.RemoteQKey,
			}
			if w.AH != nil {
				ah, err := w.AH.use(q.pd)
				if err != nil {
					if posted, perr := q.qp.PostSend(buf[:i]); perr != nil {
						return &PostError{Op: "PostSend", Index: done + posted, Err: postReason(perr)}
					}
					return &PostError{Op: "PostSend", Index: done + i, Err: err}
				}
				buf[i].AH = ah
			}
		}
		posted, err := q.qp.PostSend(buf[:n])
		clear(buf[:n])
		if err != nil {
			return &PostError{Op: "PostSend", Index: done + posted, Err: postReason(err)}
		}
		done += n
	}
	return nil
}

// postReason wraps an engine refusal in the matching verbs error: a closed device or a
// destroyed QP or SRQ is ErrClosed, a full queue ErrLimit, everything else ErrInvalid.
func postReason(err error) error {
	if errors.Is(err, transport.ErrDeviceClosed) || errors.Is(err, transport.ErrDestroyed) {
		return fmt.Errorf("%w: %v", ErrClosed, err)
	}
	if errors.Is(err, transport.ErrSQFull) || errors.Is(err, transport.ErrQueueFull) {
		return fmt.Errorf("%w: %v", ErrLimit, err)
	}
	return fmt.Errorf("%w: %v", ErrInvalid, err)
}

// PostRecv posts receive work requests. A *PostError says which one was refused; as with
// PostSend, an SGE outside its region is refused here.
func (q *QP) PostRecv(wrs []RecvWR) error {
	var buf [postChunk]transport.RecvWR
	for done := 0; done < len(wrs); {
		n := min(postChunk, len(wrs)-done)
		for i := 0; i < n; i++ {
			buf[i] = transport.RecvWR{WRID: wrs[done+i].WRID, SG: wrs[done+i].SGList}
		}
		posted, err := q.qp.PostRecv(buf[:n])
		clear(buf[:n])
		if err != nil {
			return &PostError{Op: "PostRecv", Index: done + posted, Err: postReason(err)}
		}
		done += n
	}
	return nil
}

// Counters are packet counters of a QP or a device.
type Counters struct {
	TxPackets, TxBytes uint64
	RxPackets, RxBytes uint64
	Retransmits        uint64 // request packets sent again
	NAKsSent           uint64 // NAKs sent (PSN sequence error, invalid request, access, operational)
	NAKsReceived       uint64
	RNRNAKsSent        uint64
	RNRNAKsReceived    uint64
	Duplicates         uint64 // duplicate requests and responses received
	OutOfSequence      uint64 // requests ahead of the expected PSN, responses out of order
	Timeouts           uint64 // local ACK timeouts
	WrongSource        uint64 // packets from an address other than the QP's peer
	WrongMode          uint64 // packets of the other ordering mode (weak vs ordered), dropped
	Dropped            uint64 // packets dropped for the QP's state or a protocol violation
	QKeyErrors         uint64 // UD: datagrams dropped for carrying another Q_Key
	// Weakly-ordered mode.
	PlacedOutOfOrder     uint64 // packets placed while an earlier PSN was missing
	HolesOpened          uint64 // holes in the PSN space (request and response streams)
	HolesClosed          uint64
	SACKsSent            uint64 // selective acknowledgements sent and received
	SACKsReceived        uint64
	SelectiveRetransmits uint64 // lost packets sent again alone
	BeyondSpan           uint64 // packets dropped for lying past the arrival bitmap
	ICRCErrors           uint64 // device only: bad ICRC
	Malformed            uint64 // device only: undecodable header or bad P_Key
	UnknownQP            uint64 // device only: no such destination QP
	// Device only: RDMA WRITE packets whose payload was copied into the region in the same
	// pass as their ICRC check (the next packet of a WRITE in progress, in ordered mode;
	// see docs/performance.md, "Where one flow's time goes").
	DirectPlaced uint64
	// Device only: what fault injection did to outgoing datagrams.
	FaultsLost, FaultsReordered, FaultsDuplicated, FaultsCorrupted uint64
	// Device only: socket system calls (sendmmsg calls, and recvmmsg calls that returned
	// datagrams) and GSO messages (each carries several packets in one datagram).
	SendCalls, RecvCalls, GSOSends uint64
	// Device only: datagrams the kernel refused to send (counted and dropped, as a network
	// drops them; the transport's retransmission recovers) and sends that waited for
	// socket buffer space.
	SendErrors, SendBlocked uint64
	// Device only: each receive queue's counters (DeviceConfig.Queues).
	Queues []QueueCounters `json:",omitempty"`
}

// QueueCounters are one receive queue's counters: the packets its socket received
// (RxPackets, RxBytes, in recvmmsg calls that returned datagrams: RecvCalls), and packets
// for a QP of another queue (Misrouted: the kernel steers by QP, so only crafted or stale
// packets; dropped and counted in UnknownQP).
type QueueCounters struct {
	RxPackets, RxBytes, RecvCalls, Misrouted uint64
}

func countersFrom(s transport.Stats) Counters {
	return Counters{
		TxPackets: s.TxPackets, TxBytes: s.TxBytes, RxPackets: s.RxPackets, RxBytes: s.RxBytes,
		Retransmits: s.Retransmits, NAKsSent: s.NAKsSent, NAKsReceived: s.NAKsRecv,
		RNRNAKsSent: s.RNRNAKsSent, RNRNAKsReceived: s.RNRNAKsRecv, Duplicates: s.Duplicates,
		OutOfSequence: s.OutOfSequence, Timeouts: s.Timeouts, WrongSource: s.WrongSource,
		WrongMode: s.WrongMode, QKeyErrors: s.QKeyErrors,
		Dropped: s.Dropped, ICRCErrors: s.ICRCErrors, Malformed: s.Malformed, UnknownQP: s.UnknownQP,
		PlacedOutOfOrder: s.PlacedOutOfOrder, HolesOpened: s.HolesOpened, HolesClosed: s.HolesClosed,
		SACKsSent: s.SACKsSent, SACKsReceived: s.SACKsRecv, SelectiveRetransmits: s.SelectiveRetransmits,
		BeyondSpan: s.BeyondSpan, DirectPlaced: s.DirectPlaced,
	}
}

// Hole is an open hole in a weakly-ordered QP's PSN space: PSNs [Start, End) are missing,
// and the counts say what completed beyond it and waits for it to close.
type Hole struct {
	Start, End uint32
	// Responder holes (request PSNs received): receive completions (SEND, WRITE with
	// immediate) whose CQEs are posted when the hole closes, READ requests whose responses
	// are prepared and wait for the doorbell that rings when it closes, and atomics that
	// execute when it closes. Requester holes (own requests not yet acknowledged or
	// answered): READ work requests whose responses all arrived, SEND and WRITE work
	// requests acknowledged, and atomics answered; they complete when it closes.
	RecvCompletions, ReadRequestsHeld, AtomicsHeld      int
	ReadResponsesCompleted, SendsAcked, AtomicsAnswered int
}

// HoleReport lists a QP's open holes, in PSN order.
type HoleReport struct {
	Responder []Hole // in the request PSNs this QP receives
	Requester []Hole // in the PSNs of this QP's own requests
}

// Holes returns the QP's open holes (none in ordered mode).
func (q *QP) Holes() HoleReport {
	h := q.qp.Holes()
	var r HoleReport
	for _, x := range h.Responder {
		r.Responder = append(r.Responder, Hole{Start: uint32(x.Start), End: uint32(x.End),
			RecvCompletions: int(x.Counts[0]), ReadRequestsHeld: int(x.Counts[1]), AtomicsHeld: int(x.Counts[2])})
	}
	for _, x := range h.Requester {
		r.Requester = append(r.Requester, Hole{Start: uint32(x.Start), End: uint32(x.End),
			SendsAcked: int(x.Counts[0]), ReadResponsesCompleted: int(x.Counts[1]), AtomicsAnswered: int(x.Counts[2])})
	}
	return r
}

// Counters returns the QP's packet counters.
func (q *QP) Counters() Counters { return countersFrom(q.qp.Stats()) }

// Counters returns the device's packet counters (sums over its QPs, live and destroyed,
// plus receive-path drops and fault injection).
func (c *Device) Counters() Counters {
	k := countersFrom(c.dev.Stats())
	f := c.dev.Conn().FaultCounters()
	k.FaultsLost, k.FaultsReordered, k.FaultsDuplicated, k.FaultsCorrupted = f.Lost, f.Reordered, f.Duplicated, f.Corrupted
	conn := c.dev.Conn()
	k.SendCalls, k.GSOSends = conn.SendCalls.Load(), conn.GSOSends.Load()
	for _, q := range c.dev.QueueStats() {
		k.RecvCalls += q.RecvCalls
		k.Queues = append(k.Queues, QueueCounters{RxPackets: q.RxPackets, RxBytes: q.RxBytes, RecvCalls: q.RecvCalls, Misrouted: q.Misrouted})
	}
	k.SendErrors, k.SendBlocked = conn.SendErrors.Load(), conn.WriteBlocked.Load()
	return k
}

// SourcePort returns the UDP port the QP's packets leave from: the device's, or, once
// connected to a standard RoCEv2 peer, one of its DeviceConfig.SourcePorts.
func (q *QP) SourcePort() uint16 { return q.qp.SourcePort() }
