package verbs_test

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/softrnic/softrnic/internal/transport"
	"github.com/softrnic/softrnic/verbs"
)

// stateBench creates QPs in a chosen state on one device. RTR and RTS QPs point at the
// device itself; nothing is posted to them, so they send nothing.
type stateBench struct {
	t   *testing.T
	ctx *verbs.Device
	pd  *verbs.PD
	cq  *verbs.CQ
}

func newStateBench(t *testing.T) *stateBench {
	ctx := openDevice(t, ipA, verbs.DeviceConfig{})
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	return &stateBench{t: t, ctx: ctx, pd: pd, cq: mustCQ(t, ctx, 64, nil)}
}

// qp returns a new QP in state st.
func (b *stateBench) qp(t *testing.T, st verbs.QPState) *verbs.QP {
	t.Helper()
	qp, err := b.pd.CreateQP(&verbs.QPInitAttr{SendCQ: b.cq, RecvCQ: b.cq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qp.DestroyQP() })
	path := map[verbs.QPState][]verbs.QPState{
		verbs.StateReset: nil,
		verbs.StateInit:  {verbs.StateInit},
		verbs.StateRTR:   {verbs.StateInit, verbs.StateRTR},
		verbs.StateRTS:   {verbs.StateInit, verbs.StateRTR, verbs.StateRTS},
		verbs.StateSQD:   {verbs.StateInit, verbs.StateRTR, verbs.StateRTS, verbs.StateSQD},
		verbs.StateErr:   {verbs.StateInit, verbs.StateRTR, verbs.StateRTS, verbs.StateErr},
	}[st]
	for _, s := range path {
		mustModify(t, qp, stepTo(qp, s))
	}
	if qp.State() != st {
		t.Fatalf("QP in %v, want %v", qp.State(), st)
	}
	return qp
}

// stepTo is the minimal valid step into st from the state before it on the usual path.
func stepTo(qp *verbs.QP, st verbs.QPState) step {
	switch st {
	case verbs.StateInit:
		return initStep(allRemote)
	case verbs.StateRTR:
		return rtrStep(qp.Endpoint(0x300), defaultLink())
	case verbs.StateRTS:
		return rtsStep(0x400, defaultLink())
	}
	return step{Attr: verbs.QPAttr{QPState: st}, Mask: verbs.QPAttrState}
}

