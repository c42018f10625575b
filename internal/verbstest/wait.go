package verbstest

import (
	"context"
	"testing"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// PollN polls cq until n completions arrived and returns them in the order polled.
func PollN(t testing.TB, cq *verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	out := make([]verbs.WorkCompletion, 0, n)
	buf := make([]verbs.WorkCompletion, 64)
	deadline := time.Now().Add(WaitLimit)
	for len(out) < n {
		k := cq.PollCQ(buf[:min(len(buf), n-len(out))])
		if k == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("timed out after %v with %d of %d completions: %+v", WaitLimit, len(out), n, out)
			}
			Progress()
			continue
		}
		out = append(out, buf[:k]...)
	}
	return out
}

// PollOne polls cq until one completion arrived.
func PollOne(t testing.TB, cq *verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	return PollN(t, cq, 1)[0]
}

// ExpectEmpty checks that cq holds no completion (after letting the device process
// whatever packets are waiting).
func ExpectEmpty(t testing.TB, cq *verbs.CQ, what string) {
	t.Helper()
	wc := make([]verbs.WorkCompletion, 8)
	if n := cq.PollCQ(wc); n != 0 {
		t.Errorf("%s: unexpected completions %+v", what, wc[:n])
	}
}

// WaitUntil waits until cond holds, failing the test after WaitLimit.
func WaitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", WaitLimit, what)
		}
		Progress()
	}
}

// WaitAsync waits for an asynchronous event of type typ on ctx and returns it. It
// acknowledges every event it takes and logs (and skips) events of other types.
func WaitAsync(t testing.TB, ctx *verbs.Device, typ verbs.EventType) verbs.AsyncEvent {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), WaitLimit)
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

// WantSendWC checks a requester completion: WRID, status, opcode and QP number.
func WantSendWC(t testing.TB, got verbs.WorkCompletion, wrid uint64, op verbs.WCOpcode, qp *verbs.QP) {
	t.Helper()
	if got.WRID != wrid || got.Status != verbs.WCSuccess || got.Opcode != op || got.QPNum != qp.QPNum() {
		t.Errorf("completion %+v (status %v), want WRID %d, success, %v, QPNum %#x", got, got.Status, wrid, op, qp.QPNum())
	}
}

// WantStatus checks an error completion's WRID, status and QP number (the only fields
// libibverbs defines for it).
func WantStatus(t testing.TB, got verbs.WorkCompletion, wrid uint64, st verbs.WCStatus, qp *verbs.QP) {
	t.Helper()
	if got.WRID != wrid || got.Status != st || got.QPNum != qp.QPNum() {
		t.Errorf("completion WRID %d status %q QPNum %#x, want WRID %d status %q QPNum %#x",
			got.WRID, got.Status, got.QPNum, wrid, st, qp.QPNum())
	}
}
