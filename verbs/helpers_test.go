package verbs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/verbs"
)

// errBusyMachine says that a check could not judge what it checks: the machine was too
// busy (see testutil.Busy).
var errBusyMachine = errors.New("machine too busy")

// waitLimit bounds every wait of the suite. It is a failure guard only: tests wait for
// conditions, never for time (see internal/testutil).
const waitLimit = testutil.WaitLimit

var (
	ipA = netip.MustParseAddr("127.0.0.1")
	ipB = netip.MustParseAddr("127.0.0.2")
)

// allRemote is every remote access right.
const allRemote = verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic

// allAccess is every access right an MR can have.
const allAccess = verbs.AccessLocalWrite | allRemote

// openDevice opens a device on ip with an ephemeral UDP port and closes it when the test
// ends. Unless cfg says otherwise, fault injection is off (SOFTRNIC_FAULTS is ignored) so
// that tests are deterministic.
func openDevice(t testing.TB, ip netip.Addr, cfg verbs.DeviceConfig) *verbs.Context {
	t.Helper()
	cfg.Addr = ip
	cfg.Port = verbs.AnyPort
	if cfg.Faults == nil {
		cfg.Faults = &verbs.Faults{}
	}
	ctx, err := verbs.OpenDevice(cfg)
	if err != nil {
		t.Fatalf("OpenDevice(%v): %v", ip, err)
	}
	t.Cleanup(func() { ctx.Close() })
	cq, err := ctx.CreateCQ(1, nil, 0)
	if err != nil {
		t.Fatalf("CreateCQ: %v", err)
	}
	progress.Lock()
	progress.cqs[ctx] = cq
	progress.Unlock()
	t.Cleanup(func() {
		progress.Lock()
		delete(progress.cqs, ctx)
		progress.Unlock()
	})
	return ctx
}

// progress holds an empty CQ of every open test device. Polling an empty CQ lets its
// device process the packets waiting on its socket in the calling goroutine (as
// documented for PollCQ). Waiting loops do that for every device, so that a test does not
// depend on the Go scheduler running another device's receive goroutine while the test
// goroutine busy-polls: on a loaded machine that goroutine can wait for tens of
// milliseconds, long enough for short ACK timeouts to expire.
var progress = struct {
	sync.Mutex
	cqs map[*verbs.Context]*verbs.CQ
}{cqs: map[*verbs.Context]*verbs.CQ{}}

// driveProgress lets every open test device process its waiting packets, then yields.
func driveProgress() {
	progress.Lock()
	cqs := make([]*verbs.CQ, 0, len(progress.cqs))
	for _, cq := range progress.cqs {
		cqs = append(cqs, cq)
	}
	progress.Unlock()
	var wc [1]verbs.WorkCompletion
	for _, cq := range cqs {
		cq.PollCQ(wc[:])
	}
	runtime.Gosched()
}

// side is one end of a test connection: a device, a PD, a send and a receive CQ and a QP.
type side struct {
	ctx      *verbs.Context
	pd       *verbs.PD
	scq, rcq *verbs.CQ
	qp       *verbs.QP
}

// defaultCap are the queue sizes test QPs get unless a test says otherwise.
var defaultCap = verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 8, MaxRecvSGE: 8, MaxInlineData: 256}

// newSide creates a PD, two CQs of cqe entries and an RC QP in RESET on ctx.
func newSide(t testing.TB, ctx *verbs.Context, cp verbs.QPCap, cqe int, sigAll bool) *side {
	t.Helper()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	scq := mustCQ(t, ctx, cqe, nil)
	rcq := mustCQ(t, ctx, cqe, nil)
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: scq, RecvCQ: rcq, Cap: cp, SQSigAll: sigAll})
	if err != nil {
		t.Fatalf("CreateQP: %v", err)
	}
	return &side{ctx: ctx, pd: pd, scq: scq, rcq: rcq, qp: qp}
}

