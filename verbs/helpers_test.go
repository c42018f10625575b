package verbs_test

import (
	"errors"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// The suite's short names for the shared test rig, internal/verbstest, which holds the
// implementation (devices on loopback, connected pairs and SRQ fan-ins, buffers, polling
// and waiting with the failure guard testutil.WaitLimit). The suite keeps its names so
// that a test reads as before; see verbstest for what each does.

// errBusyMachine says that a check could not judge what it checks: the machine was too
// busy (see testutil.Busy).
var errBusyMachine = errors.New("machine too busy")

// waitLimit bounds every wait of the suite. It is a failure guard only: tests wait for
// conditions, never for time (see internal/testutil).
const waitLimit = verbstest.WaitLimit

var ipA, ipB = verbstest.IPA, verbstest.IPB

const (
	allRemote = verbstest.AllRemote // every remote access right
	allAccess = verbstest.AllAccess // every access right an MR can have
)

// Devices, and the progress every wait drives.
var (
	openDevice    = verbstest.OpenDevice
	driveProgress = verbstest.Progress
	settle        = verbstest.Settle
)

// side is one end of a test connection: a device, a PD, a send and a receive CQ and a QP
// (a verbstest.Side).
type side struct {
	ctx      *verbs.Device
	pd       *verbs.PD
	scq, rcq *verbs.CQ
	qp       *verbs.QP
}

func sideOf(s *verbstest.Side) *side {
	return &side{ctx: s.Ctx, pd: s.PD, scq: s.SCQ, rcq: s.RCQ, qp: s.QP}
}

// defaultCap are the queue sizes test QPs get unless a test says otherwise.
var defaultCap = verbstest.DefaultCap

// newSide creates a PD, two CQs of cqe entries and an RC QP in RESET on ctx.
func newSide(t testing.TB, ctx *verbs.Device, cp verbs.QPCap, cqe int, sigAll bool) *side {
	t.Helper()
	return sideOf(verbstest.NewSide(t, ctx, verbstest.SideConfig{Cap: cp, CQE: cqe, SigAll: sigAll}))
}

// Connections, step by step.
type (
	link = verbstest.Link
	step = verbstest.Step
)

var (
	defaultLink = verbstest.DefaultLink
	initStep    = verbstest.InitStep
	rtrStep     = verbstest.RTRStep
	rtsStep     = verbstest.RTSStep
	mustModify  = verbstest.MustModify
	toRTR       = verbstest.ToRTR
	connect     = verbstest.Connect
)

// orderings are the delivery modes the operation tests run in.
var orderings = []verbs.Ordering{verbs.OrderingOrdered, verbs.OrderingWeak}

// forEachOrdering runs fn once per delivery mode, as subtests named "ordered" and "weak".
func forEachOrdering(t *testing.T, fn func(t *testing.T, mode verbs.Ordering)) {
	t.Helper()
	for _, mode := range orderings {
		t.Run(mode.String(), func(t *testing.T) { fn(t, mode) })
	}
}

// Connected pairs.
type pairConfig = verbstest.PairConfig

// newPair opens two devices (127.0.0.1 and 127.0.0.2) and connects a QP on each to the
// other (verbstest.NewPair).
func newPair(t testing.TB, pc pairConfig) (a, b *side) {
	t.Helper()
	x, y := verbstest.NewPair(t, pc)
	return sideOf(x), sideOf(y)
}

// newSides is newPair without the connection: two sides with QPs in RESET
// (verbstest.NewSides).
func newSides(t testing.TB, pc pairConfig) (a, b *side) {
	t.Helper()
	x, y := verbstest.NewSides(t, pc)
	return sideOf(x), sideOf(y)
}

// defaultPair is newPair with every default.
func defaultPair(t testing.TB) (a, b *side) {
	t.Helper()
	return newPair(t, pairConfig{})
}

// modePair is defaultPair with both QPs in delivery mode mode.
func modePair(t testing.TB, mode verbs.Ordering) (a, b *side) {
	t.Helper()
	return newPair(t, pairConfig{Link: defaultLink().InMode(mode)})
}

// SRQ fan-ins.
type srqRig = verbstest.FanIn

// Buffers, posting, polling and waiting.
var (
	mustCQ       = verbstest.MustCQ
	mustReg      = verbstest.MustReg
	sge          = verbstest.SGL
	pattern      = testutil.Pattern
	fill         = testutil.Fill
	checkBytes   = verbstest.CheckBytes
	mustPostSend = verbstest.MustPostSend
	mustPostRecv = verbstest.MustPostRecv
	pollN        = verbstest.PollN
	pollOne      = verbstest.PollOne
	expectEmpty  = verbstest.ExpectEmpty
	waitUntil    = verbstest.WaitUntil
	waitAsync    = verbstest.WaitAsync
	wantSendWC   = verbstest.WantSendWC
	wantStatus   = verbstest.WantStatus
)

// postIndex returns the index a *verbs.PostError names, or -1 if err is not one.
func postIndex(err error) int {
	var pe *verbs.PostError
	if errors.As(err, &pe) {
		return pe.Index
	}
	return -1
}
