//go:build linux

// Completion handlers run on threads of their own, which internal/osthread sets up on
// Linux only (elsewhere SetCompletionHandler fails with errors.ErrUnsupported); these
// tests also read the threads' IDs, affinity and policy through Linux system calls.

package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/verbs"
)

// handlerCall is one call of a completion handler function.
type handlerCall struct {
	handler int
	cq      *verbs.CQ
	tid     int
	cpus    unix.CPUSet
	nice    int
	at      time.Time
}

// recorder is a completion handler function that records its calls.
type recorder struct {
	mu    sync.Mutex
	calls []handlerCall
	n     atomic.Int32
	then  func(handler int, cq *verbs.CQ) // runs after recording, if set
}

func (r *recorder) fn(handler int, cq *verbs.CQ) {
	c := handlerCall{handler: handler, cq: cq, tid: unix.Gettid(), at: time.Now()}
	_ = unix.SchedGetaffinity(0, &c.cpus)
	if p, err := unix.Getpriority(unix.PRIO_PROCESS, 0); err == nil {
		c.nice = 20 - p // the raw syscall returns 20 - nice
	}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
	r.n.Add(1)
	if r.then != nil {
		r.then(handler, cq)
	}
}

func (r *recorder) get() []handlerCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]handlerCall(nil), r.calls...)
}

// sendPlain posts a signaled SEND of n bytes from a to b (b has a receive posted) and waits
// for a's completion: the receive completion is then already in b's CQ (the responder
// pushes it before it acknowledges the message).
func sendPlain(t *testing.T, a *side, src *verbs.MR, wrid uint64, flags verbs.SendFlags) {
	t.Helper()
	mustPostSend(t, a.qp, verbs.SendWR{WRID: wrid, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled | flags, SGList: sge(src, 0, 16)})
	wantStatus(t, pollOne(t, a.scq), wrid, verbs.WCSuccess, a.qp)
}

func postRecvs(t *testing.T, b *side, mr *verbs.MR, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		mustPostRecv(t, b.qp, verbs.RecvWR{WRID: uint64(1000 + i), SGList: sge(mr, (i%64)*64, 64)})
	}
}

// handlerPair is a connection whose receiving side's device has the given handlers, with
// buffers and receives posted.
func handlerPair(t *testing.T, handlers []verbs.HandlerConfig) (a, b *side, src, dst *verbs.MR) {
	t.Helper()
	a, b = newPair(t, pairConfig{DevB: verbs.DeviceConfig{CompletionHandlers: handlers}})
	src = mustReg(t, a.pd, pattern(4096, 1), 0)
	dst = mustReg(t, b.pd, make([]byte, 4096), verbs.AccessLocalWrite)
	postRecvs(t, b, dst, 64)
	return a, b, src, dst
}

func TestHandlerConfigErrors(t *testing.T) {
	allowed := allowedCPUs(t)
	bad := []struct {
		name string
		cfg  verbs.DeviceConfig
	}{
		{"empty handler list", verbs.DeviceConfig{CompletionHandlers: []verbs.HandlerConfig{}}},
		{"count mismatch", verbs.DeviceConfig{NumCompVectors: 3, CompletionHandlers: make([]verbs.HandlerConfig, 2)}},
		{"negative CPU", verbs.DeviceConfig{CompletionHandlers: []verbs.HandlerConfig{{CPUs: []int{-1}}}}},
		{"CPU not allowed", verbs.DeviceConfig{CompletionHandlers: []verbs.HandlerConfig{{CPUs: []int{allowed[len(allowed)-1] + 1}}}}},
	}
	for _, c := range bad {
		c.cfg.Addr, c.cfg.Port, c.cfg.Faults = ipA, verbs.AnyPort, &verbs.Faults{}
		if ctx, err := verbs.OpenDevice(c.cfg); !errors.Is(err, verbs.ErrInvalid) {
			if ctx != nil {
				ctx.Close()
			}
			t.Errorf("%s: OpenDevice error %v, want ErrInvalid", c.name, err)
		}
	}

	ctx := openDevice(t, ipA, verbs.DeviceConfig{CompletionHandlers: []verbs.HandlerConfig{{}, {Priority: 1}, {}}})
	if n := ctx.QueryDevice().NumCompVectors; n != 3 {
		t.Fatalf("NumCompVectors %d, want 3", n)
	}
	if ctx2 := openDevice(t, ipB, verbs.DeviceConfig{NumCompVectors: 5}); ctx2.QueryDevice().NumCompVectors != 5 {
		t.Errorf("NumCompVectors %d, want 5", ctx2.QueryDevice().NumCompVectors)
	}
	fn := func(int, *verbs.CQ) {}
	for _, id := range []int{-1, 3, 100} {
		if err := ctx.SetCompletionHandler(id, fn); !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), "not in 0..2") {
			t.Errorf("SetCompletionHandler(%d): %v", id, err)
		}
		if _, err := ctx.HandlerStats(id); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("HandlerStats(%d): %v", id, err)
		}
	}
	for _, v := range []int{-2, 3} {
		if _, err := ctx.CreateCQ(4, nil, v); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("CreateCQ(vector %d): %v", v, err)
		}
	}
	cq, err := ctx.CreateCQ(4, nil, verbs.NoHandler)
	if err != nil || cq.CompVector() != verbs.NoHandler {
		t.Fatalf("CreateCQ(NoHandler): %v, %v", cq, err)
	}
	if err := cq.ReqNotifyCQ(false); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("ReqNotifyCQ without channel or handler: %v", err)
	}
	if err := cq.ModifyCQ(&verbs.CQAttr{Handler: 1}, verbs.CQAttrHandler); err != nil || cq.CompVector() != 1 {
		t.Fatalf("ModifyCQ to handler 1: %v (bound to %d)", err, cq.CompVector())
	}
	if err := cq.ReqNotifyCQ(false); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("ReqNotifyCQ on a handler without a function: %v", err)
	}
	if err := ctx.SetCompletionHandler(1, fn); err != nil {
		t.Fatal(err)
	}
	if err := cq.ReqNotifyCQ(false); err != nil {
		t.Errorf("ReqNotifyCQ on a handler with a function: %v", err)
	}
	badModify := []struct {
		attr verbs.CQAttr
		mask verbs.CQAttrMask
	}{
		{verbs.CQAttr{Handler: 3}, verbs.CQAttrHandler},
		{verbs.CQAttr{Handler: -5}, verbs.CQAttrHandler},
		{verbs.CQAttr{ModerationCount: -1}, verbs.CQAttrModeration},
		{verbs.CQAttr{ModerationCount: verbs.MaxModerationCount + 1}, verbs.CQAttrModeration},
		{verbs.CQAttr{ModerationPeriod: -time.Microsecond}, verbs.CQAttrModeration},
		{verbs.CQAttr{ModerationPeriod: 2 * time.Second}, verbs.CQAttrModeration},
		{verbs.CQAttr{}, 0},
		{verbs.CQAttr{}, 1 << 5},
	}
	for _, c := range badModify {
		if err := cq.ModifyCQ(&c.attr, c.mask); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("ModifyCQ(%+v, %#x): %v", c.attr, c.mask, err)
		}
	}
	if err := cq.ModifyCQ(nil, verbs.CQAttrHandler); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("ModifyCQ(nil): %v", err)
	}
	if got := cq.QueryCQ(); got.Handler != 1 || got.ModerationCount != 0 {
		t.Errorf("QueryCQ after refused modifications: %+v", got)
	}
	if err := cq.ModifyCQ(&verbs.CQAttr{Handler: verbs.NoHandler, ModerationCount: 8, ModerationPeriod: time.Millisecond},
		verbs.CQAttrHandler|verbs.CQAttrModeration); err != nil {
		t.Fatal(err)
	}
	if got := cq.QueryCQ(); got != (verbs.CQAttr{Handler: verbs.NoHandler, ModerationCount: 8, ModerationPeriod: time.Millisecond}) {
		t.Errorf("QueryCQ: %+v", got)
	}
	if err := cq.DestroyCQ(); err != nil {
		t.Fatal(err)
	}
	if err := cq.ModifyCQ(&verbs.CQAttr{Handler: 0}, verbs.CQAttrHandler); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("ModifyCQ on a destroyed CQ: %v", err)
	}
}

