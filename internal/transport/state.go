package transport

import (
	"fmt"

	"github.com/softrnic/softrnic/internal/netio"
)

// The QP state machine: ibv_modify_qp's transitions, what entering each state does, and
// the error state's flush.

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

// Modify applies attrs selected by mask and performs the state transition, with
// ibv_modify_qp's rules. On error nothing changes.
func (q *QP) Modify(a *Attr, mask uint32, caps DeviceCaps) error {
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
	err := q.modifyLocked(a, mask, caps)
	if err == nil && cur == StateSQD && q.state == StateRTS {
		q.pushTxUnlock() // resume what the drain held back; releases q.mu
		return nil
	}
	q.mu.Unlock()
	return err
}

func (q *QP) modifyLocked(a *Attr, mask uint32, caps DeviceCaps) error {
	if q.destroyed {
		return fmt.Errorf("QP was %w", ErrDestroyed)
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
	if err := q.checkAttr(a, mask, caps, &peer); err != nil {
		return err
	}
	q.apply(a, mask, peer)
	q.setState(next)
	return nil
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
	if h := q.dev.OnQPError; h != nil {
		h(q, status)
	}
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