// TestQPLegalTransitions checks that every transition the ibv_modify_qp state table
// allows for RC succeeds with its required attributes (and optional ones), moves the QP
// to the new state and is reflected by QueryQP.
func TestQPLegalTransitions(t *testing.T) {
	b := newStateBench(t)
	l := defaultLink()
	self := func(qp *verbs.QP) verbs.Endpoint { return qp.Endpoint(0x300) }
	cases := []struct {
		name  string
		from  verbs.QPState
		step  func(*verbs.QP) step
		want  verbs.QPState
		check func(verbs.QPAttr) error
	}{
		{"RESET->RESET", verbs.StateReset, toState(verbs.StateReset), verbs.StateReset, nil},
		{"RESET->INIT", verbs.StateReset, func(*verbs.QP) step { return initStep(verbs.AccessRemoteRead) }, verbs.StateInit,
			wantAccess(verbs.AccessRemoteRead)},
		{"RESET->ERR", verbs.StateReset, toState(verbs.StateErr), verbs.StateErr, nil},
		{"INIT->INIT", verbs.StateInit, func(*verbs.QP) step {
			return step{Attr: verbs.QPAttr{QPState: verbs.StateInit, PortNum: 1, QPAccessFlags: verbs.AccessRemoteWrite},
				Mask: verbs.QPAttrState | verbs.QPAttrPort | verbs.QPAttrPKeyIndex | verbs.QPAttrAccessFlags}
		}, verbs.StateInit, wantAccess(verbs.AccessRemoteWrite)},
		{"INIT->INIT without the state bit", verbs.StateInit, func(*verbs.QP) step {
			return step{Attr: verbs.QPAttr{QPAccessFlags: verbs.AccessRemoteAtomic}, Mask: verbs.QPAttrAccessFlags}
		}, verbs.StateInit, wantAccess(verbs.AccessRemoteAtomic)},
		{"INIT->RTR", verbs.StateInit, func(qp *verbs.QP) step { return rtrStep(self(qp), l) }, verbs.StateRTR,
			func(a verbs.QPAttr) error {
				if a.PathMTU != l.MTU || a.RQPSN != 0x300 || a.MaxDestRdAtomic != l.MaxDestRdAtomic || a.MinRNRTimer != l.MinRNRTimer {
					return fmt.Errorf("RTR attributes %+v", a)
				}
				return nil
			}},
		{"INIT->RTR weak", verbs.StateInit, func(qp *verbs.QP) step { return rtrStep(self(qp), l.InMode(verbs.OrderingWeak)) },
			verbs.StateRTR, wantOrdering(verbs.OrderingWeak, transport.DefaultMaxHole)},
		{"INIT->RTR weak with max hole 64", verbs.StateInit, func(qp *verbs.QP) step {
			return rtrStep(self(qp), l.InMode(verbs.OrderingWeak)).With(0, 0, func(a *verbs.QPAttr) { a.MaxHole = 64 })
		}, verbs.StateRTR, wantOrdering(verbs.OrderingWeak, 64)},
		{"INIT->RTR weak with max hole 65536", verbs.StateInit, func(qp *verbs.QP) step {
			return rtrStep(self(qp), l.InMode(verbs.OrderingWeak)).With(0, 0, func(a *verbs.QPAttr) { a.MaxHole = 1 << 16 })
		}, verbs.StateRTR, wantOrdering(verbs.OrderingWeak, 1<<16)},
		{"INIT->RTR ordered, explicitly", verbs.StateInit, func(qp *verbs.QP) step {
			return rtrStep(self(qp), l).With(verbs.QPAttrOrdering, 0, func(a *verbs.QPAttr) { a.Ordering = verbs.OrderingOrdered })
		}, verbs.StateRTR, wantOrdering(verbs.OrderingOrdered, 0)},
		{"INIT->RTR with optional access flags and P_Key index", verbs.StateInit, func(qp *verbs.QP) step {
			return rtrStep(self(qp), l).With(verbs.QPAttrAccessFlags|verbs.QPAttrPKeyIndex, 0,
				func(a *verbs.QPAttr) { a.QPAccessFlags = verbs.AccessRemoteRead })
		}, verbs.StateRTR, wantAccess(verbs.AccessRemoteRead)},
		{"INIT->RESET", verbs.StateInit, toState(verbs.StateReset), verbs.StateReset, nil},
		{"INIT->ERR", verbs.StateInit, toState(verbs.StateErr), verbs.StateErr, nil},
		{"RTR->RTS", verbs.StateRTR, func(*verbs.QP) step { return rtsStep(0x77, l) }, verbs.StateRTS,
			func(a verbs.QPAttr) error {
				if a.SQPSN != 0x77 || a.Timeout != l.Timeout || a.RetryCnt != l.RetryCnt || a.RNRRetry != l.RNRRetry || a.MaxRdAtomic != l.MaxRdAtomic {
					return fmt.Errorf("RTS attributes %+v", a)
				}
				return nil
			}},
		{"RTR->RTS with optional cur_state, access flags and min RNR timer", verbs.StateRTR, func(*verbs.QP) step {
			return rtsStep(0x77, l).With(verbs.QPAttrCurState|verbs.QPAttrAccessFlags|verbs.QPAttrMinRNRTimer, 0,
				func(a *verbs.QPAttr) {
					a.CurQPState, a.QPAccessFlags, a.MinRNRTimer = verbs.StateRTR, verbs.AccessRemoteWrite, 20
				})
		}, verbs.StateRTS, func(a verbs.QPAttr) error {
			if a.QPAccessFlags != verbs.AccessRemoteWrite || a.MinRNRTimer != 20 {
				return fmt.Errorf("access %#x, min RNR timer %d", a.QPAccessFlags, a.MinRNRTimer)
			}
			return nil
		}},
		{"RTR->RESET", verbs.StateRTR, toState(verbs.StateReset), verbs.StateReset, nil},
		{"RTR->ERR", verbs.StateRTR, toState(verbs.StateErr), verbs.StateErr, nil},
		{"RTS->RTS", verbs.StateRTS, toState(verbs.StateRTS), verbs.StateRTS, nil},
		{"RTS->RTS with optional attributes", verbs.StateRTS, func(*verbs.QP) step {
			return step{Attr: verbs.QPAttr{QPState: verbs.StateRTS, CurQPState: verbs.StateRTS, QPAccessFlags: verbs.AccessRemoteRead, MinRNRTimer: 3},
				Mask: verbs.QPAttrState | verbs.QPAttrCurState | verbs.QPAttrAccessFlags | verbs.QPAttrMinRNRTimer}
		}, verbs.StateRTS, func(a verbs.QPAttr) error {
			if a.QPAccessFlags != verbs.AccessRemoteRead || a.MinRNRTimer != 3 {
				return fmt.Errorf("access %#x, min RNR timer %d", a.QPAccessFlags, a.MinRNRTimer)
			}
			return nil
		}},
		{"RTS->RTS without the state bit", verbs.StateRTS, func(*verbs.QP) step {
			return step{Attr: verbs.QPAttr{MinRNRTimer: 5}, Mask: verbs.QPAttrMinRNRTimer}
		}, verbs.StateRTS, func(a verbs.QPAttr) error {
			if a.MinRNRTimer != 5 {
				return fmt.Errorf("min RNR timer %d", a.MinRNRTimer)
			}
			return nil
		}},
		{"RTS->SQD", verbs.StateRTS, toState(verbs.StateSQD), verbs.StateSQD, nil},
		{"RTS->SQD with SQD async notify", verbs.StateRTS, func(*verbs.QP) step {
			return step{Attr: verbs.QPAttr{QPState: verbs.StateSQD, EnSQDAsyncNotify: true}, Mask: verbs.QPAttrState | verbs.QPAttrEnSQDAsyncNotify}
		}, verbs.StateSQD, nil},
		{"RTS->RESET", verbs.StateRTS, toState(verbs.StateReset), verbs.StateReset, nil},
		{"RTS->ERR", verbs.StateRTS, toState(verbs.StateErr), verbs.StateErr, nil},
		{"SQD->RTS", verbs.StateSQD, toState(verbs.StateRTS), verbs.StateRTS, nil},
		{"SQD->RTS with cur_state", verbs.StateSQD, func(*verbs.QP) step {
			return step{Attr: verbs.QPAttr{QPState: verbs.StateRTS, CurQPState: verbs.StateSQD}, Mask: verbs.QPAttrState | verbs.QPAttrCurState}
		}, verbs.StateRTS, nil},
		{"SQD->SQD with timeout and retry count", verbs.StateSQD, func(*verbs.QP) step {
			return step{Attr: verbs.QPAttr{QPState: verbs.StateSQD, Timeout: 20, RetryCnt: 3},
				Mask: verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt}
		}, verbs.StateSQD, func(a verbs.QPAttr) error {
			if a.Timeout != 20 || a.RetryCnt != 3 {
				return fmt.Errorf("timeout %d, retry count %d", a.Timeout, a.RetryCnt)
			}
			return nil
		}},
		{"SQD->RESET", verbs.StateSQD, toState(verbs.StateReset), verbs.StateReset, nil},
		{"SQD->ERR", verbs.StateSQD, toState(verbs.StateErr), verbs.StateErr, nil},
		{"ERR->RESET", verbs.StateErr, toState(verbs.StateReset), verbs.StateReset, nil},
		{"ERR->ERR", verbs.StateErr, toState(verbs.StateErr), verbs.StateErr, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			qp := b.qp(t, c.from)
			s := c.step(qp)
			if err := s.Modify(qp); err != nil {
				t.Fatalf("ModifyQP(%v): %v", s.Mask, err)
			}
			if qp.State() != c.want {
				t.Errorf("State() = %v, want %v", qp.State(), c.want)
			}
			attr, _ := qp.QueryQP()
			if attr.QPState != c.want || attr.CurQPState != c.want {
				t.Errorf("QueryQP state %v, cur state %v, want %v", attr.QPState, attr.CurQPState, c.want)
			}
			if c.check != nil {
				if err := c.check(attr); err != nil {
					t.Errorf("QueryQP after %s: %v", c.name, err)
				}
			}
		})
	}
}