func allowedCPUs(t *testing.T) []int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	var l []int
	for i := 0; i < 1024; i++ {
		if set.IsSet(i) {
			l = append(l, i)
		}
	}
	return l
}

// A handler's function is called on the handler's own OS thread, pinned to its CPU set
// (visible in the thread's affinity mask), with the handler's id and the CQ; a lower
// priority runs at a higher nice value.
func TestHandlerThreadPinned(t *testing.T) {
	cpus := allowedCPUs(t)
	last := cpus[len(cpus)-1]
	a, b, src, _ := handlerPair(t, []verbs.HandlerConfig{{CPUs: []int{cpus[0]}, Priority: 0}, {CPUs: []int{last}, Priority: 7}})
	var rec recorder
	for id := 0; id < 2; id++ {
		if err := b.ctx.SetCompletionHandler(id, rec.fn); err != nil {
			t.Fatal(err)
		}
	}
	// b's receive CQ is on handler 0; then re-bound to handler 1.
	for round, want := range []int{0, 1} {
		if round == 1 {
			if err := b.rcq.ModifyCQ(&verbs.CQAttr{Handler: 1}, verbs.CQAttrHandler); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.rcq.ReqNotifyCQ(false); err != nil {
			t.Fatal(err)
		}
		sendPlain(t, a, src, uint64(round), 0)
		waitUntil(t, "the handler call", func() bool { return int(rec.n.Load()) == round+1 })
		c := rec.get()[round]
		if c.handler != want || c.cq != b.rcq {
			t.Fatalf("round %d: called as handler %d for CQ %p, want handler %d for %p", round, c.handler, c.cq, want, b.rcq)
		}
		pin := cpus[0]
		if want == 1 {
			pin = last
		}
		if c.cpus.Count() != 1 || !c.cpus.IsSet(pin) {
			t.Errorf("handler %d ran with affinity of %d CPUs, want only CPU %d", want, c.cpus.Count(), pin)
		}
		st, _ := b.ctx.HandlerStats(want)
		if st.ThreadID != c.tid || c.tid == unix.Gettid() {
			t.Errorf("handler %d: called on thread %d, its thread is %d (the test's is %d)", want, c.tid, st.ThreadID, unix.Gettid())
		}
		// The same, seen from outside the thread.
		status, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/status", c.tid))
		if err != nil {
			t.Fatal(err)
		}
		if line := grepLine(string(status), "Cpus_allowed_list:"); strings.TrimSpace(line) != fmt.Sprint(pin) {
			t.Errorf("handler %d thread: Cpus_allowed_list %q, want %d", want, line, pin)
		}
		wantNice := 5 // handler 0 has the lower priority
		if want == 1 {
			wantNice = 0
		}
		if c.nice != wantNice || st.Nice != wantNice {
			t.Errorf("handler %d: nice %d (stats %d), want %d", want, c.nice, st.Nice, wantNice)
		}
		pollN(t, b.rcq, 1)
	}
}

func grepLine(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimPrefix(l, prefix)
		}
	}
	return ""
}

