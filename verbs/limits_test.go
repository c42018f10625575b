package verbs_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/verbs"
)

// limRig is the SRQ rig with receive buffers posted and a source buffer.
type limRig struct {
	*srqRig
	src *verbs.MR
}

func newLimRig(t *testing.T, nqp int, ord verbs.Ordering) *limRig {
	t.Helper()
	r := &limRig{srqRig: openSRQRig(t, nqp, 256, ord)}
	rbuf := make([]byte, 256*16<<10)
	rmr, _ := r.PD[1].RegMR(rbuf, verbs.AccessLocalWrite)
	for i := 0; i < 256; i++ {
		if err := r.SRQ.PostSRQRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{rmr.SGE(i*16<<10, 16<<10)}}}); err != nil {
			t.Fatal(err)
		}
	}
	r.src, _ = r.PD[0].RegMR(make([]byte, 16<<10), verbs.AccessLocalWrite)
	return r
}

func (r *limRig) sendOn(t *testing.T, i, n, size int) {
	t.Helper()
	for k := 0; k < n; k++ {
		if err := r.SQPs[i].PostSend([]verbs.SendWR{{WRID: uint64(k), Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled,
			SGList: []verbs.SGE{r.src.SGE(0, size)}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitUntilTrue polls the CQs whose slices are given (keeping everything) until cond
// holds; a CQ without a slice is left alone (its consumer is not polling).
func (r *limRig) waitUntilTrue(t *testing.T, what string, keep [2]*[]verbs.WorkCompletion, cond func() bool) {
	t.Helper()
	wc := make([]verbs.WorkCompletion, 32)
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		for i := 0; i < 2; i++ {
			if keep[i] != nil {
				n := r.CQ[i].PollCQ(wc)
				*keep[i] = append(*keep[i], wc[:n]...)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func waitEvent(t *testing.T, ctx *verbs.Device, typ verbs.EventType) *verbs.AsyncEvent {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for {
		ev, err := ctx.GetAsyncEvent(c)
		if err != nil {
			t.Fatalf("no %v event: %v", typ, err)
		}
		ctx.AckAsyncEvent(ev)
		if ev.Type == typ {
			return ev
		}
	}
}

// A connection that holds more SRQ entries than its hard limit (its completions are not
// being polled) is dropped: its QP goes to ERR with an event naming the limit, the peer's
// requests fail, and the other connections on the same SRQ carry on.
func TestLimitHardDrop(t *testing.T) {
	r := newLimRig(t, 3, verbs.OrderingOrdered)
	lim := &verbs.LimitConfig{OnHard: verbs.HardDrop}
	lim.Limits[verbs.LimitSRQHeld] = verbs.Limit{Hard: 4}
	r.RQPs[0].SetLimits(lim)
	r.sendOn(t, 0, 6, 64)
	var sender []verbs.WorkCompletion
	r.waitUntilTrue(t, "the hostile sender's failure", [2]*[]verbs.WorkCompletion{&sender, nil}, func() bool { return len(sender) >= 6 })
	if sender[4].Status != verbs.WCRemOpErr || sender[5].Status != verbs.WCWRFlushErr {
		t.Fatalf("sender completions %v %v", sender[4].Status, sender[5].Status)
	}
	ev := waitEvent(t, r.Ctx[1], verbs.EventQPFatal)
	if ev.QP != r.RQPs[0] || !strings.Contains(ev.Detail, "SRQ entries held") {
		t.Fatalf("event %+v", ev)
	}
	ls := r.RQPs[0].LimitStats()
	if !ls.Dropped || ls.Decisions[verbs.DecideHardDrop] != 1 || ls.HardHits[verbs.LimitSRQHeld] != 1 || r.RQPs[0].State() != verbs.StateErr {
		t.Fatalf("limit stats %+v, state %v", ls, r.RQPs[0].State())
	}
	// The others are unaffected.
	r.sendOn(t, 1, 5, 64)
	r.sendOn(t, 2, 5, 64)
	var got []verbs.WorkCompletion
	var sent []verbs.WorkCompletion
	r.waitUntilTrue(t, "the others' messages", [2]*[]verbs.WorkCompletion{&sent, &got}, func() bool { return len(sent) >= 10 })
	for _, wc := range sent {
		if wc.Status != verbs.WCSuccess {
			t.Fatalf("another connection failed: %+v", wc)
		}
	}
}

// At its hard limit with the RNR response a connection is refused with RNR NAKs until its
// completions are polled, then carries on: nothing is lost.
func TestLimitHardRNR(t *testing.T) {
	r := newLimRig(t, 1, verbs.OrderingOrdered)
	lim := &verbs.LimitConfig{OnHard: verbs.HardRNR}
	lim.Limits[verbs.LimitSRQHeld] = verbs.Limit{Hard: 2}
	r.RQPs[0].SetLimits(lim)
	r.sendOn(t, 0, 6, 64)
	var sent, got []verbs.WorkCompletion
	r.waitUntilTrue(t, "an RNR NAK", [2]*[]verbs.WorkCompletion{&sent, nil}, func() bool { return r.SQPs[0].Counters().RNRNAKsReceived > 0 })
	r.waitUntilTrue(t, "every message", [2]*[]verbs.WorkCompletion{&sent, &got}, func() bool { return len(sent) >= 6 && len(got) >= 6 })
	for _, wc := range append(sent, got...) {
		if wc.Status != verbs.WCSuccess {
			t.Fatalf("completion %+v", wc)
		}
	}
	if ls := r.RQPs[0].LimitStats(); ls.Decisions[verbs.DecideHardRNR] == 0 || ls.Dropped {
		t.Fatalf("limit stats %+v", ls)
	}
}

// At a soft limit the analysis lets a connection within its share borrow, paces one over its
// share with RNR NAKs, and escalates to the hard action once it stays over its share without
// its completions draining.
func TestLimitSoftGraded(t *testing.T) {
	t.Run("borrow then pace", func(t *testing.T) {
		r := newLimRig(t, 1, verbs.OrderingOrdered)
		lim := &verbs.LimitConfig{Burst: 2}
		lim.Limits[verbs.LimitSRQHeld] = verbs.Limit{Soft: 2}
		r.RQPs[0].SetLimits(lim)
		r.sendOn(t, 0, 6, 64)
		// Held goes 1, 2 (under the soft limit), 3 and 4 (borrowed from the burst of 2),
		// then over its share: paced.
		var sent, got []verbs.WorkCompletion
		r.waitUntilTrue(t, "pacing", [2]*[]verbs.WorkCompletion{&sent, nil}, func() bool { return r.RQPs[0].LimitStats().Decisions[verbs.DecidePace] > 0 })
		r.waitUntilTrue(t, "every message once completions drain", [2]*[]verbs.WorkCompletion{&sent, &got}, func() bool { return len(sent) >= 6 })
		ls := r.RQPs[0].LimitStats()
		if ls.Decisions[verbs.DecideBorrow] != 2 || ls.SoftHits[verbs.LimitSRQHeld] < 3 || ls.Dropped {
			t.Fatalf("limit stats %+v", ls)
		}
		for _, wc := range sent {
			if wc.Status != verbs.WCSuccess {
				t.Fatalf("completion %+v", wc)
			}
		}
	})
	t.Run("escalate", func(t *testing.T) {
		r := newLimRig(t, 1, verbs.OrderingOrdered)
		lim := &verbs.LimitConfig{Burst: 0.5, EscalateAfter: 2, OnHard: verbs.HardDrop}
		lim.Limits[verbs.LimitSRQHeld] = verbs.Limit{Soft: 1}
		r.RQPs[0].SetLimits(lim)
		r.sendOn(t, 0, 4, 64) // nothing polls the receive side
		var sent []verbs.WorkCompletion
		r.waitUntilTrue(t, "the sender's failure", [2]*[]verbs.WorkCompletion{&sent, nil}, func() bool {
			return len(sent) > 0 && sent[len(sent)-1].Status != verbs.WCSuccess
		})
		ls := r.RQPs[0].LimitStats()
		if ls.Decisions[verbs.DecidePace] == 0 || ls.Decisions[verbs.DecideEscalate] != 1 || !ls.Dropped || !strings.Contains(ls.DropWhy, "escalated") {
			t.Fatalf("limit stats %+v", ls)
		}
	})
}

// A SEND longer than the in-order segment limit is refused part way.
func TestLimitInOrderSegments(t *testing.T) {
	r := newLimRig(t, 1, verbs.OrderingOrdered)
	lim := &verbs.LimitConfig{OnHard: verbs.HardDrop}
	lim.Limits[verbs.LimitInOrderSegs] = verbs.Limit{Hard: 4}
	r.RQPs[0].SetLimits(lim)
	r.sendOn(t, 0, 1, 10<<10) // 10 packets at MTU 1024
	var sent []verbs.WorkCompletion
	r.waitUntilTrue(t, "the failure", [2]*[]verbs.WorkCompletion{&sent, nil}, func() bool { return len(sent) > 0 })
	ls := r.RQPs[0].LimitStats()
	if sent[0].Status != verbs.WCRemOpErr || ls.HardHits[verbs.LimitInOrderSegs] != 1 || ls.Peak[verbs.LimitInOrderSegs] != 5 {
		t.Fatalf("completion %v, limit stats %+v", sent[0].Status, ls)
	}
}

// In weak mode, a hole-span hard limit with the RNR response refuses packets too far past
// a hole (the SEND at PSN 3 is lost once); loss recovery then fills it and everything
// arrives, in order.
func TestLimitWeakHoleSpan(t *testing.T) {
	var mu sync.Mutex
	dropped := false
	filter := func(pkt []byte) netio.Verdict {
		mu.Lock()
		defer mu.Unlock()
		if wire.Opcode(pkt[0]) == wire.OpWeakSend && pkt[11] == 3 && !dropped {
			dropped = true
			return netio.Verdict{Action: netio.Drop}
		}
		return netio.Verdict{Action: netio.Deliver}
	}
	r := openSRQRigWith(t, 1, 256, verbs.OrderingWeak, verbs.WithFilter(verbs.DeviceConfig{}, filter))
	rbuf := make([]byte, 64*64)
	rmr, _ := r.PD[1].RegMR(rbuf, verbs.AccessLocalWrite)
	for i := 0; i < 64; i++ {
		r.SRQ.PostSRQRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{rmr.SGE(i*64, 64)}}})
	}
	lim := &verbs.LimitConfig{OnHard: verbs.HardRNR}
	lim.Limits[verbs.LimitHoleSpan] = verbs.Limit{Soft: 2, Hard: 8}
	r.RQPs[0].SetLimits(lim)
	src, _ := r.PD[0].RegMR(make([]byte, 64), verbs.AccessLocalWrite)
	// One post: the 20 SENDs leave in one burst, so the lost one cannot be resent (by a
	// loss probe, on a loaded machine) before the packets after it arrive.
	wrs := make([]verbs.SendWR, 20)
	for k := range wrs {
		wrs[k] = verbs.SendWR{WRID: uint64(k), Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: []verbs.SGE{src.SGE(0, 64)}}
	}
	if err := r.SQPs[0].PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	sent := pollN(t, r.CQ[0], 20)
	got := pollN(t, r.CQ[1], 20)
	for i := range sent {
		if sent[i].Status != verbs.WCSuccess || got[i].Status != verbs.WCSuccess {
			t.Fatalf("completions %+v %+v", sent[i], got[i])
		}
	}
	ls := r.RQPs[0].LimitStats()
	if !dropped || ls.Decisions[verbs.DecideHardRNR] == 0 || ls.SoftHits[verbs.LimitHoleSpan] == 0 || ls.Peak[verbs.LimitHoleSpan] < 9 {
		t.Fatalf("dropped %v, limit stats %+v", dropped, ls)
	}
}

// End to end: a weakly-ordered WRITE stream through a lossy link, into a QP whose soft
// hole-span limit paces the packets beyond each hole (dropped, for the requester to send
// again): every byte still arrives, and the QPs stay connected.
func TestLimitSoftSpanPacesWritesEndToEnd(t *testing.T) {
	pc := pairConfig{Link: retryLink().InMode(verbs.OrderingWeak)}
	pc.Link.Timeout = 16
	pc.DevA = verbs.DeviceConfig{Faults: &verbs.Faults{Loss: 0.02, Seed: 5}}
	a, b := newPair(t, pc)
	lc := &verbs.LimitConfig{Burst: 4}
	lc.Limits[verbs.LimitHoleSpan] = verbs.Limit{Soft: 8}
	b.qp.SetLimits(lc)
	const n = 4 << 20
	src := mustReg(t, a.pd, pattern(n, 77), verbs.AccessLocalWrite)
	dst := mustReg(t, b.pd, make([]byte, n), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
		SGList: sge(src, 0, n), RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCRDMAWrite, a.qp)
	settle(b.ctx)
	checkBytes(t, "WRITE under pacing", dst.Buf(), src.Buf())
	ls := b.qp.LimitStats()
	t.Logf("decisions %v, soft hits %d, requester %+v", ls.Decisions, ls.SoftHits[verbs.LimitHoleSpan], a.qp.Counters())
	if ls.Decisions[verbs.DecidePace] == 0 {
		t.Error("no packet was paced: the loss never took the span over its soft limit")
	}
	expectState(t, b.qp, verbs.StateRTS)
}