func toState(st verbs.QPState) func(*verbs.QP) step {
	return func(*verbs.QP) step { return step{Attr: verbs.QPAttr{QPState: st}, Mask: verbs.QPAttrState} }
}

// wantOrdering checks the delivery mode and max hole QueryQP reports.
func wantOrdering(mode verbs.Ordering, maxHole uint32) func(verbs.QPAttr) error {
	return func(a verbs.QPAttr) error {
		if a.Ordering != mode || a.MaxHole != maxHole {
			return fmt.Errorf("ordering %v, max hole %d, want %v, %d", a.Ordering, a.MaxHole, mode, maxHole)
		}
		return nil
	}
}

func wantAccess(want verbs.AccessFlags) func(verbs.QPAttr) error {
	return func(a verbs.QPAttr) error {
		if a.QPAccessFlags != want {
			return fmt.Errorf("access flags %#x, want %#x", a.QPAccessFlags, want)
		}
		return nil
	}
}

// invalidModify is a ModifyQP call that must fail.
type invalidModify struct {
	name string
	from verbs.QPState
	step func(*verbs.QP) step
}

// TestQPInvalidModify checks that ibv_modify_qp refuses transitions the state table does
// not allow, transitions missing a required attribute, transitions with an attribute the
// table does not allow, out-of-range values and a mismatching cur_state; and that a
// refused call changes neither the state nor any attribute QueryQP reports.
func TestQPInvalidModify(t *testing.T) {
	b := newStateBench(t)
	l := defaultLink()
	fixed := func(s step) func(*verbs.QP) step { return func(*verbs.QP) step { return s } }
	rtr := func(qp *verbs.QP) step { return rtrStep(qp.Endpoint(0x300), l) }
	init := fixed(initStep(allRemote))
	rts := fixed(rtsStep(0x400, l))
	var cases []invalidModify

	// Transitions the table does not have.
	for _, c := range []struct {
		from, to verbs.QPState
		step     func(*verbs.QP) step
	}{
		{verbs.StateReset, verbs.StateRTR, rtr}, {verbs.StateReset, verbs.StateRTS, rts},
		{verbs.StateReset, verbs.StateSQD, toState(verbs.StateSQD)},
		{verbs.StateInit, verbs.StateRTS, rts}, {verbs.StateInit, verbs.StateSQD, toState(verbs.StateSQD)},
		{verbs.StateRTR, verbs.StateInit, init}, {verbs.StateRTR, verbs.StateRTR, rtr},
		{verbs.StateRTR, verbs.StateSQD, toState(verbs.StateSQD)},
		{verbs.StateRTS, verbs.StateInit, init}, {verbs.StateRTS, verbs.StateRTR, rtr},
		{verbs.StateRTS, verbs.StateSQE, toState(verbs.StateSQE)},
		{verbs.StateSQD, verbs.StateInit, init}, {verbs.StateSQD, verbs.StateRTR, rtr},
		{verbs.StateErr, verbs.StateInit, init}, {verbs.StateErr, verbs.StateRTR, rtr},
		{verbs.StateErr, verbs.StateRTS, rts}, {verbs.StateErr, verbs.StateSQD, toState(verbs.StateSQD)},
	} {
		cases = append(cases, invalidModify{fmt.Sprintf("%v->%v", c.from, c.to), c.from, c.step})
	}
	for _, st := range []verbs.QPState{7, -1, 100} {
		cases = append(cases, invalidModify{fmt.Sprintf("INIT->state %d", st), verbs.StateInit, toState(st)})
	}

	// Required attributes missing, one at a time.
	for _, c := range []struct {
		from, to verbs.QPState
		step     func(*verbs.QP) step
		req      verbs.QPAttrMask
	}{
		{verbs.StateReset, verbs.StateInit, init, verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags},
		{verbs.StateInit, verbs.StateRTR, rtr, verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN |
			verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer},
		{verbs.StateRTR, verbs.StateRTS, rts, verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry | verbs.QPAttrSQPSN |
			verbs.QPAttrMaxQPRdAtomic},
	} {
		for m := c.req; m != 0; m &= m - 1 {
			bit := verbs.QPAttrMask(1) << bits.TrailingZeros32(uint32(m))
			stepFn := c.step
			cases = append(cases, invalidModify{fmt.Sprintf("%v->%v without %v", c.from, c.to, bit), c.from,
				func(qp *verbs.QP) step { return stepFn(qp).With(0, bit, nil) }})
		}
	}

	// Attributes the transition does not take.
	extra := []struct {
		from, to verbs.QPState
		step     func(*verbs.QP) step
		bits     []verbs.QPAttrMask
	}{
		{verbs.StateReset, verbs.StateInit, init, []verbs.QPAttrMask{verbs.QPAttrSQPSN, verbs.QPAttrDestQPN, verbs.QPAttrQKey,
			verbs.QPAttrAV, verbs.QPAttrTimeout, verbs.QPAttrOrdering}},
		{verbs.StateInit, verbs.StateInit, toState(verbs.StateInit), []verbs.QPAttrMask{verbs.QPAttrPathMTU, verbs.QPAttrRQPSN,
			verbs.QPAttrOrdering}},
		{verbs.StateInit, verbs.StateRTR, rtr, []verbs.QPAttrMask{verbs.QPAttrSQPSN, verbs.QPAttrTimeout, verbs.QPAttrRetryCnt,
			verbs.QPAttrRNRRetry, verbs.QPAttrMaxQPRdAtomic, verbs.QPAttrQKey, verbs.QPAttrPort}},
		{verbs.StateRTR, verbs.StateRTS, rts, []verbs.QPAttrMask{verbs.QPAttrPathMTU, verbs.QPAttrDestQPN, verbs.QPAttrRQPSN,
			verbs.QPAttrAV, verbs.QPAttrMaxDestRdAtomic, verbs.QPAttrPKeyIndex, verbs.QPAttrOrdering}},
		{verbs.StateRTS, verbs.StateRTS, toState(verbs.StateRTS), []verbs.QPAttrMask{verbs.QPAttrSQPSN, verbs.QPAttrTimeout,
			verbs.QPAttrPathMTU, verbs.QPAttrAV, verbs.QPAttrOrdering}},
		{verbs.StateRTS, verbs.StateSQD, toState(verbs.StateSQD), []verbs.QPAttrMask{verbs.QPAttrAccessFlags, verbs.QPAttrSQPSN,
			verbs.QPAttrOrdering}},
		{verbs.StateRTS, verbs.StateErr, toState(verbs.StateErr), []verbs.QPAttrMask{verbs.QPAttrTimeout, verbs.QPAttrAccessFlags,
			verbs.QPAttrOrdering}},
		{verbs.StateRTS, verbs.StateReset, toState(verbs.StateReset), []verbs.QPAttrMask{verbs.QPAttrAccessFlags, verbs.QPAttrOrdering}},
		{verbs.StateSQD, verbs.StateRTS, toState(verbs.StateRTS), []verbs.QPAttrMask{verbs.QPAttrSQPSN, verbs.QPAttrTimeout,
			verbs.QPAttrOrdering}},
		{verbs.StateSQD, verbs.StateSQD, toState(verbs.StateSQD), []verbs.QPAttrMask{verbs.QPAttrOrdering}},
		{verbs.StateErr, verbs.StateReset, toState(verbs.StateReset), []verbs.QPAttrMask{verbs.QPAttrOrdering}},
	}
	for _, e := range extra {
		for _, bit := range e.bits {
			stepFn := e.step
			cases = append(cases, invalidModify{fmt.Sprintf("%v->%v with %v", e.from, e.to, bit), e.from,
				func(qp *verbs.QP) step { return stepFn(qp).With(bit, 0, nil) }})
		}
	}

	// Values out of range.
	bad := func(name string, from verbs.QPState, base func(*verbs.QP) step, f func(*verbs.QPAttr)) {
		cases = append(cases, invalidModify{name, from, func(qp *verbs.QP) step { return base(qp).With(0, 0, f) }})
	}
	bad("port_num 2", verbs.StateReset, init, func(a *verbs.QPAttr) { a.PortNum = 2 })
	bad("port_num 0", verbs.StateReset, init, func(a *verbs.QPAttr) { a.PortNum = 0 })
	bad("pkey_index 1", verbs.StateReset, init, func(a *verbs.QPAttr) { a.PKeyIndex = 1 })
	bad("unknown access bit", verbs.StateReset, init, func(a *verbs.QPAttr) { a.QPAccessFlags |= 1 << 10 })
	bad("path_mtu 6", verbs.StateInit, rtr, func(a *verbs.QPAttr) { a.PathMTU = 6 })
	bad("path_mtu 0", verbs.StateInit, rtr, func(a *verbs.QPAttr) { a.PathMTU = 0 })
	bad("max_dest_rd_atomic 129", verbs.StateInit, rtr, func(a *verbs.QPAttr) { a.MaxDestRdAtomic = 129 })
	bad("min_rnr_timer 32", verbs.StateInit, rtr, func(a *verbs.QPAttr) { a.MinRNRTimer = 32 })
	bad("dest_qp_num 2^24", verbs.StateInit, rtr, func(a *verbs.QPAttr) { a.DestQPNum = 1 << 24 })
	bad("rq_psn 2^24", verbs.StateInit, rtr, func(a *verbs.QPAttr) { a.RQPSN = 1 << 24 })
	bad("address vector without GID", verbs.StateInit, rtr, func(a *verbs.QPAttr) { a.AHAttr.DGID = verbs.GID{} })
	bad("timeout 32", verbs.StateRTR, rts, func(a *verbs.QPAttr) { a.Timeout = 32 })
	bad("retry_cnt 8", verbs.StateRTR, rts, func(a *verbs.QPAttr) { a.RetryCnt = 8 })
	bad("rnr_retry 8", verbs.StateRTR, rts, func(a *verbs.QPAttr) { a.RNRRetry = 8 })
	bad("max_rd_atomic 129", verbs.StateRTR, rts, func(a *verbs.QPAttr) { a.MaxRdAtomic = 129 })
	bad("max_rd_atomic 255", verbs.StateRTR, rts, func(a *verbs.QPAttr) { a.MaxRdAtomic = 255 })
	bad("sq_psn 2^24", verbs.StateRTR, rts, func(a *verbs.QPAttr) { a.SQPSN = 1 << 24 })
	// The delivery mode (QPAttrOrdering, on INIT->RTR): ordered (0) or weak (1), and a
	// max hole of 0 (the default) or 64..65536 PSNs, in either mode.
	withOrdering := func(qp *verbs.QP) step { return rtr(qp).With(verbs.QPAttrOrdering, 0, nil) }
	bad("ordering 7", verbs.StateInit, withOrdering, func(a *verbs.QPAttr) { a.Ordering = 7 })
	bad("ordering 2", verbs.StateInit, withOrdering, func(a *verbs.QPAttr) { a.Ordering = 2 })
	bad("ordering -1", verbs.StateInit, withOrdering, func(a *verbs.QPAttr) { a.Ordering = -1 })
	for _, mh := range []uint32{1, 63, 1<<16 + 1, 1 << 20, ^uint32(0)} {
		for _, mode := range orderings {
			bad(fmt.Sprintf("%v with max hole %d", mode, mh), verbs.StateInit, withOrdering, func(a *verbs.QPAttr) {
				a.Ordering, a.MaxHole = mode, mh
			})
		}
	}
	curState := func(from, claimed verbs.QPState, base func(*verbs.QP) step) {
		bad(fmt.Sprintf("%v with cur_state %v", from, claimed), from, func(qp *verbs.QP) step {
			return base(qp).With(verbs.QPAttrCurState, 0, func(a *verbs.QPAttr) { a.CurQPState = claimed })
		}, nil)
	}
	curState(verbs.StateRTR, verbs.StateInit, rts)
	curState(verbs.StateRTS, verbs.StateRTR, toState(verbs.StateRTS))
	curState(verbs.StateSQD, verbs.StateRTS, toState(verbs.StateRTS))

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			qp := b.qp(t, c.from)
			before, _ := qp.QueryQP()
			s := c.step(qp)
			err := s.Modify(qp)
			if err == nil {
				t.Fatalf("ModifyQP(%v -> %v, %v) succeeded", c.from, s.Attr.QPState, s.Mask)
			}
			if !errors.Is(err, verbs.ErrInvalid) {
				t.Errorf("ModifyQP error %v does not wrap ErrInvalid", err)
			}
			if qp.State() != c.from {
				t.Errorf("state after the refused call: %v, want %v", qp.State(), c.from)
			}
			if after, _ := qp.QueryQP(); after != before {
				t.Errorf("refused call changed attributes:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}
	if err := b.qp(t, verbs.StateInit).ModifyQP(nil, verbs.QPAttrState); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("ModifyQP(nil): %v, want ErrInvalid", err)
	}
}

// TestQueryQP checks ibv_query_qp: after connecting, it returns the attributes that were
// set (state, MTU, access, address vector, QPN, PSNs, timers, retry counts, read/atomic
// depths, capabilities) and the creation attributes; after RESET the connection
// attributes are gone.
func TestQueryQP(t *testing.T) {
	ctxA := openDevice(t, ipA, verbs.DeviceConfig{})
	ctxB := openDevice(t, ipB, verbs.DeviceConfig{})
	cp := verbs.QPCap{MaxSendWR: 10, MaxRecvWR: 20, MaxSendSGE: 3, MaxRecvSGE: 4, MaxInlineData: 100}
	a := newSide(t, ctxA, cp, 64, true)
	b := newSide(t, ctxB, cp, 64, false)
	l := link{MTU: verbs.MTU2048, Access: verbs.AccessRemoteRead | verbs.AccessRemoteWrite, Timeout: 17, RetryCnt: 5,
		RNRRetry: 3, MinRNRTimer: 9, MaxRdAtomic: 7, MaxDestRdAtomic: 11}
	remote := b.qp.Endpoint(0xABCDEF)
	connect(t, a.qp, 0x123456, remote, l)
	got, init := a.qp.QueryQP()
	want := verbs.QPAttr{
		QPState: verbs.StateRTS, CurQPState: verbs.StateRTS, PathMTU: verbs.MTU2048, QPAccessFlags: l.Access,
		PortNum: 1, DestQPNum: b.qp.QPNum(), RQPSN: 0xABCDEF, SQPSN: 0x123456, MaxRdAtomic: 7, MaxDestRdAtomic: 11,
		MinRNRTimer: 9, Timeout: 17, RetryCnt: 5, RNRRetry: 3, Cap: cp,
	}
	gotAV := got.AHAttr
	got.AHAttr = verbs.AHAttr{}
	if got != want {
		t.Errorf("QueryQP:\n got %+v\nwant %+v", got, want)
	}
	if gotAV.DGID != verbs.GIDFromAddr(ipB) || gotAV.DestPort != ctxB.Addr().Port() || gotAV.PortNum != 1 || !gotAV.IsGlobal {
		t.Errorf("QueryQP address vector %+v, want DGID %v, port %d", gotAV, ipB, ctxB.Addr().Port())
	}
	if init.SendCQ != a.scq || init.RecvCQ != a.rcq || init.Cap != cp || !init.SQSigAll || init.QPType != verbs.QPTypeRC {
		t.Errorf("QueryQP init attributes %+v", init)
	}
	if remote.GID != verbs.GIDFromAddr(ipB) || remote.Port != ctxB.Addr().Port() || remote.QPNum != b.qp.QPNum() || remote.PSN != 0xABCDEF {
		t.Errorf("Endpoint %+v", remote)
	}
	if e := b.qp.Endpoint(0x1FFFFFF); e.PSN != 0xFFFFFF {
		t.Errorf("Endpoint keeps PSN %#x, want it masked to 24 bits", e.PSN)
	}

	// RESET forgets the connection.
	mustModify(t, a.qp, step{Attr: verbs.QPAttr{QPState: verbs.StateReset}, Mask: verbs.QPAttrState})
	got, _ = a.qp.QueryQP()
	if want := (verbs.QPAttr{QPState: verbs.StateReset, CurQPState: verbs.StateReset, Cap: cp}); got != want {
		t.Errorf("QueryQP after RESET:\n got %+v\nwant %+v", got, want)
	}

	// Connect sets the defaults ConnectOptions documents.
	if err := b.qp.Connect(0x42, a.qp.Endpoint(0x43), verbs.ConnectOptions{}); err != nil {
		t.Fatalf("Connect: %v", err)
	}
	got, _ = b.qp.QueryQP()
	got.AHAttr = verbs.AHAttr{}
	want = verbs.QPAttr{
		QPState: verbs.StateRTS, CurQPState: verbs.StateRTS, PathMTU: verbs.MTU1024, QPAccessFlags: allRemote,
		PortNum: 1, DestQPNum: a.qp.QPNum(), RQPSN: 0x43, SQPSN: 0x42, MaxRdAtomic: 16, MaxDestRdAtomic: 16,
		MinRNRTimer: 12, Timeout: 14, RetryCnt: 7, RNRRetry: 7, Cap: cp,
	}
	if got != want {
		t.Errorf("QueryQP after Connect with default options:\n got %+v\nwant %+v", got, want)
	}
	if err := b.qp.Connect(0, a.qp.Endpoint(0), verbs.ConnectOptions{}); err == nil {
		t.Errorf("Connect of a QP in RTS succeeded")
	}
}

// TestPostStateRules checks which states allow posting: ibv_post_send needs RTS (it
// fails in RESET, INIT and RTR), ibv_post_recv fails in RESET but works from INIT on,
// and receives posted before the connection is up are used once it is.
func TestPostStateRules(t *testing.T) {
	a, b := newSides(t, pairConfig{CQE: 64})
	l := defaultLink()
	srcA := mustReg(t, a.pd, []byte("0123456789"), 0)
	dstB := mustReg(t, b.pd, make([]byte, 64), verbs.AccessLocalWrite)
	send := verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(srcA, 0, 10)}
	recv := verbs.RecvWR{WRID: 2, SGList: sge(dstB, 0, 64)}

	tryPost := func(s *side, wantSend, wantRecv bool) {
		t.Helper()
		st := s.qp.State()
		if err := s.qp.PostSend([]verbs.SendWR{send}); (err == nil) != wantSend {
			t.Errorf("PostSend in %v: %v, want success %v", st, err, wantSend)
		} else if err != nil && postIndex(err) != 0 {
			t.Errorf("PostSend in %v: error %v is not a *PostError for index 0", st, err)
		}
		if err := s.qp.PostRecv([]verbs.RecvWR{recv}); (err == nil) != wantRecv {
			t.Errorf("PostRecv in %v: %v, want success %v", st, err, wantRecv)
		} else if err != nil && postIndex(err) != 0 {
			t.Errorf("PostRecv in %v: error %v is not a *PostError for index 0", st, err)
		}
	}
	tryPost(b, false, false) // RESET
	mustModify(t, b.qp, initStep(allRemote))
	tryPost(b, false, true) // INIT: the receive is queued
	mustModify(t, b.qp, rtrStep(a.qp.Endpoint(0x10), l))
	tryPost(b, false, true) // RTR
	mustModify(t, b.qp, rtsStep(0x20, l))

	tryPost(a, false, false)
	mustModify(t, a.qp, initStep(allRemote))
	mustModify(t, a.qp, rtrStep(b.qp.Endpoint(0x20), l))
	mustModify(t, a.qp, rtsStep(0x10, l))
	mustPostSend(t, a.qp, send)
	wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCSend, a.qp)
	wc := pollOne(t, b.rcq)
	if wc.WRID != 2 || wc.Status != verbs.WCSuccess || wc.ByteLen != 10 {
		t.Errorf("receive posted in INIT: completion %+v", wc)
	}
	checkBytes(t, "received", dstB.Buf()[:10], []byte("0123456789"))
}