// Arming is one shot: however many completions arrive, one event per ReqNotifyCQ.
// Completions already queued when the CQ is armed raise nothing.
func TestHandlerOneShot(t *testing.T) {
	a, b, src, _ := handlerPair(t, []verbs.HandlerConfig{{}})
	var rec recorder
	if err := b.ctx.SetCompletionHandler(0, rec.fn); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 1, 0) // before arming: no event, even after arming
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 2, 0)
	sendPlain(t, a, src, 3, 0)
	sendPlain(t, a, src, 4, 0)
	waitUntil(t, "the event", func() bool { return rec.n.Load() >= 1 })
	pollN(t, b.rcq, 4)
	sendPlain(t, a, src, 5, 0) // not armed: no event
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 6, 0)
	waitUntil(t, "the second event", func() bool { return rec.n.Load() >= 2 })
	pollN(t, b.rcq, 2)
	// Every event the handler got is accounted for: exactly two.
	settle(a.ctx, b.ctx)
	if st, _ := b.ctx.HandlerStats(0); st.Events != 2 || st.Calls != 2 || rec.n.Load() != 2 {
		t.Errorf("events %d, calls %d, recorded %d; want 2", st.Events, st.Calls, rec.n.Load())
	}
}

// Solicited-only arming: unsolicited completions do not raise the event; a solicited one
// (SEND or WRITE with immediate with the SE bit) or an error completion does.
func TestHandlerSolicitedOnly(t *testing.T) {
	a, b, src, _ := handlerPair(t, []verbs.HandlerConfig{{}})
	var rec recorder
	if err := b.ctx.SetCompletionHandler(0, rec.fn); err != nil {
		t.Fatal(err)
	}
	remote := mustReg(t, b.pd, make([]byte, 64), allAccess)
	if err := b.rcq.ReqNotifyCQ(true); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 1, 0)
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMAWriteWithImm, SendFlags: verbs.SendSignaled, ImmData: 7,
		SGList: sge(src, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()})
	wantStatus(t, pollOne(t, a.scq), 2, verbs.WCSuccess, a.qp)
	// Two receive completions are in the CQ and nothing woke the handler: the next
	// solicited one does, and the handler then finds all three.
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMAWriteWithImm, SendFlags: verbs.SendSignaled | verbs.SendSolicited,
		ImmData: 8, SGList: sge(src, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()})
	wantStatus(t, pollOne(t, a.scq), 3, verbs.WCSuccess, a.qp)
	waitUntil(t, "the solicited event", func() bool { return rec.n.Load() >= 1 })
	wcs := pollN(t, b.rcq, 3)
	if wcs[2].ImmData != 8 {
		t.Errorf("third completion %+v, want the solicited WRITE with immediate 8", wcs[2])
	}
	if st, _ := b.ctx.HandlerStats(0); st.Events != 1 {
		t.Errorf("%d events for one solicited completion", st.Events)
	}
	// A solicited SEND.
	if err := b.rcq.ReqNotifyCQ(true); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 4, 0)
	sendPlain(t, a, src, 5, verbs.SendSolicited)
	waitUntil(t, "the solicited SEND's event", func() bool { return rec.n.Load() >= 2 })
	pollN(t, b.rcq, 2)
	// An error completion: the receives are flushed when the QP errors.
	if err := b.rcq.ReqNotifyCQ(true); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the error completion's event", func() bool { return rec.n.Load() >= 3 })
	if wc := pollOne(t, b.rcq); wc.Status != verbs.WCWRFlushErr {
		t.Errorf("completion after the QP errored: %+v", wc)
	}
	if st, _ := b.ctx.HandlerStats(0); st.Events != 3 {
		t.Errorf("%d events, want 3", st.Events)
	}
}

// Moderation: the event waits for ModerationCount completions, or ModerationPeriod after
// the first, whichever comes first.
func TestHandlerModeration(t *testing.T) {
	a, b, src, _ := handlerPair(t, []verbs.HandlerConfig{{}})
	var rec recorder
	if err := b.ctx.SetCompletionHandler(0, rec.fn); err != nil {
		t.Fatal(err)
	}
	if err := b.rcq.ModifyCQ(&verbs.CQAttr{ModerationCount: 4, ModerationPeriod: verbs.MaxModerationPeriod}, verbs.CQAttrModeration); err != nil {
		t.Fatal(err)
	}
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		sendPlain(t, a, src, uint64(i), 0)
	}
	if st, _ := b.ctx.HandlerStats(0); st.Events != 0 {
		t.Fatalf("an event after 3 of 4 completions")
	}
	sendPlain(t, a, src, 4, 0)
	waitUntil(t, "the event at the 4th completion", func() bool { return rec.n.Load() == 1 })
	pollN(t, b.rcq, 4)

	// The period: one completion, and the event comes no sooner than the period after it.
	const period = 20 * time.Millisecond
	if err := b.rcq.ModifyCQ(&verbs.CQAttr{ModerationCount: 1000, ModerationPeriod: period}, verbs.CQAttrModeration); err != nil {
		t.Fatal(err)
	}
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	sendPlain(t, a, src, 5, 0)
	waitUntil(t, "the event at the end of the period", func() bool { return rec.n.Load() == 2 })
	if d := rec.get()[1].at.Sub(start); d < period {
		t.Errorf("event %v after the completion, before the %v period", d, period)
	}
	pollN(t, b.rcq, 1)

	// Both: the count wins when the completions come quickly.
	if err := b.rcq.ModifyCQ(&verbs.CQAttr{ModerationCount: 2, ModerationPeriod: verbs.MaxModerationPeriod}, verbs.CQAttrModeration); err != nil {
		t.Fatal(err)
	}
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 6, 0)
	sendPlain(t, a, src, 7, 0)
	waitUntil(t, "the event at the 2nd completion", func() bool { return rec.n.Load() == 3 })
	pollN(t, b.rcq, 2)
	// Off again: at once.
	if err := b.rcq.ModifyCQ(&verbs.CQAttr{}, verbs.CQAttrModeration); err != nil {
		t.Fatal(err)
	}
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 8, 0)
	waitUntil(t, "the unmoderated event", func() bool { return rec.n.Load() == 4 })
	pollN(t, b.rcq, 1)

	// A count of 1 with a period: the first completion is the count, at once — the event
	// is raised with the completion, before the sender's ACK leaves, not a second later.
	if err := b.rcq.ModifyCQ(&verbs.CQAttr{ModerationCount: 1, ModerationPeriod: verbs.MaxModerationPeriod}, verbs.CQAttrModeration); err != nil {
		t.Fatal(err)
	}
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 9, 0)
	if st, _ := b.ctx.HandlerStats(0); st.Events != 5 {
		t.Errorf("%d events once the SEND completed, want 5: ModerationCount 1 waited for the period", st.Events)
	}
}

