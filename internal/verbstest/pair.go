package verbstest

import (
	"testing"

	"github.com/softrnic/softrnic/verbs"
)

// AllRemote is every remote access right.
const AllRemote = verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic

// AllAccess is every access right an MR can have.
const AllAccess = verbs.AccessLocalWrite | AllRemote

// Side is one end of a test connection: a device, a PD, a send and a receive CQ (one CQ
// for both with SideConfig.SharedCQ) and an RC QP.
type Side struct {
	Ctx      *verbs.Device
	PD       *verbs.PD
	SCQ, RCQ *verbs.CQ
	QP       *verbs.QP
	Chan     *verbs.CompChannel // the receive CQ's completion channel (SideConfig.RecvChannel), else nil
}

// DefaultCap are the queue sizes test QPs get unless a test says otherwise.
var DefaultCap = verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 8, MaxRecvSGE: 8, MaxInlineData: 256}

// SideConfig says how NewSide builds a side; every field is used as is.
type SideConfig struct {
	Cap         verbs.QPCap
	CQE         int  // entries of each CQ
	SigAll      bool // SQSigAll
	SharedCQ    bool // one CQ for sends and receives
	RecvChannel bool // the receive CQ reports to a completion channel of its own (Side.Chan)
}

// NewSide creates a PD, the CQs and an RC QP in RESET on ctx.
func NewSide(t testing.TB, ctx *verbs.Device, c SideConfig) *Side {
	t.Helper()
	s := &Side{Ctx: ctx}
	if c.RecvChannel {
		ch, err := ctx.CreateCompChannel()
		if err != nil {
			t.Fatalf("CreateCompChannel: %v", err)
		}
		s.Chan = ch
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	s.PD = pd
	if c.SharedCQ {
		s.SCQ = MustCQ(t, ctx, c.CQE, s.Chan)
		s.RCQ = s.SCQ
	} else {
		s.SCQ = MustCQ(t, ctx, c.CQE, nil)
		s.RCQ = MustCQ(t, ctx, c.CQE, s.Chan)
	}
	if s.QP, err = pd.CreateQP(&verbs.QPInitAttr{SendCQ: s.SCQ, RecvCQ: s.RCQ, Cap: c.Cap, SQSigAll: c.SigAll}); err != nil {
		t.Fatalf("CreateQP: %v", err)
	}
	return s
}

// MustCQ creates a CQ of cqe entries on ctx, reporting to ch if not nil.
func MustCQ(t testing.TB, ctx *verbs.Device, cqe int, ch *verbs.CompChannel) *verbs.CQ {
	t.Helper()
	cq, err := ctx.CreateCQ(cqe, ch, 0)
	if err != nil {
		t.Fatalf("CreateCQ(%d): %v", cqe, err)
	}
	return cq
}

// Link are the connection attributes a test connects QPs with; every field is used as
// is (unlike verbs.ConnectOptions, zero means zero).
type Link struct {
	MTU             verbs.MTU
	Access          verbs.AccessFlags // QP access flags
	Timeout         uint8
	RetryCnt        uint8
	RNRRetry        uint8
	MinRNRTimer     uint8
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	// Ordering is the delivery mode, set on INIT->RTR with QPAttrOrdering; OrderingOrdered
	// leaves QPAttrOrdering out of the mask (the QP is ordered, as before weak mode).
	Ordering verbs.Ordering
}

// DefaultLink is a link that does not time out spuriously even on a loaded machine (67 ms
// ACK timeout, 7 retries: nothing is lost without fault injection) and retries RNR
// forever after 10 µs.
func DefaultLink() Link {
	return Link{MTU: verbs.MTU1024, Access: AllRemote, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
		MinRNRTimer: 1, MaxRdAtomic: 16, MaxDestRdAtomic: 16}
}

// InMode returns l with delivery mode mode.
func (l Link) InMode(mode verbs.Ordering) Link {
	l.Ordering = mode
	return l
}

// Step is one ModifyQP call: attributes and the mask that selects them.
type Step struct {
	Attr verbs.QPAttr
	Mask verbs.QPAttrMask
}

// Modify applies the step to qp.
func (s Step) Modify(qp *verbs.QP) error {
	a := s.Attr
	return qp.ModifyQP(&a, s.Mask)
}

// With returns s with mask bits added (+) and removed (-) and Attr changed by f.
func (s Step) With(add, remove verbs.QPAttrMask, f func(*verbs.QPAttr)) Step {
	s.Mask = (s.Mask | add) &^ remove
	if f != nil {
		f(&s.Attr)
	}
	return s
}

// InitStep is RESET->INIT with every required attribute.
func InitStep(access verbs.AccessFlags) Step {
	return Step{verbs.QPAttr{QPState: verbs.StateInit, PortNum: 1, QPAccessFlags: access},
		verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags}
}

// RTRStep is INIT->RTR with every required attribute, receiving from remote, plus the
// delivery mode if l is not ordered.
func RTRStep(remote verbs.Endpoint, l Link) Step {
	s := Step{verbs.QPAttr{QPState: verbs.StateRTR, PathMTU: l.MTU, DestQPNum: remote.QPNum, RQPSN: remote.PSN,
		MaxDestRdAtomic: l.MaxDestRdAtomic, MinRNRTimer: l.MinRNRTimer,
		AHAttr: verbs.AHAttr{DGID: remote.GID, DestPort: remote.Port, SrcPort: remote.Port, PortNum: 1, IsGlobal: true, HopLimit: 64}},
		verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN |
			verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer}
	if l.Ordering != verbs.OrderingOrdered {
		s.Attr.Ordering = l.Ordering
		s.Mask |= verbs.QPAttrOrdering
	}
	return s
}

// RTSStep is RTR->RTS with every required attribute, sending from sqPSN.
func RTSStep(sqPSN uint32, l Link) Step {
	return Step{verbs.QPAttr{QPState: verbs.StateRTS, SQPSN: sqPSN, Timeout: l.Timeout, RetryCnt: l.RetryCnt,
		RNRRetry: l.RNRRetry, MaxRdAtomic: l.MaxRdAtomic},
		verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry |
			verbs.QPAttrSQPSN | verbs.QPAttrMaxQPRdAtomic}
}

// MustModify applies s to qp and fails the test on error.
func MustModify(t testing.TB, qp *verbs.QP, s Step) {
	t.Helper()
	if err := s.Modify(qp); err != nil {
		t.Fatalf("ModifyQP(%v -> %v, %v): %v", qp.State(), s.Attr.QPState, s.Mask, err)
	}
}

// ToRTR moves a QP in RESET through INIT to RTR, receiving from remote.
func ToRTR(t testing.TB, qp *verbs.QP, remote verbs.Endpoint, l Link) {
	t.Helper()
	MustModify(t, qp, InitStep(l.Access))
	MustModify(t, qp, RTRStep(remote, l))
}

// Connect moves a QP in RESET to RTS, connected to remote and sending from sqPSN.
func Connect(t testing.TB, qp *verbs.QP, sqPSN uint32, remote verbs.Endpoint, l Link) {
	t.Helper()
	ToRTR(t, qp, remote, l)
	MustModify(t, qp, RTSStep(sqPSN, l))
}

// PairConfig says how NewPair builds a connection; zero fields take defaults.
type PairConfig struct {
	Link Link // default DefaultLink()
	// Options, if set, connects both QPs with QP.Connect and these options (both
	// Endpoints offering Options.Ordering) instead of with Link's exact attributes.
	Options    *verbs.ConnectOptions
	PSNA, PSNB uint32 // first send PSN of A and B (default 0x100 and 0x200)
	DevA, DevB verbs.DeviceConfig
	Cap        verbs.QPCap // default DefaultCap
	CQE        int         // entries of each CQ (default 1024)
	SigAll     bool
	SharedCQ   bool // one CQ per side for sends and receives
	ChannelB   bool // B's receive CQ reports to a completion channel (B.Chan)
}

// NewSides opens two devices (IPA and IPB) and creates a side on each, with QPs in RESET
// for the test to connect; pc's Link, Options and PSNs are not used.
func NewSides(t testing.TB, pc PairConfig) (a, b *Side) {
	t.Helper()
	pc = pc.withDefaults()
	sc := SideConfig{Cap: pc.Cap, CQE: pc.CQE, SigAll: pc.SigAll, SharedCQ: pc.SharedCQ}
	a = NewSide(t, OpenDevice(t, IPA, pc.DevA), sc)
	sc.RecvChannel = pc.ChannelB
	b = NewSide(t, OpenDevice(t, IPB, pc.DevB), sc)
	return a, b
}

func (pc PairConfig) withDefaults() PairConfig {
	if pc.Link == (Link{}) {
		pc.Link = DefaultLink()
	}
	if pc.PSNA == 0 && pc.PSNB == 0 {
		pc.PSNA, pc.PSNB = 0x100, 0x200
	}
	if pc.Cap == (verbs.QPCap{}) {
		pc.Cap = DefaultCap
	}
	if pc.CQE == 0 {
		pc.CQE = 1024
	}
	return pc
}

// NewPair opens two devices (IPA and IPB) and connects a QP on each to the other, both in
// the link's (or the options') delivery mode.
func NewPair(t testing.TB, pc PairConfig) (a, b *Side) {
	t.Helper()
	pc = pc.withDefaults()
	a, b = NewSides(t, pc)
	want := pc.Link.Ordering
	if o := pc.Options; o != nil {
		epA, epB := a.QP.Endpoint(pc.PSNA), b.QP.Endpoint(pc.PSNB)
		epA.Ordering, epB.Ordering = o.Ordering, o.Ordering
		if err := a.QP.Connect(pc.PSNA, epB, *o); err != nil {
			t.Fatalf("A: Connect: %v", err)
		}
		if err := b.QP.Connect(pc.PSNB, epA, *o); err != nil {
			t.Fatalf("B: Connect: %v", err)
		}
		want = o.Ordering
	} else {
		Connect(t, a.QP, pc.PSNA, b.QP.Endpoint(pc.PSNB), pc.Link)
		Connect(t, b.QP, pc.PSNB, a.QP.Endpoint(pc.PSNA), pc.Link)
	}
	for _, s := range []*Side{a, b} {
		if attr, _ := s.QP.QueryQP(); attr.Ordering != want {
			t.Fatalf("QP %#x connected in %v mode, want %v", s.QP.QPNum(), attr.Ordering, want)
		}
	}
	return a, b
}
