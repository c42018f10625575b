package verbs

import (
	crand "crypto/rand"
	"encoding/binary"
	"fmt"

	"github.com/softrnic/softrnic/internal/transport"
)

// RandomPSN returns a starting PSN drawn from crypto/rand. Use it for every connection (as
// librdmacm does): a peer that cannot see the traffic then has one chance in 2^24 per
// packet of hitting the expected PSN, and a late packet of an earlier connection between the
// same QPs is unlikely to fall into the new one's window.
func RandomPSN() uint32 {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:]) & 0xFFFFFF
}

// Endpoint is what the other side needs to reach a QP: what perftest exchanges over its
// TCP control connection and rdma_cm in its private data.
type Endpoint struct {
	GID   GID    // the device's GID (its IP address)
	Port  uint16 // the device's UDP port
	QPNum uint32
	PSN   uint32 // the first PSN this QP sends
	// Ordering is the mode this side offers: OrderingWeak if it can do weakly-ordered
	// mode and wants to. Connect uses weak mode only if both sides offer it.
	Ordering Ordering
	// MaxHole is the largest arrival-bitmap span (PSNs) this side's weak mode accepts
	// (0: the default, 2048). Connect uses the smaller of the two sides' spans, so that
	// neither sends beyond what the other can hold.
	MaxHole uint32
	// AnySourcePort says the peer's packets may come from any UDP source port of its
	// address: standard RoCEv2 peers (rxe, ConnectX) send each QP's packets from a port of
	// their own choosing (flow entropy) that the connection setup does not carry. Without
	// it the QP accepts only the peer device's Port, as a softrnic device sends from (a
	// check against other processes on the peer's host; see docs/security.md).
	AnySourcePort bool
}

// Endpoint describes this QP for a peer, with psn as its first send PSN (pass the same
// one to Connect; RandomPSN gives a good one). It offers ordered mode; set Ordering to
// OrderingWeak to offer weak mode.
func (q *QP) Endpoint(psn uint32) Endpoint {
	c := q.pd.ctx
	return Endpoint{GID: c.gid, Port: c.Addr().Port(), QPNum: q.QPNum(), PSN: psn & 0xFFFFFF}
}

// DefaultMaxHole is weak mode's arrival-bitmap span when none is given (PSNs).
const DefaultMaxHole = transport.DefaultMaxHole

func orDefault(v, d uint32) uint32 {
	if v == 0 {
		return d
	}
	return v
}

// ConnectOptions are the attributes Connect sets; zero fields take the defaults shown,
// except those named in Zero, whose 0 is used as it is.
type ConnectOptions struct {
	MTU MTU // path MTU (MTU1024)
	// Access is the remote access the QP allows. Left 0 it is write, read and atomic for
	// a QP in RESET, and for a QP already in INIT the rights it was given there (by
	// ModifyQP or cm.InitQP): Connect keeps them. Set (or NoRemoteAccess), it replaces
	// them.
	Access      AccessFlags
	Timeout     uint8 // local ACK timeout, 4.096 µs × 2^Timeout (14: 67 ms)
	RetryCnt    uint8 // transport retries (7)
	RNRRetry    uint8 // RNR retries, 7 = infinite (7)
	MinRNRTimer uint8 // RNR NAK timer code sent to the peer (12: 0.64 ms)
	MaxRdAtomic uint8 // outstanding READ/atomic each way (16)
	// NoRemoteAccess turns remote access off, whatever the QP had (Access is ignored).
	NoRemoteAccess bool
	// Ordering is what this side offers; weak mode is used only if the remote endpoint
	// offers it too (see Endpoint.Ordering). MaxHole is the largest bitmap span this side
	// accepts; the QP uses the smaller of it and the remote Endpoint's MaxHole.
	Ordering Ordering
	MaxHole  uint32
	// Zero names the fields above whose 0 is meant as 0, not as "the default":
	// ZeroTimeout (no local ACK timeout: wait for ever), ZeroRetryCnt (no retries),
	// ZeroRNRRetry (no RNR retries: the first RNR NAK fails the work request),
	// ZeroMinRNRTimer (RNR timer code 0: 655 ms), ZeroMaxRdAtomic (no RDMA READ or atomic
	// in flight either way).
	Zero ZeroFields
}