// armedCQ handles a CQ's completion events with the arm-then-drain protocol of
// CQ.ReqNotifyCQ, and checks that every event answers an arming (a CQ handled by it is
// armed once to start).
type armedCQ struct {
	// qp and dst, if set, get a receive posted back for each completion (WRID k: dst's
	// bytes k*64 to k*64+64).
	qp  *verbs.QP
	dst *verbs.MR
	// beforeArm, if set, runs in each call between the drain and the arm.
	beforeArm func()

	armed  atomic.Bool  // armed, its event not handled yet
	got    atomic.Int64 // completions handled
	dup    atomic.Int32 // events without an arming
	failed atomic.Value // what went wrong first (string)
}

// fail records what went wrong, unless something did before.
func (r *armedCQ) fail(what string) { r.failed.CompareAndSwap(nil, what) }

// armedBatch is how many completions one poll of armedCQ takes.
const armedBatch = 32

// handle handles an event of cq. The CQ's events may go to another handler, or its
// channel, while a call runs (ModifyCQ): two calls for one CQ may overlap.
func (r *armedCQ) handle(cq *verbs.CQ) {
	if !r.armed.CompareAndSwap(true, false) {
		r.dup.Add(1)
	}
	wc := make([]verbs.WorkCompletion, armedBatch)
	r.drain(cq, wc)
	if r.beforeArm != nil {
		r.beforeArm()
	}
	// Before the arm: its event may be handled at once, by another call.
	r.armed.Store(true)
	if err := cq.ReqNotifyCQ(false); err != nil {
		r.fail(err.Error())
	}
	// Completions that came between the drain and the arm raise no event: take them all,
	// however many polls that needs. (Taking one poll's worth and leaving the rest to the
	// arm would strand them: only a completion after the arm raises its event.) The
	// first completion after the arm raises the arm's event whether this drain takes it
	// or not; the call for that event may then find nothing, which is fine.
	r.drain(cq, wc)
}

// drain polls cq until it is empty.
func (r *armedCQ) drain(cq *verbs.CQ, wc []verbs.WorkCompletion) {
	for n := cq.PollCQ(wc); n > 0; n = cq.PollCQ(wc) {
		r.took(wc[:n])
	}
}

// took counts polled completions and posts their receives back.
func (r *armedCQ) took(wcs []verbs.WorkCompletion) {
	for _, w := range wcs {
		if w.Status != verbs.WCSuccess {
			r.fail(fmt.Sprintf("receive completion %+v", w))
		}
		if r.qp != nil {
			_ = r.qp.PostRecv([]verbs.RecvWR{{WRID: w.WRID, SGList: sge(r.dst, int(w.WRID)*64, 64)}})
		}
	}
	r.got.Add(int64(len(wcs)))
}

// Completions that arrive while a handler function is between its drain and its arm
// raise no event (the arm is for the next completion): the function takes them after
// arming, all of them however many polls that needs, and nothing is left in the CQ
// without an event to come for it. The function is held at that point while more
// completions than one poll takes arrive.
func TestHandlerDrainAfterArm(t *testing.T) {
	a, b, src, _ := handlerPair(t, []verbs.HandlerConfig{{}})
	const more = armedBatch + 8
	held, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	var returned atomic.Int32
	r := &armedCQ{beforeArm: func() {
		if first.CompareAndSwap(false, true) {
			close(held)
			<-release
		}
	}}
	if err := b.rcq.ModifyCQ(&verbs.CQAttr{Handler: 0}, verbs.CQAttrHandler); err != nil {
		t.Fatal(err)
	}
	if err := b.ctx.SetCompletionHandler(0, func(_ int, cq *verbs.CQ) {
		r.handle(cq)
		returned.Add(1)
	}); err != nil {
		t.Fatal(err)
	}
	r.armed.Store(true)
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 0, 0)
	<-held // the function took the first completion and has not armed the CQ again
	for i := 1; i <= more; i++ {
		sendPlain(t, a, src, uint64(i), 0) // its receive completion is in the CQ on return
	}
	close(release)
	waitUntil(t, "the call's return", func() bool { return returned.Load() == 1 })
	if got := r.got.Load(); got != 1+more {
		armed, waiting := verbs.CQState(b.rcq)
		t.Errorf("the call handled %d completions, want %d: %d left in the CQ (armed %v) with no event to come for them", got, 1+more, waiting, armed)
	}
	if f := r.failed.Load(); f != nil {
		t.Error(f)
	}
	if st, _ := b.ctx.HandlerStats(0); st.Calls != 1 || r.dup.Load() != 0 {
		t.Errorf("%d calls, %d without an arming; want 1, 0", st.Calls, r.dup.Load())
	}
}

