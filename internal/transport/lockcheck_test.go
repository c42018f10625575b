//go:build lockcheck

package transport

import (
	"strings"
	"testing"
)

// The checker itself: blocking on a lower-ranked lock, or on a lock of the same rank,
// while holding one panics; a TryLock may take anything; releasing in any order is fine.
func TestLockOrderChecker(t *testing.T) {
	var rx, qpA, qpB, cq mutex
	rx.rank, qpA.rank, qpB.rank, cq.rank = rankRx, rankQP, rankQP, rankCQ
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			r := recover()
			if s, ok := r.(string); !ok || !strings.Contains(s, "lock order violated") {
				t.Errorf("%s: recovered %v, want a lock order violation", what, r)
			}
		}()
		f()
	}
	rx.Lock()
	qpA.Lock()
	cq.Lock() // rx → QP → CQ: in order
	qpA.Unlock()
	cq.Unlock()
	rx.Unlock()

	qpA.Lock()
	mustPanic("QP.mu then rxMu", func() { rx.Lock() })
	mustPanic("two QP locks", func() { qpB.Lock() })
	if !rx.TryLock() {
		t.Fatal("TryLock of a free lock failed")
	}
	rx.Unlock()
	qpA.Unlock()
}
