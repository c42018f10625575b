package transport

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// A QP's attributes: ibv_qp_attr's fields and mask bits, their checks against the
// device's capabilities, and how setting one changes the QP.

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

// Attr are QP attributes: the ibv_qp_attr fields that apply to RC and UD, and weak mode's.
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

// DeviceCaps are the device's capabilities that bound a QP's attribute values
// (ibv_device_attr's max_qp_init_rd_atom and max_qp_rd_atom).
type DeviceCaps struct {
	MaxRdAtomic     int // the most READ requests and atomics a QP may have outstanding (max_rd_atomic)
	MaxDestRdAtomic int // the most a QP may answer at once (max_dest_rd_atomic)
}

// Query returns the QP's attributes.
func (q *QP) Query() Attr {
	q.mu.Lock()
	defer q.mu.Unlock()
	a := q.attr
	a.State, a.CurState = q.state, q.state
	return a
}

func (q *QP) checkAttr(a *Attr, mask uint32, caps DeviceCaps, peer *netio.Addr) error {
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
	if mask&MaskMaxQPRdAtomic != 0 && int(a.MaxRdAtomic) > caps.MaxRdAtomic {
		return fmt.Errorf("max_rd_atomic %d exceeds the device's max_qp_init_rd_atom %d", a.MaxRdAtomic, caps.MaxRdAtomic)
	}
	if mask&MaskMaxDestRdAtomic != 0 && int(a.MaxDestRdAtomic) > caps.MaxDestRdAtomic {
		return fmt.Errorf("max_dest_rd_atomic %d exceeds the device's max_qp_rd_atom %d", a.MaxDestRdAtomic, caps.MaxDestRdAtomic)
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
