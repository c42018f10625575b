package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// openSRQRig is n connections from device 0 to device 1 whose QPs share an SRQ of srqWR
// entries (two SGEs each), in delivery mode ordering.
func openSRQRig(t *testing.T, n, srqWR int, ordering verbs.Ordering) *srqRig {
	t.Helper()
	return openSRQRigWith(t, n, srqWR, ordering, verbs.DeviceConfig{})
}

// openSRQRigWith is openSRQRig with the sending device (0) configured by sender.
func openSRQRigWith(t *testing.T, n, srqWR int, ordering verbs.Ordering, sender verbs.DeviceConfig) *srqRig {
	t.Helper()
	return verbstest.NewFanIn(t, verbstest.FanInConfig{
		N:       n,
		SRQ:     verbs.SRQInitAttr{MaxWR: srqWR, MaxSGE: 2},
		CQE:     4*n + 64,
		Sender:  sender,
		SendCap: verbs.QPCap{MaxSendWR: 32, MaxRecvWR: 1, MaxSendSGE: 1, MaxInlineData: 64},
		RecvCap: verbs.QPCap{MaxSendWR: 4},
		Options: verbs.ConnectOptions{Timeout: 12, Ordering: ordering},
		PSN:     func(i int) (uint32, uint32) { return uint32(10 * i), uint32(7 * i) },
	})
}

// TestSRQManyQPs checks that many QPs share one SRQ and one CQ: every message lands in a
// receive WQE of the SRQ, every completion names the QP it came from, and the data of each
// QP is its own.
func TestSRQManyQPs(t *testing.T) {
	for _, ord := range []verbs.Ordering{verbs.OrderingOrdered, verbs.OrderingWeak} {
		t.Run(ord.String(), func(t *testing.T) {
			const nqp, msgs = 16, 8
			r := openSRQRig(t, nqp, nqp*msgs, ord)
			rbuf := make([]byte, nqp*msgs*64)
			rmr, _ := r.PD[1].RegMR(rbuf, verbs.AccessLocalWrite)
			for i := 0; i < nqp*msgs; i++ {
				if err := r.SRQ.PostSRQRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{rmr.SGE(i*64, 64)}}}); err != nil {
					t.Fatal(err)
				}
			}
			src := make([]byte, nqp*msgs*8)
			smr, _ := r.PD[0].RegMR(src, verbs.AccessLocalWrite)
			for q := 0; q < nqp; q++ {
				for m := 0; m < msgs; m++ {
					off := (q*msgs + m) * 8
					copy(src[off:], fmt.Sprintf("q%02dm%02d!!", q, m))
					if err := r.SQPs[q].PostSend([]verbs.SendWR{{WRID: uint64(m), Opcode: verbs.WRSendWithImm, ImmData: uint32(q<<8 | m),
						SendFlags: verbs.SendSignaled, SGList: []verbs.SGE{smr.SGE(off, 8)}}}); err != nil {
						t.Fatal(err)
					}
				}
			}
			pollN(t, r.CQ[0], nqp*msgs)
			next := make(map[uint32]int)
			qpIndex := map[uint32]int{}
			for i, qp := range r.RQPs {
				qpIndex[qp.QPNum()] = i
			}
			for _, wc := range pollN(t, r.CQ[1], nqp*msgs) {
				q, ok := qpIndex[wc.QPNum]
				if wc.Status != verbs.WCSuccess || !ok || wc.ByteLen != 8 || wc.WCFlags&verbs.WCWithImm == 0 {
					t.Fatalf("completion %+v", wc)
				}
				m := next[wc.QPNum]
				next[wc.QPNum]++
				if wc.ImmData != uint32(q<<8|m) {
					t.Fatalf("QP %d: message %d carries immediate %#x: per-QP order broken", q, m, wc.ImmData)
				}
				if got, want := string(rbuf[wc.WRID*64:wc.WRID*64+8]), fmt.Sprintf("q%02dm%02d!!", q, m); got != want {
					t.Fatalf("QP %d message %d: buffer %q", q, m, got)
				}
			}
			if r.SRQ.Posted() != 0 {
				t.Fatalf("%d WQEs left", r.SRQ.Posted())
			}
		})
	}
}

