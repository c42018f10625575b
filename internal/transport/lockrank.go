package transport

import "sync"

// lockRank is a lock's place in the package's lock order (see the package doc): a
// goroutine holding a lock may only block on a lock of a higher rank. Locks of the same
// rank (two QPs' locks, two devices' receive paths) are never held together, except that a
// TryLock, which cannot wait, may take any lock.
type lockRank uint8

// The lock order, in one place.
const (
	rankRx       lockRank = iota + 1 // queue.rxMu: a receive queue's path
	rankQPTable                      // Device.qpMu: the QP table
	rankQP                           // QP.mu
	rankRecvQ                        // RecvQueue.mu
	rankCQ                           // CQ.mu
	rankAtomic                       // Device.atomicMu
	rankTimers                       // timerQueue.mu
	rankAckGroup                     // AckGroup.mu
	rankBatches                      // batchList.mu
)

var rankNames = [...]string{rankRx: "queue.rxMu", rankQPTable: "Device.qpMu", rankQP: "QP.mu",
	rankRecvQ: "RecvQueue.mu", rankCQ: "CQ.mu", rankAtomic: "Device.atomicMu", rankTimers: "timerQueue.mu",
	rankAckGroup: "AckGroup.mu", rankBatches: "batchList.mu"}

func (r lockRank) String() string {
	if int(r) < len(rankNames) && rankNames[r] != "" {
		return rankNames[r]
	}
	return "unranked"
}

// mutex is a sync.Mutex with its rank in the lock order. Built with the lockcheck tag
// (`go test -tags lockcheck`), every Lock checks the order against the locks the
// goroutine holds and panics on a violation (lockcheck.go); otherwise it is a plain
// sync.Mutex and the rank costs one byte.
type mutex struct {
	sync.Mutex
	rank lockRank
}
