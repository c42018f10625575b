package verbs_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// channelPair is a connected pair whose B side has its receive CQ on a completion
// channel.
type channelPair struct {
	a, b *side
	ch   *verbs.CompChannel
	src  *verbs.MR
	dst  *verbs.MR
}

func newChannelPair(t *testing.T) *channelPair {
	t.Helper()
	x, y := verbstest.NewPair(t, verbstest.PairConfig{CQE: 64, ChannelB: true})
	if y.RCQ.Channel() != y.Chan {
		t.Errorf("CQ.Channel() is not the channel it was created with")
	}
	a, b := sideOf(x), sideOf(y)
	p := &channelPair{a: a, b: b, ch: y.Chan,
		src: mustReg(t, a.pd, pattern(64, 1), 0),
		dst: mustReg(t, b.pd, make([]byte, 64), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)}
	for i := 0; i < 32; i++ {
		mustPostRecv(t, b.qp, verbs.RecvWR{WRID: uint64(i), SGList: sge(p.dst, 0, 64)})
	}
	return p
}

// send sends one SEND (solicited or not) and waits for the receive completion.
func (p *channelPair) send(t *testing.T, flags verbs.SendFlags) {
	t.Helper()
	p.post(t, verbs.SendWR{Opcode: verbs.WRSend, SendFlags: flags | verbs.SendSignaled, SGList: sge(p.src, 0, 64)})
}

func (p *channelPair) post(t *testing.T, wr verbs.SendWR) {
	t.Helper()
	mustPostSend(t, p.a.qp, wr)
	if wc := pollOne(t, p.a.scq); wc.Status != verbs.WCSuccess {
		t.Fatalf("send completion %+v", wc)
	}
	if wc := pollOne(t, p.b.rcq); wc.Status != verbs.WCSuccess {
		t.Fatalf("receive completion %+v", wc)
	}
}

// getEvent waits for a completion event and checks it is for cq.
func getEvent(t *testing.T, ch *verbs.CompChannel, cq *verbs.CQ) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	got, err := ch.GetCQEvent(c)
	if err != nil {
		t.Fatalf("GetCQEvent: %v", err)
	}
	if got != cq {
		t.Fatalf("event for CQ %p, want %p", got, cq)
	}
}

// noEvent checks that no completion event is pending.
func noEvent(t *testing.T, ch *verbs.CompChannel, what string) {
	t.Helper()
	if cq, ok := ch.TryGetCQEvent(); ok {
		cq.AckCQEvents(1)
		t.Errorf("%s: unexpected completion event", what)
	}
}

// TestSolicitedEvents checks ibv_req_notify_cq(solicited_only=1): an unsolicited SEND
// completes without an event and leaves the CQ armed, a SEND with IBV_SEND_SOLICITED
// (and an RDMA WRITE with immediate and IBV_SEND_SOLICITED) produces one, and so does an
// error completion.
func TestSolicitedEvents(t *testing.T) {
	p := newChannelPair(t)
	cq := p.b.rcq
	if err := cq.ReqNotifyCQ(true); err != nil {
		t.Fatal(err)
	}
	p.send(t, 0)
	noEvent(t, p.ch, "unsolicited SEND with a solicited-only arm")
	p.send(t, verbs.SendSolicited)
	getEvent(t, p.ch, cq)
	cq.AckCQEvents(1)
	noEvent(t, p.ch, "after the solicited event")

	// WRITE_WITH_IMM carries the solicited bit too.
	if err := cq.ReqNotifyCQ(true); err != nil {
		t.Fatal(err)
	}
	p.post(t, verbs.SendWR{Opcode: verbs.WRRDMAWriteWithImm, SendFlags: verbs.SendSignaled, ImmData: 1,
		SGList: sge(p.src, 0, 8), RemoteAddr: p.dst.Addr(), RKey: p.dst.RKey()})
	noEvent(t, p.ch, "unsolicited WRITE_WITH_IMM")
	p.post(t, verbs.SendWR{Opcode: verbs.WRRDMAWriteWithImm, SendFlags: verbs.SendSignaled | verbs.SendSolicited, ImmData: 2,
		SGList: sge(p.src, 0, 8), RemoteAddr: p.dst.Addr(), RKey: p.dst.RKey()})
	getEvent(t, p.ch, cq)
	cq.AckCQEvents(1)

	// An error completion (the receives flushed when the QP enters ERR) fires a
	// solicited-only arm as well.
	if err := cq.ReqNotifyCQ(true); err != nil {
		t.Fatal(err)
	}
	mustModify(t, p.b.qp, toState(verbs.StateErr)(p.b.qp))
	getEvent(t, p.ch, cq)
	cq.AckCQEvents(1)
	if wc := pollOne(t, cq); wc.Status != verbs.WCWRFlushErr {
		t.Errorf("completion after ERR: %+v, want a flush error", wc)
	}
}