// The arm-then-drain loop in a handler function never misses a completion, with
// completions arriving at any moment (and CQs moving between handlers, and off them to
// their completion channel and back, meanwhile): every message is received, each event
// comes from one arming, none twice.
func TestHandlerRebindUnderLoad(t *testing.T) {
	const ncq, perQP = 4, 2000
	// Four connections between two devices, each with its own receive CQ.
	devB := openDevice(t, ipB, verbs.DeviceConfig{CompletionHandlers: []verbs.HandlerConfig{{}, {}, {Priority: 1}}})
	devA := openDevice(t, ipA, verbs.DeviceConfig{})
	type conn struct {
		a, b *side
		src  *verbs.MR
		armedCQ
		// The sender's progress: SENDs posted and completed.
		sent, done atomic.Int64
	}
	conns := make([]*conn, ncq)
	byCQ := map[*verbs.CQ]*conn{}
	// The receive CQs have a completion channel: unbound from the handlers (NoHandler),
	// their events go there, and a goroutine hands them to the same function.
	ch, err := devB.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	for i := range conns {
		c := &conn{a: newSide(t, devA, defaultCap, 1024, false), b: newSideRecvChannel(t, devB, ch)}
		connect(t, c.a.qp, 0x10, c.b.qp.Endpoint(0x20), defaultLink())
		connect(t, c.b.qp, 0x20, c.a.qp.Endpoint(0x10), defaultLink())
		c.src = mustReg(t, c.a.pd, make([]byte, 64), 0)
		c.qp, c.dst = c.b.qp, mustReg(t, c.b.pd, make([]byte, 64*256), verbs.AccessLocalWrite)
		for k := 0; k < 256; k++ {
			mustPostRecv(t, c.b.qp, verbs.RecvWR{WRID: uint64(k), SGList: sge(c.dst, k*64, 64)})
		}
		conns[i] = c
		byCQ[c.b.rcq] = c
	}
	fn := func(_ int, cq *verbs.CQ) { byCQ[cq].handle(cq) }
	failed := func() any {
		for _, c := range conns {
			if f := c.failed.Load(); f != nil {
				return f
			}
		}
		return nil
	}
	for id := 0; id < 3; id++ {
		if err := devB.SetCompletionHandler(id, fn); err != nil {
			t.Fatal(err)
		}
	}
	var viaChannel atomic.Int64
	chanCtx, chanStop := context.WithCancel(context.Background())
	chanDone := make(chan struct{})
	go func() {
		defer close(chanDone)
		for {
			cq, err := ch.GetCQEvent(chanCtx)
			if err != nil {
				return
			}
			cq.AckCQEvents(1)
			viaChannel.Add(1)
			fn(-1, cq)
		}
	}()
	defer func() { chanStop(); <-chanDone }()
	for _, c := range conns {
		c.armed.Store(true)
		if err := c.b.rcq.ReqNotifyCQ(false); err != nil {
			t.Fatal(err)
		}
	}
	// Senders: each connection keeps up to 64 SENDs outstanding.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, c := range conns {
		wg.Add(1)
		go func(c *conn) {
			defer wg.Done()
			wc := make([]verbs.WorkCompletion, 64)
			sent, done := 0, 0
			for done < perQP {
				for sent < perQP && sent-done < 64 {
					if err := c.a.qp.PostSend([]verbs.SendWR{{WRID: uint64(sent), Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(c.src, 0, 32)}}); err != nil {
						c.fail(err.Error())
						return
					}
					sent++
					c.sent.Store(int64(sent))
				}
				n := c.a.scq.PollCQ(wc)
				for _, w := range wc[:n] {
					if w.Status != verbs.WCSuccess {
						c.fail(fmt.Sprintf("send completion %+v", w))
					}
				}
				done += n
				c.done.Store(int64(done))
				if n == 0 {
					runtime.Gosched()
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		}(c)
	}
	// Meanwhile, move the CQs between handlers (and off them and back).
	rebinds := 0
	deadline := time.Now().Add(waitLimit)
	for total := int64(0); total < ncq*perQP; {
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			for i, c := range conns {
				engineArmed, waiting := verbs.CQState(c.b.rcq)
				t.Logf("connection %d: %d handled; sender %v (%d posted, %d completed), receiver %v; receive CQ bound to %d, armed %v (the device: %v), %d completions waiting",
					i, c.got.Load(), c.a.qp.State(), c.sent.Load(), c.done.Load(), c.b.qp.State(), c.b.rcq.CompVector(), c.armed.Load(), engineArmed, waiting)
			}
			for id := 0; id < 3; id++ {
				st, _ := devB.HandlerStats(id)
				t.Logf("handler %d: %d events, %d calls, %d pending, %d rerouted, %d dropped", id, st.Events, st.Calls, st.Pending, st.Rerouted, st.Dropped)
			}
			t.Logf("%d events through the channel", viaChannel.Load())
			t.Fatalf("timed out: %d of %d messages handled (an event was lost?)", total, ncq*perQP)
		}
		c := conns[rebinds%ncq]
		h := rebinds % 4 // handlers 0, 1, 2, and none (the channel)
		if h == 3 {
			h = verbs.NoHandler
		}
		if err := c.b.rcq.ModifyCQ(&verbs.CQAttr{Handler: h}, verbs.CQAttrHandler); err != nil {
			t.Fatal(err)
		}
		rebinds++
		driveProgress()
		total = 0
		for _, c := range conns {
			total += c.got.Load()
		}
		if f := failed(); f != nil {
			t.Fatal(f)
		}
	}
	close(stop)
	wg.Wait()
	for i, c := range conns {
		if n := c.dup.Load(); n != 0 {
			t.Errorf("connection %d: %d events without an arming (duplicates)", i, n)
		}
	}
	var events uint64
	for id := 0; id < 3; id++ {
		st, _ := devB.HandlerStats(id)
		events += st.Calls
		if st.Dropped != 0 {
			t.Errorf("handler %d dropped %d events", id, st.Dropped)
		}
	}
	t.Logf("%d messages, %d events by handlers and %d through the channel, %d re-bindings", ncq*perQP, events, viaChannel.Load(), rebinds)
}