// ZeroFields is a set of ConnectOptions fields whose 0 is meant literally.
type ZeroFields uint8

// ConnectOptions fields that may be 0 (see ConnectOptions.Zero).
const (
	ZeroTimeout ZeroFields = 1 << iota
	ZeroRetryCnt
	ZeroRNRRetry
	ZeroMinRNRTimer
	ZeroMaxRdAtomic
)

// WithDefaults returns the options Connect applies: zero fields replaced by the defaults
// ConnectOptions names, except those listed in Zero. (Access 0 becomes write, read and
// atomic, what Connect gives a QP in RESET; one in INIT keeps its own.)
func (o ConnectOptions) WithDefaults() ConnectOptions {
	if o.MTU == 0 {
		o.MTU = MTU1024
	}
	if o.Access == 0 && !o.NoRemoteAccess {
		o.Access = AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	}
	if o.NoRemoteAccess {
		o.Access = 0
	}
	def := func(v *uint8, z ZeroFields, d uint8) {
		if *v == 0 && o.Zero&z == 0 {
			*v = d
		}
	}
	def(&o.Timeout, ZeroTimeout, 14)
	def(&o.RetryCnt, ZeroRetryCnt, 7)
	def(&o.RNRRetry, ZeroRNRRetry, 7)
	def(&o.MinRNRTimer, ZeroMinRNRTimer, 12)
	def(&o.MaxRdAtomic, ZeroMaxRdAtomic, 16)
	return o
}

// Connect moves a QP in RESET (or INIT) through INIT and RTR to RTS, connected to remote, sending
// from the local PSN sqPSN. The QP accepts packets only from the remote device's address
// and UDP port (AHAttr.SrcPort). A QP in INIT keeps its remote access rights unless
// o.Access or o.NoRemoteAccess is set.
func (q *QP) Connect(sqPSN uint32, remote Endpoint, o ConnectOptions) error {
	if q.init.QPType == QPTypeUD {
		return fmt.Errorf("verbs: Connect: %w: a UD QP has no peer (address each datagram with an AH)", ErrInvalid)
	}
	keepAccess := o.Access == 0 && !o.NoRemoteAccess && q.State() == StateInit
	o = o.WithDefaults()
	if keepAccess {
		a, _ := q.QueryQP()
		o.Access = a.QPAccessFlags
	}
	ordering := OrderingOrdered
	var maxHole uint32
	if o.Ordering == OrderingWeak && remote.Ordering == OrderingWeak {
		ordering = OrderingWeak
		// The hole span both sides can hold: the smaller of the two.
		maxHole = orDefault(o.MaxHole, DefaultMaxHole)
		maxHole = min(maxHole, orDefault(remote.MaxHole, DefaultMaxHole))
	}
	srcPort := remote.Port
	if remote.AnySourcePort {
		srcPort = 0
	}
	steps := []struct {
		attr QPAttr
		mask QPAttrMask
	}{
		{QPAttr{QPState: StateInit, PortNum: 1, QPAccessFlags: o.Access},
			QPAttrState | QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags},
		{QPAttr{QPState: StateRTR, PathMTU: o.MTU, DestQPNum: remote.QPNum, RQPSN: remote.PSN,
			MaxDestRdAtomic: o.MaxRdAtomic, MinRNRTimer: o.MinRNRTimer, Ordering: ordering, MaxHole: maxHole,
			AHAttr: AHAttr{DGID: remote.GID, DestPort: remote.Port, SrcPort: srcPort, PortNum: 1, IsGlobal: true, HopLimit: 64}},
			QPAttrState | QPAttrAV | QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN | QPAttrMaxDestRdAtomic | QPAttrMinRNRTimer | QPAttrOrdering},
		{QPAttr{QPState: StateRTS, SQPSN: sqPSN & 0xFFFFFF, Timeout: o.Timeout, RetryCnt: o.RetryCnt,
			RNRRetry: o.RNRRetry, MaxRdAtomic: o.MaxRdAtomic},
			QPAttrState | QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrSQPSN | QPAttrMaxQPRdAtomic},
	}
	for _, s := range steps {
		if err := q.ModifyQP(&s.attr, s.mask); err != nil {
			return fmt.Errorf("verbs: Connect to QP %#x: %w", remote.QPNum, err)
		}
	}
	return nil
}