func mustCQ(t testing.TB, ctx *verbs.Context, cqe int, ch *verbs.CompChannel) *verbs.CQ {
	t.Helper()
	cq, err := ctx.CreateCQ(cqe, ch, 0)
	if err != nil {
		t.Fatalf("CreateCQ(%d): %v", cqe, err)
	}
	return cq
}

func mustReg(t testing.TB, pd *verbs.PD, buf []byte, access verbs.AccessFlags) *verbs.MR {
	t.Helper()
	mr, err := pd.RegMR(buf, access)
	if err != nil {
		t.Fatalf("RegMR(%d bytes, %#x): %v", len(buf), access, err)
	}
	return mr
}

// link are the connection attributes a test connects QPs with; every field is used as
// is (unlike verbs.ConnectOptions, zero means zero).
type link struct {
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

// defaultLink is a link that does not time out spuriously even on a loaded machine (67 ms
// ACK timeout, 7 retries: nothing is lost without fault injection) and retries RNR
// forever after 10 µs.
func defaultLink() link {
	return link{MTU: verbs.MTU1024, Access: allRemote, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
		MinRNRTimer: 1, MaxRdAtomic: 16, MaxDestRdAtomic: 16}
}

// orderings are the delivery modes the operation tests run in.
var orderings = []verbs.Ordering{verbs.OrderingOrdered, verbs.OrderingWeak}

// forEachOrdering runs fn once per delivery mode, as subtests named "ordered" and "weak".
func forEachOrdering(t *testing.T, fn func(t *testing.T, mode verbs.Ordering)) {
	t.Helper()
	for _, mode := range orderings {
		t.Run(mode.String(), func(t *testing.T) { fn(t, mode) })
	}
}

// inMode returns l with delivery mode mode.
func (l link) inMode(mode verbs.Ordering) link {
	l.Ordering = mode
	return l
}

// modePair is defaultPair with both QPs in delivery mode mode.
func modePair(t testing.TB, mode verbs.Ordering) (a, b *side) {
	t.Helper()
	return newPair(t, pairConfig{link: defaultLink().inMode(mode)})
}

// step is one ModifyQP call: attributes and the mask that selects them.
type step struct {
	attr verbs.QPAttr
	mask verbs.QPAttrMask
}

// modify applies the step to qp.
func (s step) modify(qp *verbs.QP) error {
	a := s.attr
	return qp.ModifyQP(&a, s.mask)
}

// initStep is RESET->INIT with every required attribute.
func initStep(access verbs.AccessFlags) step {
	return step{verbs.QPAttr{QPState: verbs.StateInit, PortNum: 1, QPAccessFlags: access},
		verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags}
}

// rtrStep is INIT->RTR with every required attribute, receiving from remote, plus the
// delivery mode if l is not ordered.
func rtrStep(remote verbs.Endpoint, l link) step {
	s := step{verbs.QPAttr{QPState: verbs.StateRTR, PathMTU: l.MTU, DestQPNum: remote.QPNum, RQPSN: remote.PSN,
		MaxDestRdAtomic: l.MaxDestRdAtomic, MinRNRTimer: l.MinRNRTimer,
		AHAttr: verbs.AHAttr{DGID: remote.GID, DestPort: remote.Port, SrcPort: remote.Port, PortNum: 1, IsGlobal: true, HopLimit: 64}},
		verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN |
			verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer}
	if l.Ordering != verbs.OrderingOrdered {
		s.attr.Ordering = l.Ordering
		s.mask |= verbs.QPAttrOrdering
	}
	return s
}

// rtsStep is RTR->RTS with every required attribute, sending from sqPSN.
func rtsStep(sqPSN uint32, l link) step {
	return step{verbs.QPAttr{QPState: verbs.StateRTS, SQPSN: sqPSN, Timeout: l.Timeout, RetryCnt: l.RetryCnt,
		RNRRetry: l.RNRRetry, MaxRdAtomic: l.MaxRdAtomic},
		verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry |
			verbs.QPAttrSQPSN | verbs.QPAttrMaxQPRdAtomic}
}

func mustModify(t testing.TB, qp *verbs.QP, s step) {
	t.Helper()
	if err := s.modify(qp); err != nil {
		t.Fatalf("ModifyQP(%v -> %v, %v): %v", qp.State(), s.attr.QPState, s.mask, err)
	}
}

// toRTR moves a QP in RESET through INIT to RTR, receiving from remote.
func toRTR(t testing.TB, qp *verbs.QP, remote verbs.Endpoint, l link) {
	t.Helper()
	mustModify(t, qp, initStep(l.Access))
	mustModify(t, qp, rtrStep(remote, l))
}

// connect moves a QP in RESET to RTS, connected to remote and sending from sqPSN.
func connect(t testing.TB, qp *verbs.QP, sqPSN uint32, remote verbs.Endpoint, l link) {
	t.Helper()
	toRTR(t, qp, remote, l)
	mustModify(t, qp, rtsStep(sqPSN, l))
}

// pairConfig says how newPair builds a connection; zero fields take defaults.
type pairConfig struct {
	link       link
	psnA, psnB uint32 // first send PSN of A and B (default 0x100 and 0x200)
	devA, devB verbs.DeviceConfig
	cap        verbs.QPCap // default: defaultCap
	cqe        int         // entries of each CQ (default 1024)
	sigAll     bool
}

// newPair opens two devices (127.0.0.1 and 127.0.0.2) and connects a QP on each to the
// other, both in the link's delivery mode.
func newPair(t testing.TB, pc pairConfig) (a, b *side) {
	t.Helper()
	if pc.link == (link{}) {
		pc.link = defaultLink()
	}
	if pc.psnA == 0 && pc.psnB == 0 {
		pc.psnA, pc.psnB = 0x100, 0x200
	}
	if pc.cap == (verbs.QPCap{}) {
		pc.cap = defaultCap
	}
	if pc.cqe == 0 {
		pc.cqe = 1024
	}
	a = newSide(t, openDevice(t, ipA, pc.devA), pc.cap, pc.cqe, pc.sigAll)
	b = newSide(t, openDevice(t, ipB, pc.devB), pc.cap, pc.cqe, pc.sigAll)
	connect(t, a.qp, pc.psnA, b.qp.Endpoint(pc.psnB), pc.link)
	connect(t, b.qp, pc.psnB, a.qp.Endpoint(pc.psnA), pc.link)
	for _, s := range []*side{a, b} {
		if attr, _ := s.qp.QueryQP(); attr.Ordering != pc.link.Ordering {
			t.Fatalf("QP %#x connected in %v mode, want %v", s.qp.QPNum(), attr.Ordering, pc.link.Ordering)
		}
	}
	return a, b
}

// defaultPair is newPair with every default.
func defaultPair(t testing.TB) (a, b *side) {
	t.Helper()
	return newPair(t, pairConfig{})
}

// pollN polls cq until n completions arrived and returns them in the order polled.
func pollN(t testing.TB, cq *verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	out := make([]verbs.WorkCompletion, 0, n)
	buf := make([]verbs.WorkCompletion, 64)
	deadline := time.Now().Add(waitLimit)
	for len(out) < n {
		k := cq.PollCQ(buf[:min(len(buf), n-len(out))])
		if k == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("timed out after %v with %d of %d completions: %+v", waitLimit, len(out), n, out)
			}
			driveProgress()
			continue
		}
		out = append(out, buf[:k]...)
	}
	return out
}

