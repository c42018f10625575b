package perf

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/verbs"
)

// Latency tests: one QP, one message in flight. The buffer holds a receive area (slot 0)
// and a send area (slot 1). send_lat and write_lat are ping-pongs and report half the round
// trip, read_lat and atomic_lat report the whole operation, as perftest does.

// warmup is how many unmeasured iterations precede the measured ones.
func warmup(iters int) int { return min(max(iters/10, 10), 1000) }

// waiter polls a CQ (which also drives the device's receive path) and counts receive
// completions, while send completions just free the send queue.
type waiter struct {
	s    *side
	wc   []verbs.WorkCompletion
	recv int // receive completions seen
	sent int // send completions seen
	err  error
}

func (w *waiter) poll() {
	n := w.s.cq.PollCQ(w.wc)
	for _, e := range w.wc[:n] {
		if e.Status != verbs.WCSuccess {
			w.err = fmt.Errorf("%s: work completion %v (opcode %v, %v)", w.s.cfg.Test, e.Status, e.Opcode, e.VendorErr)
			return
		}
		if e.Opcode == verbs.WCRecv || e.Opcode == verbs.WCRecvRDMAWithImm {
			w.recv++
		} else {
			w.sent++
		}
	}
}

// untilRecv polls until n receive completions were seen.
func (w *waiter) untilRecv(n int, deadline time.Time) error {
	for i := 0; w.recv < n && w.err == nil; i++ {
		w.poll()
		if i&0xFFFF == 0xFFFF && time.Now().After(deadline) {
			return fmt.Errorf("%s: no message from the peer", w.s.cfg.Test)
		}
	}
	return w.err
}

// untilSent polls until n send completions were seen.
func (w *waiter) untilSent(n int, deadline time.Time) error {
	for i := 0; w.sent < n && w.err == nil; i++ {
		w.poll()
		if i&0xFFFF == 0xFFFF && time.Now().After(deadline) {
			return fmt.Errorf("%s: operation did not complete", w.s.cfg.Test)
		}
	}
	return w.err
}

// lastByte returns a function that loads the last byte of the receive area atomically
// (through the aligned 32-bit word that contains it), as a peer's RDMA WRITE lands.
func lastByte(s *side) func() byte {
	pos := s.cfg.Size - 1
	word := (*uint32)(unsafe.Pointer(&s.buf[pos&^3]))
	shift := 8 * uint(pos&3)
	return func() byte { return byte(atomic.LoadUint32(word) >> shift) }
}

// tag is the marker iteration i writes into the last byte (never 0).
func tag(i int) byte { return byte(i%255 + 1) }

// runPingPong runs send_lat or write_lat on one side; the client measures.
func runPingPong(s *side, peer Info, client bool) (Result, error) {
	c := s.cfg
	qp := s.qps[0]
	w := &waiter{s: s, wc: make([]verbs.WorkCompletion, 16)}
	total := warmup(c.Iters) + c.Iters
	recvSGE := []verbs.SGE{s.mr.SGE(0, c.Size)}
	sendSGE := []verbs.SGE{s.mr.SGE(c.Size, c.Size)}
	recvWR := []verbs.RecvWR{{WRID: 1, SGList: recvSGE}}
	send := []verbs.SendWR{{Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sendSGE}}
	write := c.Test == "write_lat"
	if write {
		send[0].Opcode = verbs.WRRDMAWrite
		send[0].RemoteAddr, send[0].RKey = peer.Addr, peer.RKey
	}
	if c.Size <= 64 && !c.Check {
		send[0].SendFlags |= verbs.SendInline
	}
	var arrived func() byte
	if write {
		arrived = lastByte(s)
	}
	src := s.slot(1)
	samples := make([]int64, c.Iters)
	deadline := time.Now().Add(time.Duration(total)*10*time.Millisecond + 30*time.Second)
	var start clock
	// The first receives are posted before the peer can send (during setup).
	for i := 0; i < total; i++ {
		if client && i == total-c.Iters {
			start = startClock()
		}
		t0 := time.Now()
		if client {
			if err := pingSend(s, qp, send, src, i, write); err != nil {
				return Result{}, err
			}
		}
		// Wait for the peer's message i.
		if write {
			for k := 0; arrived() != tag(i); k++ {
				w.poll()
				if w.err != nil {
					return Result{}, w.err
				}
				if k&0xFFFF == 0xFFFF && time.Now().After(deadline) {
					return Result{}, fmt.Errorf("write_lat: no write from the peer")
				}
			}
			if c.Check {
				// Placement is in order: when the tag is visible, the bytes before it are.
				if off := checkPattern(s.slot(0)[:c.Size-1], i); off >= 0 {
					return Result{}, fmt.Errorf("write_lat: message %d: byte %d differs", i, off)
				}
			}
		} else {
			if err := w.untilRecv(i+1, deadline); err != nil {
				return Result{}, err
			}
			if c.Check {
				if off := checkPattern(s.slot(0), i); off >= 0 {
					return Result{}, fmt.Errorf("send_lat: message %d: byte %d differs", i, off)
				}
			}
			if err := qp.PostRecv(recvWR); err != nil {
				return Result{}, err
			}
		}
		if client && i >= total-c.Iters {
			samples[i-(total-c.Iters)] = int64(time.Since(t0)) / 2
		}
		if !client {
			if err := pingSend(s, qp, send, src, i, write); err != nil {
				return Result{}, err
			}
		}
		// Reap our own send completion so the send queue never fills.
		if err := w.untilSent(i+1, deadline); err != nil {
			return Result{}, err
		}
	}
	if !client {
		return Result{}, nil
	}
	r := latResult(c, samples, start.elapsed())
	start.account(c, &r)
	r.Checked = c.Check
	return r, nil
}