// Priorities decide dispatch order: with two handlers' events pending at once, the
// higher-priority handler's function is called first, even when the lower one was woken
// first and would otherwise run first. One P makes the order observable: the test's
// goroutine raises both events (by flushing two receive queues), then lets the handlers
// run. "First" is when the call begins: the lower-priority handler goes ahead once the
// higher one is in its function, so its function observes that the higher one's call has
// begun (HandlerStats.Calls), not that it got further.
func TestHandlerPriorityOrder(t *testing.T) {
	ctx := openDevice(t, ipB, verbs.DeviceConfig{CompletionHandlers: []verbs.HandlerConfig{{Priority: 1}, {Priority: 9}}})
	// A handler waits for a higher-priority one a millisecond at most, which a busy
	// machine may not give the higher one's thread: here it waits as long as it takes.
	verbs.WaitForHigherPriority(ctx)
	const low, high = 0, 1
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf := mustReg(t, pd, make([]byte, 4096), verbs.AccessLocalWrite)
	var cqs [2]*verbs.CQ
	var qps [2]*verbs.QP
	for h := 0; h < 2; h++ {
		if cqs[h], err = ctx.CreateCQ(64, nil, h); err != nil {
			t.Fatal(err)
		}
		if qps[h], err = pd.CreateQP(&verbs.QPInitAttr{SendCQ: cqs[h], RecvCQ: cqs[h], Cap: defaultCap}); err != nil {
			t.Fatal(err)
		}
	}
	// A call of the low-priority handler records how many calls the high-priority one had
	// begun by then.
	type call struct {
		handler   int
		highCalls uint64
	}
	var mu sync.Mutex
	var calls []call
	fn := func(h int, cq *verbs.CQ) {
		c := call{handler: h}
		if h == low {
			st, _ := ctx.HandlerStats(high)
			c.highCalls = st.Calls
		}
		mu.Lock()
		calls = append(calls, c)
		mu.Unlock()
	}
	for id := 0; id < 2; id++ {
		if err := ctx.SetCompletionHandler(id, fn); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(calls)
	}
	for round := 0; round < 5; round++ {
		for h := 0; h < 2; h++ {
			if err := qps[h].ModifyQP(&verbs.QPAttr{QPState: verbs.StateReset}, verbs.QPAttrState); err != nil {
				t.Fatal(err)
			}
			mustModify(t, qps[h], initStep(verbs.AccessLocalWrite))
			mustPostRecv(t, qps[h], verbs.RecvWR{WRID: 1, SGList: sge(buf, 0, 64)})
			drain(cqs[h])
			if err := cqs[h].ReqNotifyCQ(false); err != nil {
				t.Fatal(err)
			}
		}
		mu.Lock()
		calls = calls[:0]
		mu.Unlock()
		st, _ := ctx.HandlerStats(high)
		before := st.Calls
		prev := runtime.GOMAXPROCS(1)
		// High priority first, then low: without priorities the one woken last (low) runs
		// first. Each flush raises its CQ's event before ModifyQP returns.
		for _, h := range []int{high, low} {
			if err := qps[h].ModifyQP(&verbs.QPAttr{QPState: verbs.StateErr}, verbs.QPAttrState); err != nil {
				runtime.GOMAXPROCS(prev)
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(waitLimit) // a failure guard only
		for count() < 2 && time.Now().Before(deadline) {
			runtime.Gosched()
		}
		runtime.GOMAXPROCS(prev)
		mu.Lock()
		got := append([]call(nil), calls...)
		mu.Unlock()
		if len(got) != 2 || got[0].handler == got[1].handler {
			t.Fatalf("round %d: calls %+v, want one of each handler", round, got)
		}
		for _, c := range got {
			if c.handler == low && c.highCalls != before+1 {
				t.Fatalf("round %d: the low-priority handler's function was called when the high-priority one had begun %d calls of this round, want 1 (it first)", round, c.highCalls-before)
			}
		}
	}
}

func drain(cq *verbs.CQ) {
	wc := make([]verbs.WorkCompletion, 64)
	for cq.PollCQ(wc) > 0 {
	}
}

// Removing a handler's function sends its CQs' events to their channels again; DestroyCQ
// drops events still queued for the CQ; Close stops the handlers.
func TestHandlerRemoveAndDestroy(t *testing.T) {
	a, b, src, _ := handlerPair(t, []verbs.HandlerConfig{{}})
	ch, err := b.ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := b.ctx.CreateCQ(64, ch, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Move b's QP receives onto cq by recreating the connection's receive side: simplest
	// is a second connection.
	a2 := newSide(t, a.ctx, defaultCap, 64, false)
	pd := b.pd
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: defaultCap})
	if err != nil {
		t.Fatal(err)
	}
	b2 := &side{ctx: b.ctx, pd: pd, scq: cq, rcq: cq, qp: qp}
	connect(t, a2.qp, 0x30, b2.qp.Endpoint(0x40), defaultLink())
	connect(t, b2.qp, 0x40, a2.qp.Endpoint(0x30), defaultLink())
	postRecvs(t, b2, mustReg(t, pd, make([]byte, 4096), verbs.AccessLocalWrite), 8)
	src2 := mustReg(t, a2.pd, make([]byte, 64), 0)

	var rec recorder
	if err := b.ctx.SetCompletionHandler(0, rec.fn); err != nil {
		t.Fatal(err)
	}
	if err := cq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a2, src2, 1, 0)
	waitUntil(t, "the handler's event", func() bool { return rec.n.Load() == 1 })
	if _, ok := ch.TryGetCQEvent(); ok {
		t.Fatal("the channel got the event too")
	}
	pollN(t, cq, 1)
	// Without the function the channel gets it.
	if err := b.ctx.SetCompletionHandler(0, nil); err != nil {
		t.Fatal(err)
	}
	if err := cq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a2, src2, 2, 0)
	var got *verbs.CQ
	waitUntil(t, "the channel's event", func() bool {
		c, ok := ch.TryGetCQEvent()
		got = c
		return ok
	})
	if got != cq || rec.n.Load() != 1 {
		t.Fatalf("channel event for %p (want %p); handler calls %d", got, cq, rec.n.Load())
	}
	cq.AckCQEvents(1)
	pollN(t, cq, 1)

	// A handler whose function blocks: an event queued behind it for a CQ that is then
	// destroyed is dropped, not delivered.
	block := make(chan struct{})
	var entered atomic.Bool
	if err := b.ctx.SetCompletionHandler(0, func(h int, c *verbs.CQ) {
		if c == b.rcq {
			entered.Store(true)
			<-block
		}
		rec.fn(h, c)
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 3, 0)
	waitUntil(t, "the blocking call", entered.Load)
	if err := cq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a2, src2, 4, 0)
	waitUntil(t, "the queued event", func() bool { st, _ := b.ctx.HandlerStats(0); return st.Pending == 1 })
	if err := b2.qp.DestroyQP(); err != nil {
		t.Fatal(err)
	}
	if err := cq.DestroyCQ(); err != nil {
		t.Fatal(err)
	}
	close(block)
	waitUntil(t, "the blocked call's return", func() bool { return rec.n.Load() == 2 })
	st, _ := b.ctx.HandlerStats(0)
	if st.Dropped != 1 || st.Pending != 0 {
		t.Errorf("after DestroyCQ: dropped %d, pending %d; want 1, 0", st.Dropped, st.Pending)
	}
	if calls := rec.get(); len(calls) != 2 || calls[1].cq != b.rcq {
		t.Errorf("handler calls %+v: the destroyed CQ's queued event must not be delivered", calls)
	}
	if err := b.ctx.Close(); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.ctx.HandlerStats(0); st.Running {
		t.Errorf("handler still running after Close")
	}
}

