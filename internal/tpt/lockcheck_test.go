//go:build lockcheck

package tpt

import (
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/lockrank"
)

// The table's lock has its rank, the last of the engine's lock order: the checker sees it,
// and a ranked lock taken while it is held is a violation.
func TestTableLockRanked(t *testing.T) {
	tb := New(4)
	if tb.mu.Rank != lockrank.TPT {
		t.Fatalf("the table's lock has rank %v, want %v", tb.mu.Rank, lockrank.TPT)
	}
	var batches lockrank.Mutex
	batches.Rank = lockrank.Batches
	tb.mu.Lock()
	defer tb.mu.Unlock()
	defer func() {
		if s, ok := recover().(string); !ok || !strings.Contains(s, "lock order violated") {
			t.Errorf("a lower-ranked lock under the table's: recovered %v, want a lock order violation", s)
		}
	}()
	batches.Lock()
}