// TestSQD checks the SQ drain state: RTS->SQD with EnSQDAsyncNotify raises
// IBV_EVENT_SQ_DRAINED once nothing is outstanding, work posted in SQD is queued but not
// started, and SQD->RTS resumes it.
func TestSQD(t *testing.T) {
	a, b := defaultPair(t)
	src := mustReg(t, a.pd, pattern(5000, 1), 0)
	dst := mustReg(t, b.pd, make([]byte, 5000), verbs.AccessLocalWrite)
	mustModify(t, a.qp, step{Attr: verbs.QPAttr{QPState: verbs.StateSQD, EnSQDAsyncNotify: true}, Mask: verbs.QPAttrState | verbs.QPAttrEnSQDAsyncNotify})
	ev := waitAsync(t, a.ctx, verbs.EventSQDrained)
	if ev.QP != a.qp {
		t.Errorf("SQ drained event for QP %v, want %v", ev.QP, a.qp)
	}
	mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: sge(dst, 0, 5000)})
	tx := a.qp.Counters().TxPackets
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 5000)})
	if got := a.qp.Counters().TxPackets; got != tx {
		t.Errorf("a QP in SQD sent %d packets for a new work request", got-tx)
	}
	expectEmpty(t, a.scq, "send CQ in SQD")
	mustModify(t, a.qp, toState(verbs.StateRTS)(a.qp))
	wantSendWC(t, pollOne(t, a.scq), 2, verbs.WCSend, a.qp)
	if wc := pollOne(t, b.rcq); wc.Status != verbs.WCSuccess || wc.ByteLen != 5000 {
		t.Errorf("receive completion %+v", wc)
	}
	checkBytes(t, "data sent after SQD->RTS", dst.Buf(), src.Buf())
}