// A RealTime handler runs under SCHED_FIFO, where the process may.
func TestHandlerRealTime(t *testing.T) {
	ctx := openDevice(t, ipA, verbs.DeviceConfig{CompletionHandlers: []verbs.HandlerConfig{{RealTime: true}}})
	policy := make(chan int, 1)
	err := ctx.SetCompletionHandler(0, func(int, *verbs.CQ) {
		p, _, _ := unix.Syscall(unix.SYS_SCHED_GETSCHEDULER, 0, 0, 0)
		policy <- int(p)
	})
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("real-time scheduling not permitted here: %v", err)
		}
		t.Fatal(err)
	}
	pd, _ := ctx.AllocPD()
	cq, err := ctx.CreateCQ(4, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: defaultCap})
	if err != nil {
		t.Fatal(err)
	}
	mustModify(t, qp, initStep(verbs.AccessLocalWrite))
	buf := mustReg(t, pd, make([]byte, 64), verbs.AccessLocalWrite)
	mustPostRecv(t, qp, verbs.RecvWR{WRID: 1, SGList: sge(buf, 0, 64)})
	if err := cq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	if err := qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-policy:
		if p != 1 { // SCHED_FIFO
			t.Errorf("handler thread policy %d, want SCHED_FIFO (1)", p)
		}
	case <-time.After(waitLimit):
		t.Fatal("no handler call")
	}
	if st, _ := ctx.HandlerStats(0); !st.RealTime || st.Nice != 0 {
		t.Errorf("stats %+v", st)
	}
}

// newSideRecvChannel is newSide whose receive CQ has the completion channel ch.
func newSideRecvChannel(t *testing.T, ctx *verbs.Device, ch *verbs.CompChannel) *side {
	t.Helper()
	s := &side{ctx: ctx, scq: mustCQ(t, ctx, 1024, nil), rcq: mustCQ(t, ctx, 1024, ch)}
	var err error
	if s.pd, err = ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.qp, err = s.pd.CreateQP(&verbs.QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, Cap: defaultCap}); err != nil {
		t.Fatal(err)
	}
	return s
}

