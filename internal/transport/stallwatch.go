package transport

import (
	"sync/atomic"
	"time"
)

// stallWatch decides how a polling consumer's empty polls treat the receive path.
//
// A busy-polling consumer polls nearly all the time, and most polls find nothing. The
// cheapest poll takes the receive path (rxMu) and receives with one system call: when
// something waits it is received at once, which is what keeps a round trip short. But a
// machine busy with other work stops threads now and then, for milliseconds and up to a
// second, and a polling thread stopped while it holds the receive path stops the device:
// its receive and timer goroutines wait for it, nothing is answered, and the peers' QPs
// spend their retries on the silence. So once a poll has held the receive path much
// longer than a system call takes (its thread was stopped there), the queue's polls look
// first, for a while: they take the receive path only when a datagram waits (a peek at
// the socket), ACKs are held back or READ responses wait for their round, at the price
// of a second system call for each datagram received.
//
// Its fields are written by the pollers alone, and read by them alone.
type stallWatch struct {
	_         [64]byte     // off the cache lines of the fields the receive path writes
	lookUntil atomic.Int64 // device time until which polls look first (0: never yet)
	_         [56]byte
}

// stallLimit is how long an empty poll may hold the receive path before its thread is
// taken to have been stopped there: a system call takes microseconds.
const stallLimit = int64(5 * time.Millisecond)

// lookFor is how long polls look first after a stall: long enough that a machine stopping
// threads again and again stalls a device at most once in that time.
const lookFor = int64(5 * time.Second)

// looking reports whether polls at device time now must look before they take the
// receive path.
func (w *stallWatch) looking(now int64) bool { return now < w.lookUntil.Load() }

// held notes that a poll held the receive path from start to end (device time).
func (w *stallWatch) held(start, end int64) {
	if end-start > stallLimit {
		w.lookUntil.Store(end + lookFor)
	}
}
