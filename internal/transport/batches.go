package transport

import (
	"github.com/softrnic/softrnic/internal/lockrank"
	"github.com/softrnic/softrnic/internal/netio"
)

// batchList is a device's spare send batches, for the goroutines that transmit outside a
// receive queue (posters, timers). A batch is about 100 KiB of resident memory (its pages
// are faulted in when it is made: see netio.NewSendBatch), so batches are kept for the
// device's life rather than in a sync.Pool, which hides a batch put back on one processor
// from the others and drops them all at a garbage collection: each miss made a new batch
// in the middle of a post (an allocation, its zeroing and its page faults, tens of µs in
// this project's virtual machines; the first multi-packet post of a new device took a
// median 45 µs more than the next ones with the pool, 27 µs with this list). There are as
// many as goroutines ever transmitted at once, at most maxSpareBatches kept.
type batchList struct {
	mu   mutex
	free []*netio.SendBatch
}

// maxSpareBatches bounds the batches a device keeps; more concurrent senders than that
// get batches that the garbage collector takes back.
const maxSpareBatches = 64

// init makes the first batch, so that the first post finds one.
func (l *batchList) init() {
	l.mu.Rank = lockrank.Batches
	l.free = append(make([]*netio.SendBatch, 0, maxSpareBatches), newSendBatch())
}

func newSendBatch() *netio.SendBatch { return netio.NewSendBatch(outPkts, outIovs, outArena) }

// get returns an empty batch (any locks may be held: batchList.mu is a leaf).
func (l *batchList) get() *netio.SendBatch {
	l.mu.Lock()
	if n := len(l.free); n > 0 {
		b := l.free[n-1]
		l.free = l.free[:n-1]
		l.mu.Unlock()
		return b
	}
	l.mu.Unlock()
	return newSendBatch()
}

// put gives back a batch from get, sent and reset.
func (l *batchList) put(b *netio.SendBatch) {
	l.mu.Lock()
	if len(l.free) < cap(l.free) {
		l.free = append(l.free, b)
	}
	l.mu.Unlock()
}