// An event queued for a handler whose function is removed before it runs is re-routed to
// the CQ's completion channel (and counted as Rerouted), not lost.
func TestHandlerRemovedEventRerouted(t *testing.T) {
	devB := openDevice(t, ipB, verbs.DeviceConfig{CompletionHandlers: []verbs.HandlerConfig{{}}})
	devA := openDevice(t, ipA, verbs.DeviceConfig{})
	ch, err := devB.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	a, b := newSide(t, devA, defaultCap, 64, false), newSideRecvChannel(t, devB, ch)
	connect(t, a.qp, 0x10, b.qp.Endpoint(0x20), defaultLink())
	connect(t, b.qp, 0x20, a.qp.Endpoint(0x10), defaultLink())
	src := mustReg(t, a.pd, make([]byte, 64), 0)
	dst := mustReg(t, b.pd, make([]byte, 64*4), verbs.AccessLocalWrite)
	postRecvs(t, b, dst, 4)
	if err := b.rcq.ModifyCQ(&verbs.CQAttr{Handler: 0}, verbs.CQAttrHandler); err != nil {
		t.Fatal(err)
	}
	inCall, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	if err := devB.SetCompletionHandler(0, func(int, *verbs.CQ) {
		if calls.Add(1) == 1 {
			close(inCall)
			<-release // hold the handler while the next event queues behind this one
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 1, 0)
	<-inCall
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 2, 0) // its event queues behind the running call
	waitUntil(t, "the second event queued", func() bool { st, _ := devB.HandlerStats(0); return st.Events == 2 })
	if err := devB.SetCompletionHandler(0, nil); err != nil {
		t.Fatal(err)
	}
	close(release)
	c, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	cq, err := ch.GetCQEvent(c)
	if err != nil || cq != b.rcq {
		t.Fatalf("GetCQEvent: %v, %v; want the re-routed event of the receive CQ", cq, err)
	}
	cq.AckCQEvents(1)
	if st, _ := devB.HandlerStats(0); st.Rerouted != 1 || st.Calls != 1 {
		t.Errorf("handler stats %+v: want 1 call and 1 event re-routed", st)
	}
}

// ScheduleEvent puts the CQ's event at the back of its handler's queue: a CQ that
// reschedules itself while another CQ's event waits is called again after that one (X, Y,
// X), as a NAPI poll function yields to the others.
func TestHandlerScheduleEventOrder(t *testing.T) {
	devB := openDevice(t, ipB, verbs.DeviceConfig{CompletionHandlers: []verbs.HandlerConfig{{}}})
	devA := openDevice(t, ipA, verbs.DeviceConfig{})
	var a, b [2]*side
	for i := range a {
		a[i], b[i] = newSide(t, devA, defaultCap, 64, false), newSide(t, devB, defaultCap, 64, false)
		connect(t, a[i].qp, 0x10, b[i].qp.Endpoint(0x20), defaultLink())
		connect(t, b[i].qp, 0x20, a[i].qp.Endpoint(0x10), defaultLink())
		postRecvs(t, b[i], mustReg(t, b[i].pd, make([]byte, 4096), verbs.AccessLocalWrite), 4)
		if err := b[i].rcq.ModifyCQ(&verbs.CQAttr{Handler: 0}, verbs.CQAttrHandler); err != nil {
			t.Fatal(err)
		}
	}
	x, y := b[0].rcq, b[1].rcq
	src := mustReg(t, a[0].pd, make([]byte, 64), 0)
	srcY := mustReg(t, a[1].pd, make([]byte, 64), 0)
	inCall, yQueued := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var order []string
	if err := devB.SetCompletionHandler(0, func(_ int, cq *verbs.CQ) {
		mu.Lock()
		name := map[*verbs.CQ]string{x: "X", y: "Y"}[cq]
		order = append(order, name)
		first := len(order) == 1
		mu.Unlock()
		if first {
			close(inCall)
			<-yQueued // Y's event now waits behind this call
			if err := x.ScheduleEvent(); err != nil {
				t.Error(err)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, cq := range []*verbs.CQ{x, y} {
		if err := cq.ReqNotifyCQ(false); err != nil {
			t.Fatal(err)
		}
	}
	sendPlain(t, a[0], src, 1, 0)
	<-inCall
	sendPlain(t, a[1], srcY, 2, 0)
	close(yQueued)
	waitUntil(t, "three calls", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 3 })
	mu.Lock()
	defer mu.Unlock()
	if order[0] != "X" || order[1] != "Y" || order[2] != "X" {
		t.Errorf("calls %v, want [X Y X]: the rescheduled CQ after the one waiting", order)
	}
}

// Handlers can be added and removed on a running device (seed 001, Fig. 4: a handler
// registered as its consumer arrives): QueryDevice counts them, an added one handles its
// CQs' events, a removed one's CQs fall back to their completion channel, and ids are not
// reused.
func TestHandlersAddedAndRemoved(t *testing.T) {
	devB := openDevice(t, ipB, verbs.DeviceConfig{CompletionHandlers: []verbs.HandlerConfig{{}}})
	devA := openDevice(t, ipA, verbs.DeviceConfig{})
	if n := devB.QueryDevice().NumCompVectors; n != 1 {
		t.Fatalf("NumCompVectors %d, want 1", n)
	}
	id, err := devB.AddCompletionHandler(verbs.HandlerConfig{Priority: 1})
	if err != nil || id != 1 {
		t.Fatalf("AddCompletionHandler: %d, %v; want id 1", id, err)
	}
	if n := devB.QueryDevice().NumCompVectors; n != 2 {
		t.Fatalf("NumCompVectors %d after adding one, want 2", n)
	}
	var calls atomic.Int32
	if err := devB.SetCompletionHandler(id, func(int, *verbs.CQ) { calls.Add(1) }); err != nil {
		t.Fatal(err)
	}
	ch, err := devB.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	a, b := newSide(t, devA, defaultCap, 64, false), newSideRecvChannel(t, devB, ch)
	connect(t, a.qp, 0x10, b.qp.Endpoint(0x20), defaultLink())
	connect(t, b.qp, 0x20, a.qp.Endpoint(0x10), defaultLink())
	src := mustReg(t, a.pd, make([]byte, 64), 0)
	postRecvs(t, b, mustReg(t, b.pd, make([]byte, 4096), verbs.AccessLocalWrite), 4)
	if err := b.rcq.ModifyCQ(&verbs.CQAttr{Handler: id}, verbs.CQAttrHandler); err != nil {
		t.Fatal(err)
	}
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 1, 0)
	waitUntil(t, "the added handler's call", func() bool { return calls.Load() == 1 })
	pollN(t, b.rcq, 1)

	if err := devB.RemoveCompletionHandler(id); err != nil {
		t.Fatal(err)
	}
	if n := devB.QueryDevice().NumCompVectors; n != 1 {
		t.Errorf("NumCompVectors %d after removing one, want 1", n)
	}
	if got := b.rcq.QueryCQ().Handler; got != verbs.NoHandler {
		t.Errorf("CQ of the removed handler bound to %d, want NoHandler", got)
	}
	if _, err := devB.HandlerStats(id); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("HandlerStats of a removed handler: %v, want ErrInvalid", err)
	}
	if err := devB.RemoveCompletionHandler(id); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("removing it twice: %v, want ErrInvalid", err)
	}
	if err := b.rcq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	sendPlain(t, a, src, 2, 0)
	c, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if cq, err := ch.GetCQEvent(c); err != nil || cq != b.rcq {
		t.Fatalf("event after the handler was removed: %v, %v; want it on the CQ's channel", cq, err)
	} else {
		cq.AckCQEvents(1)
	}
	if calls.Load() != 1 {
		t.Errorf("the removed handler was called %d times, want 1", calls.Load())
	}

	if id2, err := devB.AddCompletionHandler(verbs.HandlerConfig{}); err != nil || id2 != 2 {
		t.Errorf("AddCompletionHandler after a removal: %d, %v; want the new id 2", id2, err)
	}
	if _, err := devB.AddCompletionHandler(verbs.HandlerConfig{CPUs: []int{-1}}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("a handler on CPU -1: %v, want ErrInvalid", err)
	}
	devB.Close()
	if _, err := devB.AddCompletionHandler(verbs.HandlerConfig{}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("AddCompletionHandler after Close: %v, want ErrClosed", err)
	}
}
