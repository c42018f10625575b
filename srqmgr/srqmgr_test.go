package srqmgr

import (
	"context"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// rig is n connections into one SRQ of the receiving device (verbstest.FanIn) and a
// 64-byte source buffer on the sending device.
type rig struct {
	*verbstest.FanIn
	src *verbs.MR
}

func newRig(t *testing.T, n, srqWR int) *rig {
	t.Helper()
	r := &rig{FanIn: verbstest.NewFanIn(t, verbstest.FanInConfig{
		N:       n,
		SRQ:     verbs.SRQInitAttr{MaxWR: srqWR, MaxSGE: 1},
		CQE:     8192,
		SendCap: verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 1, MaxSendSGE: 1},
		RecvCap: verbs.QPCap{MaxSendWR: 4},
		Options: verbs.ConnectOptions{Timeout: 14, RNRRetry: 7, MinRNRTimer: 1},
		PSN:     func(int) (uint32, uint32) { return 1, 2 },
	})}
	r.src = verbstest.MustReg(t, r.PD[0], make([]byte, 64), verbs.AccessLocalWrite)
	return r
}

// send sends k[i] messages on connection i, and consumes them all (releasing the buffers
// unless keep).
func (r *rig) send(t *testing.T, m *Manager, k []int, keep ...bool) {
	t.Helper()
	total := 0
	for i, n := range k {
		for j := 0; j < n; j++ {
			if err := r.SQPs[i].PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: []verbs.SGE{r.src.SGE(0, 64)}}}); err != nil {
				t.Fatal(err)
			}
		}
		total += n
	}
	wc := make([]verbs.WorkCompletion, 64)
	deadline := time.Now().Add(testutil.WaitLimit)
	for got, sent := 0, 0; got < total || sent < total; {
		if n := r.CQ[1].PollCQ(wc); n > 0 {
			for _, e := range wc[:n] {
				if e.Status != verbs.WCSuccess {
					t.Fatalf("receive %+v", e)
				}
				if b, ok := m.Buffer(e.WRID); !ok || len(b) != 64 {
					t.Fatal("buffer")
				}
				if len(keep) == 0 {
					m.Release(e.WRID)
				}
			}
			got += n
		}
		sent += r.CQ[0].PollCQ(wc)
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d received, %d sent", got, total, sent)
		}
	}
}

// TestTargetFollowsDemand steps the demand of 8 connections up and down and checks that the
// target depth follows, that per-connection shares are set, and that registered memory
// shrinks back when demand falls.
func TestTargetFollowsDemand(t *testing.T) {
	const n = 8
	r := newRig(t, n, 4096)
	m := r.manager(t)
	tickEveryInterval(m)
	for _, qp := range r.RQPs {
		m.Attach(qp)
	}
	if s := m.Stats(); s.Target != 8 || s.Posted != 8 {
		t.Fatalf("initial %+v", s)
	}
	step := r.stepper(t, m)
	low := step(2, 8)
	high := step(40, 8)
	down := step(2, 16)
	t.Logf("low %d, high %d, down %d (registered %d, %d, %d bytes)", low.Target, high.Target, down.Target,
		low.RegisteredBytes, high.RegisteredBytes, down.RegisteredBytes)
	if !(low.Target >= 16 && low.Target < 40) {
		t.Fatalf("low demand (8 x 2 per interval): target %d", low.Target)
	}
	if !(high.Target >= 8*40 && high.Target < 8*40*2) {
		t.Fatalf("high demand (8 x 40 per interval): target %d", high.Target)
	}
	if down.Target >= high.Target/4 {
		t.Fatalf("demand fell back to 8 x 2: target %d", down.Target)
	}
	// Posted WQEs cannot be taken back: above a falling target the SRQ drains to it as
	// connections consume (and released buffers are retired).
	if high.Posted < high.Target {
		t.Fatalf("posted %d, target %d", high.Posted, high.Target)
	}
	if down.RegisteredBytes >= high.RegisteredBytes {
		t.Fatalf("registered memory did not shrink: %d -> %d", high.RegisteredBytes, down.RegisteredBytes)
	}
	for _, c := range high.Conns {
		if c.Mean < 30*100 || c.Share < c.Mean || c.Limits.Share <= 0 { // 40 per 10 ms interval: 4000/s
			t.Fatalf("connection stats %+v", c)
		}
	}
}

