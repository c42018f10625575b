package transport

import (
	"container/heap"
	"time"

	"github.com/softrnic/softrnic/internal/lockrank"
)

// timerQueue is the device's one timer: a heap of QPs ordered by their next deadline
// (local ACK timeout, RNR wait, held-back ACK). A QP is in the heap at most once; deadlines
// that move later are not updated in the heap: the QP checks its real deadline when the
// entry fires and re-arms, so progress costs no heap operation.
//
// While the heap is not empty the timer goroutine wakes at the earliest deadline or after
// tick, whichever comes first, so arming a deadline never has to wake it (a futex wake on
// every message would cost more than the timer saves); only the first deadline armed in an
// empty heap does. A deadline may therefore fire up to tick late, which every timer here
// tolerates (each is a minimum wait).
type timerQueue struct {
	u    *queue
	mu   mutex
	h    qpHeap
	due  []*QP
	wake chan struct{}
	done chan struct{}
}

// tick bounds how long the timer goroutine sleeps while deadlines are pending.
const tick = time.Millisecond

type qpHeap []*QP

func (h qpHeap) Len() int           { return len(h) }
func (h qpHeap) Less(i, j int) bool { return h[i].timerAt < h[j].timerAt }
func (h qpHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].timerIdx, h[j].timerIdx = i, j
}
func (h *qpHeap) Push(x any) {
	q := x.(*QP)
	q.timerIdx = len(*h)
	*h = append(*h, q)
}
func (h *qpHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	q.timerIdx = -1
	return q
}

func (t *timerQueue) init(u *queue) {
	t.u = u
	t.mu.Rank = lockrank.Timers
	t.wake = make(chan struct{}, 1)
	t.done = make(chan struct{})
}

// arm makes sure q's timer fires no later than at (device time, ns).
func (t *timerQueue) arm(q *QP, at int64) {
	t.mu.Lock()
	if q.timerIdx >= 0 {
		if at >= q.timerAt {
			t.mu.Unlock()
			return
		}
		q.timerAt = at
		heap.Fix(&t.h, q.timerIdx)
	} else {
		q.timerAt = at
		heap.Push(&t.h, q)
	}
	wake := len(t.h) == 1
	t.mu.Unlock()
	if wake {
		select {
		case t.wake <- struct{}{}:
		default:
		}
	}
}

// cancel removes q from the heap.
func (t *timerQueue) cancel(q *QP) {
	t.mu.Lock()
	if q.timerIdx >= 0 {
		heap.Remove(&t.h, q.timerIdx)
	}
	t.mu.Unlock()
}

func (t *timerQueue) stop() { close(t.done) }

func (t *timerQueue) run() {
	defer t.u.d.wg.Done()
	tm := time.NewTimer(time.Hour)
	defer tm.Stop()
	for {
		tm.Reset(max(t.expire(), 0))
		select {
		case <-tm.C:
		case <-t.wake:
		case <-t.done:
			return
		}
	}
}

// expire runs the timers of the QPs whose deadlines have passed (no locks held) and
// returns how long the timer goroutine may sleep before it looks again.
func (t *timerQueue) expire() time.Duration {
	t.mu.Lock()
	now := t.u.d.now()
	for len(t.h) > 0 && t.h[0].timerAt <= now {
		t.due = append(t.due, heap.Pop(&t.h).(*QP))
	}
	wait := time.Hour
	if len(t.h) > 0 {
		wait = min(time.Duration(t.h[0].timerAt-now), tick)
	}
	due := t.due
	t.mu.Unlock()
	if t.lossDue(due) {
		t.u.drainReceive()
	}
	for i, q := range due {
		q.onTimer()
		due[i] = nil
	}
	t.mu.Lock()
	t.due = t.due[:0]
	if len(t.h) > 0 {
		wait = min(wait, time.Duration(t.h[0].timerAt-t.u.d.now()), tick)
	}
	t.mu.Unlock()
	return wait
}

// lossDue reports whether one of the due QPs has a deadline due that declares a loss (a
// local ACK timeout, a loss probe): then what waits in the socket is processed first (see
// drainReceive). Most entries are held-back ACKs, or deadlines that have moved later;
// taking the receive path for those made the timer goroutine queue on it behind every
// polling consumer, thousands of times a second.
func (t *timerQueue) lossDue(due []*QP) bool {
	now := t.u.d.now()
	for _, q := range due {
		q.mu.Lock()
		loss := !q.destroyed && q.req.lossDue(now)
		q.mu.Unlock()
		if loss {
			return true
		}
	}
	return false
}

// flushAckRelock sends a held-back ACK from a goroutine other than the receive path
// (q.mu held; released around the send).
func (q *QP) flushAckRelock() {
	if !q.resp.ackPending {
		q.resp.ackDeferred = false
		return
	}
	b := q.dev.getBatch()
	q.resp.sendAck(b)
	q.mu.Unlock()
	q.dev.send(b)
	q.dev.putBatch(b)
	q.mu.Lock()
}

// onTimer runs when the QP's timer deadline passes (timer goroutine, no locks held).
func (q *QP) onTimer() {
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return
	}
	now := q.dev.now()
	if q.resp.ackDeferred {
		if now >= q.resp.ackAt {
			q.flushAckRelock() // releases and retakes q.mu
		} else {
			q.home.timers.arm(q, q.resp.ackAt)
		}
	}
	if q.destroyed || (q.state != StateRTS && q.state != StateSQD) {
		q.mu.Unlock()
		return
	}
	r := &q.req
	kick := false
	if r.probeAt != 0 && !r.rnrWait { // weak mode's loss probe
		if now < r.probeAt {
			q.home.timers.arm(q, r.probeAt)
		} else {
			kick = r.recover.probe(now)
		}
	}
	if r.rnrWait {
		kick = r.endRNRWait(now) || kick
	} else if r.rtoAt != 0 {
		if !r.outstanding() {
			r.rtoAt = 0
		} else if now >= r.rtoAt {
			if !q.comp.timeout() {
				q.mu.Unlock() // the QP failed
				return
			}
			kick = true
		} else {
			q.home.timers.arm(q, r.rtoAt)
		}
	}
	if kick {
		q.pushTxUnlock()
		return
	}
	q.mu.Unlock()
}