// TestSRQLimit checks the SRQ limit event: armed with ModifySRQ, raised once when a QP's
// message leaves fewer WQEs posted than the limit, reported as 0 by QuerySRQ afterwards,
// re-armable; and the attribute rules of ibv_modify_srq.
func TestSRQLimit(t *testing.T) {
	r := openSRQRig(t, 1, 8, verbs.OrderingOrdered)
	if a := r.SRQ.QuerySRQ(); a.MaxWR != 8 || a.MaxSGE != 2 || a.SRQLimit != 0 {
		t.Fatalf("query %+v", a)
	}
	if err := r.SRQ.ModifySRQ(&verbs.SRQAttr{SRQLimit: 9}, verbs.SRQAttrLimit); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("limit above max_wr: %v", err)
	}
	if err := r.SRQ.ModifySRQ(&verbs.SRQAttr{}, 0); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("empty mask: %v", err)
	}
	rbuf := make([]byte, 8*64)
	rmr, _ := r.PD[1].RegMR(rbuf, verbs.AccessLocalWrite)
	for i := 0; i < 6; i++ {
		if err := r.SRQ.PostSRQRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{rmr.SGE(i*64, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Resizing below what is posted fails; above works and keeps the WQEs.
	if err := r.SRQ.ModifySRQ(&verbs.SRQAttr{MaxWR: 4}, verbs.SRQAttrMaxWR); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("shrink below posted: %v", err)
	}
	if err := r.SRQ.ModifySRQ(&verbs.SRQAttr{MaxWR: 16, SRQLimit: 5}, verbs.SRQAttrMaxWR|verbs.SRQAttrLimit); err != nil {
		t.Fatal(err)
	}
	if a := r.SRQ.QuerySRQ(); a.MaxWR != 16 || a.SRQLimit != 5 || r.SRQ.Posted() != 6 {
		t.Fatalf("after resize %+v, posted %d", a, r.SRQ.Posted())
	}
	src := []byte("ping")
	smr, _ := r.PD[0].RegMR(src, verbs.AccessLocalWrite)
	send := func() {
		if err := r.SQPs[0].PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: []verbs.SGE{smr.SGE(0, 4)}}}); err != nil {
			t.Fatal(err)
		}
		pollN(t, r.CQ[0], 1)
		pollN(t, r.CQ[1], 1)
	}
	send() // 5 left: not below 5
	if ev, ok := r.Ctx[1].TryGetAsyncEvent(); ok && ev.Type == verbs.EventSRQLimitReached {
		t.Fatal("limit event with 5 posted and limit 5")
	}
	send() // 4 left: below
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var ev *verbs.AsyncEvent
	for {
		e, err := r.Ctx[1].GetAsyncEvent(ctx)
		if err != nil {
			t.Fatal("no SRQ limit event:", err)
		}
		r.Ctx[1].AckAsyncEvent(e)
		if e.Type == verbs.EventSRQLimitReached {
			ev = e
			break
		}
	}
	if ev.SRQ != r.SRQ || r.SRQ.QuerySRQ().SRQLimit != 0 {
		t.Fatalf("event for %p, limit now %d", ev.SRQ, r.SRQ.QuerySRQ().SRQLimit)
	}
	send() // disarmed: no second event
	for {
		e, ok := r.Ctx[1].TryGetAsyncEvent()
		if !ok {
			break
		}
		if e.Type == verbs.EventSRQLimitReached {
			t.Fatal("limit event fired twice without re-arming")
		}
		r.Ctx[1].AckAsyncEvent(e)
	}
	// Re-arm above what is posted (3): the next message fires it again.
	if err := r.SRQ.ModifySRQ(&verbs.SRQAttr{SRQLimit: 8}, verbs.SRQAttrLimit); err != nil {
		t.Fatal(err)
	}
	send()
	for {
		e, err := r.Ctx[1].GetAsyncEvent(ctx)
		if err != nil {
			t.Fatal("no event after re-arming:", err)
		}
		r.Ctx[1].AckAsyncEvent(e)
		if e.Type == verbs.EventSRQLimitReached {
			break
		}
	}
}

// TestSRQErrors checks PostSRQRecv's bad-WR reporting, PostRecv on an SRQ QP, DestroySRQ
// while QPs use it, and LAST_WQE_REACHED when such a QP enters the error state.
func TestSRQErrors(t *testing.T) {
	r := openSRQRig(t, 1, 4, verbs.OrderingOrdered)
	rbuf := make([]byte, 256)
	rmr, _ := r.PD[1].RegMR(rbuf, verbs.AccessLocalWrite)
	wrs := []verbs.RecvWR{
		{WRID: 1, SGList: []verbs.SGE{rmr.SGE(0, 64)}},
		{WRID: 2, SGList: []verbs.SGE{rmr.SGE(64, 64), rmr.SGE(128, 64), rmr.SGE(192, 64)}}, // 3 SGEs > max_sge 2
		{WRID: 3, SGList: []verbs.SGE{rmr.SGE(128, 64)}},
	}
	var pe *verbs.PostError
	if err := r.SRQ.PostSRQRecv(wrs); !errors.As(err, &pe) || pe.Index != 1 || r.SRQ.Posted() != 1 {
		t.Fatalf("bad WR: %v, posted %d", err, r.SRQ.Posted())
	}
	for i := 0; i < 3; i++ {
		r.SRQ.PostSRQRecv(wrs[:1])
	}
	if err := r.SRQ.PostSRQRecv(wrs[:1]); !errors.As(err, &pe) || pe.Index != 0 || !errors.Is(err, verbs.ErrLimit) {
		t.Fatalf("full SRQ: %v", err)
	}
	if err := r.RQPs[0].PostRecv(wrs[:1]); err == nil {
		t.Fatal("PostRecv on a QP that uses an SRQ")
	}
	if err := r.SRQ.DestroySRQ(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("destroy in use: %v", err)
	}
	if err := r.PD[1].DeallocPD(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("dealloc PD with SRQ: %v", err)
	}
	if err := r.RQPs[0].ModifyQP(&verbs.QPAttr{QPState: verbs.StateErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for {
		e, err := r.Ctx[1].GetAsyncEvent(ctx)
		if err != nil {
			t.Fatal("no LAST_WQE_REACHED:", err)
		}
		r.Ctx[1].AckAsyncEvent(e)
		if e.Type == verbs.EventQPLastWQE && e.QP == r.RQPs[0] {
			break
		}
	}
	if r.SRQ.Posted() != 4 {
		t.Fatal("the SRQ's WQEs were flushed with the QP")
	}
	if err := r.RQPs[0].DestroyQP(); err != nil {
		t.Fatal(err)
	}
	if err := r.SRQ.DestroySRQ(); err != nil {
		t.Fatal(err)
	}
}
