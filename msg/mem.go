package msg

import (
	"time"

	"github.com/softrnic/softrnic/internal/pages"
	"github.com/softrnic/softrnic/verbs"
)

// Memory for rings and staging buffers. An enlargement must not wait for the operating
// system: every fresh page costs a fault when it is first written (a fraction of a µs on
// bare metal, 10-11 µs in this project's virtual machines: go test -run NONE -bench
// FirstTouch ./verbs/; some 350 µs for a 128 KiB ring, twenty small round trips). So the rank keeps a reserve: for each enlargement phase, Reserve
// spare rings and staging buffers, faulted in by Init, and refilled by a helper goroutine
// a while after an enlargement took one; buffers that connections give back (a ring
// replaced by a larger one) are kept for reuse up to the reserve's size. The reserve is
// not registered: what connections hold registered is what Memory reports.

// bufPool is the rank's reserve (progress lock held).
type bufPool struct {
	c       *Comm
	free    map[int][][]byte // by length
	want    map[int]int      // how many of each length to keep ready
	filling map[int]bool     // a refill of this length is under way
	// Bookkeeping left for settle, so that it does not delay the post an enlargement
	// makes next (the acknowledgement, the first large message): lengths taken from the
	// reserve, and buffers given back, not cleared yet.
	due  []int
	back [][]byte
}

func (bp *bufPool) init(c *Comm) {
	bp.c = c
	bp.free, bp.want, bp.filling = map[int][][]byte{}, map[int]int{}, map[int]bool{}
	if c.cfg.Reserve <= 0 {
		return
	}
	for _, size := range c.cfg.Phases[1:] {
		bp.want[c.cfg.Slots*size] += c.cfg.Reserve
		bp.want[c.cfg.SendSlots*size] += c.cfg.Reserve
	}
	for n, count := range bp.want {
		bp.free[n] = residentBufs(count, n)
	}
}

// get returns a zeroed buffer of n bytes, from the reserve when it has one.
func (bp *bufPool) get(n int) []byte {
	l := bp.free[n]
	if len(l) == 0 {
		return make([]byte, n)
	}
	b := l[len(l)-1]
	bp.free[n] = l[:len(l)-1]
	bp.due = append(bp.due, n)
	return b
}

// put takes back a buffer no longer registered; settle keeps it if the reserve wants it.
func (bp *bufPool) put(b []byte) { bp.back = append(bp.back, b) }

// settle does what get and put left: it clears the buffers given back that the reserve
// wants (the others are the garbage collector's) and starts the refills. The progress
// engine calls it at the end of a round, after the round's posts.
func (bp *bufPool) settle() {
	for i, b := range bp.back {
		if len(bp.free[len(b)]) < bp.want[len(b)] {
			clear(b)
			bp.free[len(b)] = append(bp.free[len(b)], b)
		}
		bp.back[i] = nil
	}
	bp.back = bp.back[:0]
	for _, n := range bp.due {
		if len(bp.free[n]) < bp.want[n] {
			bp.refill(n, refillDelay)
		}
	}
	bp.due = bp.due[:0]
}

// refill allocates the buffers of length n the reserve lacks, in a helper goroutine that
// starts after delay, and faults their pages in there.
func (bp *bufPool) refill(n int, delay time.Duration) {
	need := bp.want[n] - len(bp.free[n])
	if need <= 0 || bp.filling[n] {
		return
	}
	bp.filling[n] = true
	time.AfterFunc(delay, func() {
		bufs := residentBufs(need, n)
		bp.c.submit(func() {
			bp.filling[n] = false
			for _, b := range bufs {
				if len(bp.free[n]) < bp.want[n] {
					bp.free[n] = append(bp.free[n], b)
				}
			}
		})
	})
}

// residentBufs allocates count buffers of n bytes and makes their pages resident.
func residentBufs(count, n int) [][]byte {
	bufs := make([][]byte, count)
	for i := range bufs {
		bufs[i] = make([]byte, n)
		pages.Prepare(bufs[i])
	}
	return bufs
}

// regBuf registers n bytes from the reserve (progress lock held). A buffer from the
// reserve is resident already; a fresh one is faulted in by the registration if it is
// small, by the data path page by page if it is large (most of a large ring may never be
// touched).
func (c *Comm) regBuf(n int, access verbs.AccessFlags) (*verbs.MR, error) {
	fresh := len(c.pool.free[n]) == 0
	b := c.pool.get(n)
	if !fresh || n >= lazyRegistration {
		access |= verbs.AccessOnDemand
	}
	mr, err := c.pd.RegMR(b, access)
	if err != nil {
		c.pool.put(b)
		return nil, err
	}
	return mr, nil
}

// lazyRegistration is the size from which a fresh buffer is registered on demand.
const lazyRegistration = 64 << 10

// deregBuf deregisters a buffer from regBuf and gives it back to the reserve: once
// DeregMR returns, no remote access touches it.
func (c *Comm) deregBuf(mr *verbs.MR) {
	b := mr.Buf()
	if mr.DeregMR() == nil {
		c.pool.put(b)
	}
}

// refillDelay is how long a refill waits: the enlargement that emptied the reserve (and
// its peer's) should not share the processors with page faults.
const refillDelay = 20 * time.Millisecond