// TestLimitEventRefills checks that the SRQ's low-watermark event makes the manager refill
// before its next tick.
func TestLimitEventRefills(t *testing.T) {
	r := newRig(t, 1, 1024)
	m, err := New(Config{SRQ: r.SRQ, PD: r.PD[1], BufSize: 64, Floor: 16, Chunk: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.Attach(r.RQPs[0])
	r.send(t, m, []int{13}, true) // 16 - 13 = 3 < 16/4 (buffers kept): the event fires
	deadline := time.Now().Add(testutil.WaitLimit)
	for {
		ev, ok := r.Ctx[1].TryGetAsyncEvent()
		if ok {
			r.Ctx[1].AckAsyncEvent(ev)
			if m.HandleEvent(ev) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no SRQ limit event")
		}
	}
	if s := m.Stats(); s.Posted != s.Target || s.LimitEvents != 1 {
		t.Fatalf("after the limit event: %+v", s)
	}
}

func TestNormalQuantile(t *testing.T) {
	for _, c := range []struct{ p, z float64 }{{0.999, 3.090}, {0.99, 2.326}, {0.9, 1.2816}} {
		if z := normalQuantile(c.p); z < c.z-0.001 || z > c.z+0.001 {
			t.Errorf("quantile(%g) = %g, want %g", c.p, z, c.z)
		}
	}
}

// Buffer refuses WRIDs that are not the manager's lent buffers (instead of panicking), and
// Close stops Run and makes Buffer refuse everything.
func TestBufferForeignWRIDAndCloseStopsRun(t *testing.T) {
	r := newRig(t, 1, 64)
	m, err := New(Config{SRQ: r.SRQ, PD: r.PD[1], BufSize: 64, Floor: 8, Chunk: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, wrid := range []uint64{1 << 40, 1 << 31, 999999} {
		if b, ok := m.Buffer(wrid); ok || b != nil {
			t.Errorf("Buffer(%d) = %d bytes, %v; want nothing for a WRID the manager never posted", wrid, len(b), ok)
		}
		m.Release(wrid) // must not panic either
	}
	if _, ok := m.Buffer(0); !ok {
		t.Error("Buffer(0): the manager posted buffer 0 and it was not released")
	}
	stopped := make(chan struct{})
	go func() { m.Run(context.Background()); close(stopped) }()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	case <-time.After(testutil.WaitLimit):
		t.Fatal("Run still running after Close")
	}
	if _, ok := m.Buffer(0); ok {
		t.Error("Buffer after Close returned a buffer of the deregistered pool")
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// When refills come late (the Ticks of a busy machine), the SRQ must last longer between
// them: at the same rate of demand, a target measured with 30 ms gaps between Ticks is
// about three times the one with 10 ms gaps.
func TestTargetCoversLateRefills(t *testing.T) {
	const n = 4
	r := newRig(t, n, 4096)
	m := r.manager(t)
	clock, gap := time.Unix(0, 0), m.cfg.Interval
	m.now = func() time.Time { clock = clock.Add(gap); return clock }
	for _, qp := range r.RQPs {
		m.Attach(qp)
	}
	run := func(per, ticks int) int {
		for i := 0; i < ticks; i++ {
			r.send(t, m, []int{per, per, per, per})
			m.Tick()
		}
		return m.Stats().Target
	}
	onTime := run(10, 12) // 4 × 10 per 10 ms: 4,000 WQEs/s
	gap = 3 * m.cfg.Interval
	late := run(30, 12) // the same 4,000 WQEs/s, refilled every 30 ms
	t.Logf("target %d with refills every 10 ms, %d every 30 ms", onTime, late)
	if onTime < 40 || onTime > 80 {
		t.Errorf("on time: target %d, want about 40 and its margin", onTime)
	}
	if late < 120 || late > 2*120 {
		t.Errorf("late refills: target %d, want about 120 (40 per 10 ms over 30 ms) and its margin", late)
	}
}

// The manager resizes the SRQ: demand above its size grows it (the target is not clamped
// to the size the SRQ was created with), and when demand falls it shrinks back, never
// below MinDepth.
func TestResizesSRQ(t *testing.T) {
	const n = 8
	r := newRig(t, n, 64)
	m, err := New(Config{SRQ: r.SRQ, PD: r.PD[1], BufSize: 64, Floor: 8, Chunk: 32, Alpha: 0.5, MaxDepth: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tickEveryInterval(m)
	for _, qp := range r.RQPs {
		m.Attach(qp)
	}
	step := r.stepper(t, m)
	high := step(40, 8) // 320 per interval, five times the SRQ's 64
	if high.Depth < 320 || high.Target < 320 || high.Posted < high.Target {
		t.Fatalf("high demand: SRQ size %d, target %d, posted %d; want all at least 320", high.Depth, high.Target, high.Posted)
	}
	low := step(1, 24)
	if low.Depth >= high.Depth || low.Depth < 64 {
		t.Fatalf("low demand: SRQ size %d (was %d); want it smaller, and not below MinDepth 64", low.Depth, high.Depth)
	}
	if low.Resizes < 2 {
		t.Errorf("%d resizes, want at least one up and one down", low.Resizes)
	}
}

// tickEveryInterval gives m a clock that advances one interval per Tick: demand per Tick
// is demand per interval, however long the test's sends take.
func tickEveryInterval(m *Manager) {
	clock := time.Unix(0, 0)
	m.now = func() time.Time { clock = clock.Add(m.cfg.Interval); return clock }
}

// stepper returns a function that, ticks times, sends per messages on every connection of
// the rig and Ticks m, then returns m's stats.
func (r *rig) stepper(t *testing.T, m *Manager) func(per, ticks int) Stats {
	return func(per, ticks int) Stats {
		k := make([]int, len(r.SQPs))
		for i := range k {
			k[i] = per
		}
		for i := 0; i < ticks; i++ {
			r.send(t, m, k)
			m.Tick()
		}
		return m.Stats()
	}
}

// The common path in one call: Start runs the manager, Consume reads and releases each
// buffer; no Tick, Run, HandleEvent or Release by hand. Bursts far above the floor get
// through, and at the end the SRQ is topped up to the target with every buffer back. Whether
// the manager's own refills (between its measurements) or the releases kept the SRQ fed
// depends on the scheduler, so the test does not ask which.
func TestStartConsume(t *testing.T) {
	const n, per = 4, 200
	r := newRig(t, n, 4096)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := Start(ctx, Config{SRQ: r.SRQ, PD: r.PD[1], BufSize: 64, Floor: 8, Chunk: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, qp := range r.RQPs {
		m.Attach(qp)
	}
	payload := []byte("sixty-four bytes at most, and these are the ones we send here!!")
	copy(r.src.Buf(), payload)
	for i := 0; i < n; i++ {
		for j := 0; j < per; j++ {
			if err := r.SQPs[i].PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: []verbs.SGE{r.src.SGE(0, len(payload))}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	wc := make([]verbs.WorkCompletion, 64)
	got, sent, bad := 0, 0, 0
	deadline := time.Now().Add(testutil.WaitLimit)
	for got < n*per || sent < n*per {
		k := r.CQ[1].PollCQ(wc)
		for i := range wc[:k] {
			if !m.Consume(&wc[i], func(msg []byte) {
				if string(msg) != string(payload) {
					bad++
				}
			}) || wc[i].Status != verbs.WCSuccess {
				t.Fatalf("completion %+v", wc[i])
			}
		}
		got += k
		sent += r.CQ[0].PollCQ(wc)
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d received, %d sent", got, n*per, sent)
		}
	}
	if bad != 0 {
		t.Errorf("%d messages differ from what was sent", bad)
	}
	if s := m.Summary(); s.InUse != 0 || s.Posted < s.Target {
		t.Errorf("summary %+v: want every buffer released and the SRQ at its target", s)
	}
}

// An interval in which a connection's limit queue refused it (paced it) does not raise its
// measured demand: a flood earns no larger share, and no larger SRQ. The same flood without
// refusals does raise it.
func TestPacedIntervalDoesNotRaiseDemand(t *testing.T) {
	for _, paced := range []bool{true, false} {
		r := newRig(t, 1, 4096)
		m := r.manager(t)
		tickEveryInterval(m)
		m.Attach(r.RQPs[0])
		var taken, refused uint64
		m.conns[r.RQPs[0]].demand = func() (uint64, uint64) { return taken, refused }
		for i := 0; i < 8; i++ { // 2 WQEs per 10 ms interval: 200/s
			taken += 2
			m.Tick()
		}
		before := m.Stats()
		for i := 0; i < 8; i++ { // 40 per interval: a flood
			taken += 40
			if paced {
				refused += 5 // its limit queue refused some of it
			}
			m.Tick()
		}
		after := m.Stats()
		m.Close()
		rose := after.Conns[0].Mean > before.Conns[0].Mean*1.01
		t.Logf("paced %v: mean %.0f/s -> %.0f/s, target %d -> %d", paced, before.Conns[0].Mean, after.Conns[0].Mean, before.Target, after.Target)
		if paced && (rose || after.Target > before.Target) {
			t.Errorf("paced intervals raised the measured demand: mean %.0f -> %.0f WQEs/s, target %d -> %d",
				before.Conns[0].Mean, after.Conns[0].Mean, before.Target, after.Target)
		}
		if !paced && !rose {
			t.Errorf("an unpaced flood did not raise the measured demand (%.0f -> %.0f): the test shows nothing", before.Conns[0].Mean, after.Conns[0].Mean)
		}
	}
}

// manager returns a manager of the rig's SRQ with 64-byte buffers, a floor of 8, chunks of
// 32 and a fast-moving mean (Alpha 0.5), closed when the test ends.
func (r *rig) manager(t *testing.T) *Manager {
	t.Helper()
	m, err := New(Config{SRQ: r.SRQ, PD: r.PD[1], BufSize: 64, Floor: 8, Chunk: 32, Alpha: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