// TestQPReuseAfterReset checks that a QP that went to ERR can be moved to RESET and
// connected again (RESET->INIT->RTR->RTS) and then carries traffic normally.
func TestQPReuseAfterReset(t *testing.T) {
	a, b := defaultPair(t)
	src := mustReg(t, a.pd, pattern(3000, 2), 0)
	dst := mustReg(t, b.pd, make([]byte, 3000), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
		SGList: sge(src, 0, 3000), RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCRDMAWrite, a.qp)
	for round := 0; round < 3; round++ {
		// The devices' receive paths read a QP's peer address when they send its
		// acknowledgements; ModifyQP below rewrites it (see settle).
		settle(a.ctx, b.ctx)
		for _, s := range []*side{a, b} {
			mustModify(t, s.qp, toState(verbs.StateErr)(s.qp))
			mustModify(t, s.qp, toState(verbs.StateReset)(s.qp))
		}
		psnA, psnB := uint32(0x1000*round+7), uint32(0xFFFF00+uint32(round))
		connect(t, a.qp, psnA, b.qp.Endpoint(psnB), defaultLink())
		connect(t, b.qp, psnB, a.qp.Endpoint(psnA), defaultLink())
		want := pattern(3000, uint64(10+round))
		copy(src.Buf(), want)
		mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 3, SGList: sge(dst, 0, 3000)})
		mustPostSend(t, a.qp, verbs.SendWR{WRID: 4, Opcode: verbs.WRSendWithImm, ImmData: uint32(round), SendFlags: verbs.SendSignaled,
			SGList: sge(src, 0, 3000)})
		wantSendWC(t, pollOne(t, a.scq), 4, verbs.WCSend, a.qp)
		if wc := pollOne(t, b.rcq); wc.WRID != 3 || wc.Status != verbs.WCSuccess || wc.ImmData != uint32(round) {
			t.Fatalf("round %d: receive completion %+v", round, wc)
		}
		checkBytes(t, fmt.Sprintf("round %d", round), dst.Buf(), want)
	}
}

