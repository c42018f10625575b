//go:build !lockcheck

package transport

import "testing"

// Taking and giving back a batch allocates nothing (the lockcheck build's mutex records
// the locks each goroutine holds, which allocates).
func TestBatchListAllocs(t *testing.T) {
	var l batchList
	l.init()
	if n := testing.AllocsPerRun(100, func() { l.put(l.get()) }); n != 0 {
		t.Fatalf("%v allocations per get and put", n)
	}
}