// pollOne polls cq until one completion arrived.
func pollOne(t testing.TB, cq *verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	return pollN(t, cq, 1)[0]
}

// expectEmpty checks that cq holds no completion (after letting the device process
// whatever packets are waiting).
func expectEmpty(t testing.TB, cq *verbs.CQ, what string) {
	t.Helper()
	wc := make([]verbs.WorkCompletion, 8)
	if n := cq.PollCQ(wc); n != 0 {
		t.Errorf("%s: unexpected completions %+v", what, wc[:n])
	}
}

// waitUntil waits until cond holds, failing the test after waitLimit.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitLimit, what)
		}
		driveProgress()
	}
}

// waitAsync waits for an asynchronous event of type typ on ctx and returns it. It
// acknowledges every event it takes and logs (and skips) events of other types.
func waitAsync(t testing.TB, ctx *verbs.Context, typ verbs.EventType) verbs.AsyncEvent {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for {
		ev, err := ctx.GetAsyncEvent(c)
		if err != nil {
			t.Fatalf("waiting for async event %q: %v", typ, err)
		}
		e := *ev
		ctx.AckAsyncEvent(ev)
		if e.Type == typ {
			return e
		}
		t.Logf("skipping async event %q (%s)", e.Type, e.Detail)
	}
}

