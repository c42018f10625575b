//go:build lockcheck

package transport

import (
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/lockrank"
	"github.com/softrnic/softrnic/internal/tpt"
)

// The checker itself: blocking on a lower-ranked lock, or on a lock of the same rank,
// while holding one panics; a TryLock may take anything; releasing in any order is fine.
func TestLockOrderChecker(t *testing.T) {
	var rx, qpA, qpB, cq mutex
	rx.Rank, qpA.Rank, qpB.Rank, cq.Rank = lockrank.Rx, lockrank.QP, lockrank.QP, lockrank.CQ
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

// The translation table's lock is in the order too: registering a region while holding
// the engine's locks is in order (the table's lock is the last), and a lock without a
// rank, taken while a ranked one is held, is a violation the checker reports.
func TestLockOrderTable(t *testing.T) {
	var qp, unranked mutex
	qp.Rank = lockrank.QP
	tb := tpt.New(4)
	qp.Lock()
	r, err := tb.Register(0, make([]byte, 64), 0x1000, tpt.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Deregister(r); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if s, ok := recover().(string); !ok || !strings.Contains(s, "lock order violated") {
				t.Errorf("an unranked lock under QP.mu: recovered %v, want a lock order violation", s)
			}
		}()
		unranked.Lock()
	}()
	qp.Unlock()
}