// TestCompletionEvents checks ibv_req_notify_cq(solicited_only=0) and the one-shot rule:
// any completion fires an armed CQ once; further completions give no event until the CQ
// is armed again; arming does not fire for completions already queued.
func TestCompletionEvents(t *testing.T) {
	p := newChannelPair(t)
	cq := p.b.rcq
	if err := cq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	p.send(t, 0)
	getEvent(t, p.ch, cq)
	cq.AckCQEvents(1)

	// Not re-armed: the next completion gives no event. Re-armed: the one after gives
	// exactly one (had the unarmed completion queued an event, it would be pending too).
	p.send(t, 0)
	if err := cq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	p.send(t, 0)
	getEvent(t, p.ch, cq)
	noEvent(t, p.ch, "completion while the CQ was not armed")
	cq.AckCQEvents(1)

	// Arming with completions already waiting does not fire for them. (The responder
	// queues the receive completion before it acknowledges the SEND, so once the sender's
	// completion is there, so is the receiver's.)
	mustPostSend(t, p.a.qp, verbs.SendWR{Opcode: verbs.WRSend, SGList: sge(p.src, 0, 64), SendFlags: verbs.SendSignaled})
	pollOne(t, p.a.scq)
	if err := cq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	noEvent(t, p.ch, "arming with a completion already queued")
	pollOne(t, cq)
	p.send(t, verbs.SendSolicited)
	getEvent(t, p.ch, cq)
	cq.AckCQEvents(1)

	// A CQ without a channel cannot be armed.
	if err := p.a.scq.ReqNotifyCQ(false); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("ReqNotifyCQ on a CQ without a channel: %v, want ErrInvalid", err)
	}
	// GetCQEvent honours its context.
	c, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.ch.GetCQEvent(c); !errors.Is(err, context.Canceled) {
		t.Errorf("GetCQEvent with a cancelled context: %v", err)
	}
}

// TestCQDestroyWithEvents checks the destroy rules around completion events: a
// completion channel cannot be destroyed while a CQ uses it (EBUSY); DestroyCQ waits
// until every event GetCQEvent returned was acknowledged with AckCQEvents; after the CQ
// is gone the channel can be destroyed and GetCQEvent reports that.
func TestCQDestroyWithEvents(t *testing.T) {
	p := newChannelPair(t)
	cq := p.b.rcq
	if err := p.ch.DestroyCompChannel(); !errors.Is(err, verbs.ErrBusy) {
		t.Errorf("DestroyCompChannel with a CQ on it: %v, want ErrBusy", err)
	}
	if err := cq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	p.send(t, 0)
	getEvent(t, p.ch, cq) // taken, not acknowledged yet
	if err := p.b.qp.DestroyQP(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cq.DestroyCQ() }()
	for i := 0; i < 100; i++ {
		runtime.Gosched()
	}
	select {
	case err := <-done:
		t.Fatalf("DestroyCQ returned (%v) before the event was acknowledged", err)
	default:
	}
	cq.AckCQEvents(1)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("DestroyCQ: %v", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("DestroyCQ did not return after AckCQEvents")
	}
	if err := p.ch.DestroyCompChannel(); err != nil {
		t.Fatalf("DestroyCompChannel after its CQ was destroyed: %v", err)
	}
	if err := p.ch.DestroyCompChannel(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("second DestroyCompChannel: %v, want ErrClosed", err)
	}
	if _, err := p.ch.GetCQEvent(context.Background()); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("GetCQEvent on a destroyed channel: %v, want ErrClosed", err)
	}
	if _, err := p.b.ctx.CreateCQ(4, p.ch, 0); err == nil {
		t.Errorf("CreateCQ on a destroyed channel succeeded")
	}
}

// TestCompChannelReady checks that Ready holds a value once an event is queued, so a
// select over it and other channels wakes for the event, and that the event is then
// taken with TryGetCQEvent.
func TestCompChannelReady(t *testing.T) {
	p := newChannelPair(t)
	if err := p.b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	p.send(t, 0)
	select {
	case <-p.ch.Ready():
	case <-time.After(waitLimit):
		t.Fatal("Ready has no value after an event")
	}
	cq, ok := p.ch.TryGetCQEvent()
	if !ok || cq != p.b.rcq {
		t.Fatalf("TryGetCQEvent after Ready = %p, %v; want the receive CQ", cq, ok)
	}
	cq.AckCQEvents(1)
	noEvent(t, p.ch, "after the event was taken")
}
