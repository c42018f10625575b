package transport

import (
	"testing"

	"github.com/softrnic/softrnic/internal/netio"
)

// A device starts with one spare batch; a batch given back is the next one taken, so
// posts in turn reuse one batch; concurrent senders get more, and the list keeps at most
// maxSpareBatches of them.
func TestBatchList(t *testing.T) {
	var l batchList
	l.init()
	if len(l.free) != 1 {
		t.Fatalf("%d spare batches after init, want 1", len(l.free))
	}
	b := l.get()
	l.put(b)
	if l.get() != b {
		t.Fatal("a batch given back was not reused")
	}
	l.put(b)
	var held []*netio.SendBatch
	for range maxSpareBatches + 3 {
		held = append(held, l.get())
	}
	if len(l.free) != 0 {
		t.Fatalf("%d spare batches with every one taken", len(l.free))
	}
	for _, h := range held {
		l.put(h)
	}
	if len(l.free) != maxSpareBatches {
		t.Fatalf("%d spare batches kept, want at most %d", len(l.free), maxSpareBatches)
	}
}
