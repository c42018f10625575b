// Package lockrank gives each of the engine's mutexes its place in one lock order and,
// built with the lockcheck tag, checks the order at run time. The order is the one the
// transport's package doc writes out with the reasons for it (internal/transport, "Locks");
// the ranks below are that order, and cover the locks of every package the engine takes
// them in (the transport's own, and the translation table's).
//
// A goroutine holding a lock may only block on a lock of a higher rank. Locks of the same
// rank (two QPs' locks, two devices' receive paths) are never held together, except that a
// TryLock, which cannot wait, may take any lock.
package lockrank

import "sync"

// Rank is a lock's place in the lock order.
type Rank uint8

// The lock order, in one place.
const (
	Rx       Rank = iota + 1 // transport: queue.rxMu, a receive queue's path
	QPTable                  // transport: Device.qpMu, the QP table
	QP                       // transport: QP.mu
	RecvQ                    // transport: RecvQueue.mu
	CQ                       // transport: CQ.mu
	Atomic                   // transport: Device.atomicMu
	Timers                   // transport: timerQueue.mu
	AckGroup                 // transport: AckGroup.mu
	Batches                  // transport: batchList.mu
	TPT                      // tpt: Table.mu, registration and deregistration of memory regions
)

var names = [...]string{Rx: "queue.rxMu", QPTable: "Device.qpMu", QP: "QP.mu", RecvQ: "RecvQueue.mu", CQ: "CQ.mu",
	Atomic: "Device.atomicMu", Timers: "timerQueue.mu", AckGroup: "AckGroup.mu", Batches: "batchList.mu",
	TPT: "tpt.Table.mu"}

func (r Rank) String() string {
	if int(r) < len(names) && names[r] != "" {
		return names[r]
	}
	return "unranked"
}

// Mutex is a sync.Mutex with its rank in the lock order. Built with the lockcheck tag
// (`go test -tags lockcheck`), every Lock checks the order against the locks the goroutine
// holds and panics on a violation (lockcheck.go); otherwise it is a plain sync.Mutex and
// the rank costs one byte.
type Mutex struct {
	sync.Mutex
	Rank Rank
}