// TestModifyAVWhileResponding checks that SQD->SQD may change the address vector (as the
// IBTA state table allows) while the QP's responder keeps receiving RDMA WRITEs and
// acknowledging them: the traffic is not disturbed.
func TestModifyAVWhileResponding(t *testing.T) {
	a, b := defaultPair(t)
	mustModify(t, b.qp, step{Attr: verbs.QPAttr{QPState: verbs.StateSQD}, Mask: verbs.QPAttrState})
	const n, rounds = 64 << 10, 200
	src := mustReg(t, a.pd, pattern(n, 120), 0)
	dst := mustReg(t, b.pd, make([]byte, n), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	av := rtrStep(a.qp.Endpoint(0), defaultLink()).Attr.AHAttr
	var stop atomic.Bool
	done := make(chan error, 1)
	go func() {
		for !stop.Load() {
			attr := verbs.QPAttr{QPState: verbs.StateSQD, AHAttr: av}
			if err := b.qp.ModifyQP(&attr, verbs.QPAttrState|verbs.QPAttrAV); err != nil {
				done <- err
				return
			}
			runtime.Gosched()
		}
		done <- nil
	}()
	for i := 0; i < rounds; i++ {
		mustPostSend(t, a.qp, verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
			SGList: sge(src, 0, n), RemoteAddr: dst.Addr(), RKey: dst.RKey()})
		wantSendWC(t, pollOne(t, a.scq), uint64(i), verbs.WCRDMAWrite, a.qp)
	}
	stop.Store(true)
	if err := <-done; err != nil {
		t.Fatalf("SQD->SQD with an address vector: %v", err)
	}
	settle(b.ctx)
	checkBytes(t, "written", dst.Buf(), src.Buf())
	if attr, _ := b.qp.QueryQP(); attr.AHAttr.DGID != av.DGID || attr.AHAttr.DestPort != av.DestPort {
		t.Errorf("address vector %+v after SQD->SQD, want %+v", attr.AHAttr, av)
	}
}