// pingSend sends message i: its data (with --check) and the tag in its last byte.
func pingSend(s *side, qp *verbs.QP, send []verbs.SendWR, src []byte, i int, write bool) error {
	if s.cfg.Check {
		pattern(src, i)
	}
	if write {
		src[len(src)-1] = tag(i) // the tag replaces the last pattern byte
	}
	return qp.PostSend(send)
}

// runOneSided runs read_lat or atomic_lat: the client measures each operation to
// completion; the server is passive.
func runOneSided(s *side, peer Info) (Result, error) {
	c := s.cfg
	qp := s.qps[0]
	w := &waiter{s: s, wc: make([]verbs.WorkCompletion, 16)}
	total := warmup(c.Iters) + c.Iters
	sge := []verbs.SGE{s.mr.SGE(0, c.Size)}
	wr := []verbs.SendWR{{Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled, SGList: sge,
		RemoteAddr: peer.Addr, RKey: peer.RKey}}
	if c.Test == "atomic_lat" {
		wr[0].Opcode = verbs.WRAtomicFetchAndAdd
		wr[0].CompareAdd = 1
		wr[0].RemoteAddr = peer.Addr + uint64(c.Size) // 8-byte aligned: the peer's send area
	}
	samples := make([]int64, c.Iters)
	deadline := time.Now().Add(time.Duration(total)*10*time.Millisecond + 30*time.Second)
	var start clock
	for i := 0; i < total; i++ {
		if i == total-c.Iters {
			start = startClock()
		}
		t0 := time.Now()
		if err := qp.PostSend(wr); err != nil {
			return Result{}, err
		}
		if err := w.untilSent(i+1, deadline); err != nil {
			return Result{}, err
		}
		if i >= total-c.Iters {
			samples[i-(total-c.Iters)] = int64(time.Since(t0))
		}
		if c.Check && c.Test == "read_lat" {
			if off := checkPattern(s.slot(0)[:c.Size], 0); off >= 0 {
				return Result{}, fmt.Errorf("read_lat: iteration %d: byte %d differs", i, off)
			}
			clear(s.slot(0))
		}
		if c.Check && c.Test == "atomic_lat" {
			got := *(*uint64)(unsafe.Pointer(&s.buf[0]))
			if got != uint64(i) {
				return Result{}, fmt.Errorf("atomic_lat: fetch-and-add %d returned %d", i, got)
			}
		}
	}
	r := latResult(c, samples, start.elapsed())
	start.account(c, &r)
	r.Checked = c.Check
	return r, nil
}

// prepareLat readies a side of a latency test: the data read_lat reads, the counter
// atomic_lat adds to, the first receive of send_lat.
func prepareLat(s *side) error {
	c := s.cfg
	switch c.Test {
	case "read_lat":
		pattern(s.slot(0), 0)
	case "atomic_lat":
		clear(s.slot(1))
	case "send_lat":
		return s.qps[0].PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{s.mr.SGE(0, c.Size)}}})
	case "write_lat":
		clear(s.buf)
	}
	return nil
}