// wantSendWC checks a requester completion: WRID, status, opcode and QP number.
func wantSendWC(t testing.TB, got verbs.WorkCompletion, wrid uint64, op verbs.WCOpcode, qp *verbs.QP) {
	t.Helper()
	if got.WRID != wrid || got.Status != verbs.WCSuccess || got.Opcode != op || got.QPNum != qp.QPNum() {
		t.Errorf("completion %+v (status %v), want WRID %d, success, %v, QPNum %#x", got, got.Status, wrid, op, qp.QPNum())
	}
}

// wantStatus checks an error completion's WRID, status and QP number (the only fields
// libibverbs defines for it).
func wantStatus(t testing.TB, got verbs.WorkCompletion, wrid uint64, st verbs.WCStatus, qp *verbs.QP) {
	t.Helper()
	if got.WRID != wrid || got.Status != st || got.QPNum != qp.QPNum() {
		t.Errorf("completion WRID %d status %q QPNum %#x, want WRID %d status %q QPNum %#x",
			got.WRID, got.Status, got.QPNum, wrid, st, qp.QPNum())
	}
}

// pattern returns n pseudo-random bytes determined by seed.
func pattern(n int, seed uint64) []byte {
	b := make([]byte, n+7)
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := 0; i < n; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	return b[:n:n]
}

// checkBytes reports where got differs from want.
func checkBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d bytes, want %d", what, len(got), len(want))
		return
	}
	firstDiff, n := -1, 0
	for i := range got {
		if got[i] != want[i] {
			if firstDiff < 0 {
				firstDiff = i
			}
			n++
		}
	}
	t.Errorf("%s: %d of %d bytes differ, first at offset %d (got %#x, want %#x)",
		what, n, len(got), firstDiff, got[firstDiff], want[firstDiff])
}

// mustPostSend posts wrs and fails the test on error.
func mustPostSend(t testing.TB, qp *verbs.QP, wrs ...verbs.SendWR) {
	t.Helper()
	if err := qp.PostSend(wrs); err != nil {
		t.Fatalf("PostSend: %v", err)
	}
}

// mustPostRecv posts wrs and fails the test on error.
func mustPostRecv(t testing.TB, qp *verbs.QP, wrs ...verbs.RecvWR) {
	t.Helper()
	if err := qp.PostRecv(wrs); err != nil {
		t.Fatalf("PostRecv: %v", err)
	}
}

// postIndex returns the index a *verbs.PostError names, or -1 if err is not one.
func postIndex(err error) int {
	var pe *verbs.PostError
	if errors.As(err, &pe) {
		return pe.Index
	}
	return -1
}

func sge(mr *verbs.MR, off, n int) []verbs.SGE { return []verbs.SGE{mr.SGE(off, n)} }

// settle orders, for the race detector, the work the devices' engines did so far before
// what the test does next, and what the test did before their later work. RDMA places
// and fetches data in the devices' goroutines and reports completion through the network:
// the requester's completion proves that the responder placed the data, but the race
// detector cannot see an ordering carried by packets. The engine touches registered
// memory only while it holds the device's receive path or a QP's lock, and
// Context.Counters takes both. (A real program learns that an RDMA WRITE arrived from a
// later message it receives, which orders it in the same way.)
func settle(ctxs ...*verbs.Context) {
	for _, c := range ctxs {
		c.Counters()
	}
}
