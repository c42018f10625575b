package perf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// postBatch is the most work requests posted to one QP in one PostSend call.
const postBatch = 16

// wrid packs the first iteration a signaled work request accounts for and how many
// iterations (one per QP stride) it covers.
func wrid(first, count int) uint64 { return uint64(first)<<16 | uint64(count) }

func unwrid(id uint64) (first, count int) { return int(id >> 16), int(id & 0xFFFF) }

// runBWClient runs the active side of write_bw, read_bw and send_bw: Config.Threads
// goroutines, each driving the QPs of its own (QP q belongs to thread q mod Threads) and
// polling its own CQ.
func runBWClient(s *side, peer Info) (Result, error) {
	c := s.cfg
	if c.Check && c.Test != "read_bw" {
		clear(s.buf)
	}
	threads := len(s.cqs)
	errs := make(chan error, threads)
	start := startClock()
	for t := 1; t < threads; t++ {
		go func() { errs <- bwThread(s, peer, t) }()
	}
	err := bwThread(s, peer, 0)
	for t := 1; t < threads; t++ {
		err = errors.Join(err, <-errs)
	}
	if err != nil {
		return Result{}, err
	}
	r := bwResult(c, start.elapsed())
	start.account(c, &r)
	r.Checked = c.Check
	return r, nil
}

// bwThread posts and completes the iterations of thread t's QPs: iteration it goes to QP
// it mod QPs, and QP q to thread q mod Threads.
func bwThread(s *side, peer Info, t int) error {
	c := s.cfg
	nqp := len(s.qps)
	threads := len(s.cqs)
	depth := min(c.TxDepth, s.perQP())
	sigEvery := max(1, min(depth/2, 64))
	op := verbs.WRRDMAWrite
	switch c.Test {
	case "read_bw":
		op = verbs.WRRDMARead
	case "send_bw":
		op = verbs.WRSend
	case "atomic_bw":
		op = verbs.WRAtomicFetchAndAdd
	}
	var mine []int // this thread's QPs
	total := 0     // and the iterations they carry
	for q := t; q < nqp; q += threads {
		mine = append(mine, q)
		total += (c.Iters - q + nqp - 1) / nqp
	}
	outstanding := make([]int, nqp) // per QP: posted, not yet known complete
	sinceSig := make([]int, nqp)    // per QP: unsignaled since the last signaled
	firstUnsig := make([]int, nqp)  // per QP: first iteration not yet covered by a signal
	next := make([]int, nqp)        // per QP: next iteration to post
	for q := range next {
		next[q], firstUnsig[q] = q, q
	}
	wrs := make([]verbs.SendWR, postBatch)
	sges := make([]verbs.SGE, postBatch)
	wc := make([]verbs.WorkCompletion, 64)
	cq := s.cqs[t]
	for done := 0; done < total; {
		for _, q := range mine {
			qp := s.qps[q]
			n := 0
			for n < postBatch && next[q] < c.Iters && outstanding[q]+n < depth {
				it := next[q]
				slot := s.slotOf(it)
				sges[n] = s.mr.SGE(slot*c.Size, c.Size)
				if c.Check && (op == verbs.WRRDMAWrite || op == verbs.WRSend) {
					pattern(s.slot(slot), it)
				}
				w := &wrs[n]
				*w = verbs.SendWR{Opcode: op, SGList: sges[n : n+1]}
				if op != verbs.WRSend {
					w.RemoteAddr = peer.Addr + uint64(slot*c.Size)
					w.RKey = peer.RKey
				}
				if op == verbs.WRAtomicFetchAndAdd {
					w.CompareAdd = 1 // each slot of the peer counts the atomics that hit it
				}
				sinceSig[q]++
				next[q] += nqp
				if sinceSig[q] == sigEvery || next[q] >= c.Iters || outstanding[q]+n+1 == depth {
					w.SendFlags = verbs.SendSignaled
					w.WRID = wrid(firstUnsig[q], sinceSig[q])
					firstUnsig[q] = next[q]
					sinceSig[q] = 0
				}
				n++
			}
			if n > 0 {
				if err := qp.PostSend(wrs[:n]); err != nil {
					return err
				}
				outstanding[q] += n
			}
		}
		k := cq.PollCQ(wc)
		if k == 0 {
			if c.Events && !canPost(mine, next, outstanding, c.Iters, depth) {
				var err error
				if k, err = sleepOnCQ(cq, wc); err != nil {
					return fmt.Errorf("%s: %w", c.Test, err)
				}
			} else {
				runtime.Gosched()
			}
		}
		for _, e := range wc[:k] {
			if e.Status != verbs.WCSuccess {
				return fmt.Errorf("%s: work completion %v (%v)", c.Test, e.Status, e.VendorErr)
			}
			first, count := unwrid(e.WRID)
			q := s.qpIdx[e.QPNum]
			outstanding[q] -= count
			done += count
			if c.Check && op == verbs.WRRDMARead {
				for k := 0; k < count; k++ {
					it := first + k*nqp
					b := s.slot(s.slotOf(it))
					if off := checkPattern(b, s.slotOf(it)); off >= 0 {
						return fmt.Errorf("read_bw: iteration %d: byte %d differs", it, off)
					}
					clear(b)
				}
			}
		}
	}
	return nil
}

// canPost reports whether one of the QPs mine has an iteration to post and room for it.
func canPost(mine, next, outstanding []int, iters, depth int) bool {
	for _, q := range mine {
		if next[q] < iters && outstanding[q] < depth {
			return true
		}
	}
	return false
}

// eventWait bounds one sleep on a completion channel: a completion that never comes is
// reported as an error, not a hang.
const eventWait = 30 * time.Second

// sleepOnCQ is perftest's -e: arm the CQ for its next completion, poll once more (one may
// have arrived before the arming), and otherwise sleep on the CQ's channel until the
// event, then poll. It returns the completions moved into wc (0 after an event for a
// completion the second poll already took).
func sleepOnCQ(cq *verbs.CQ, wc []verbs.WorkCompletion) (int, error) {
	if err := cq.ReqNotifyCQ(false); err != nil {
		return 0, err
	}
	if k := cq.PollCQ(wc); k > 0 {
		return k, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), eventWait)
	defer cancel()
	if _, err := cq.Channel().GetCQEvent(ctx); err != nil {
		return 0, fmt.Errorf("waiting for a completion event: %w", err)
	}
	cq.AckCQEvents(1)
	return cq.PollCQ(wc), nil
}

// prepareBWServer gets the passive side ready: read targets hold known data, send_bw
// receives are posted.
func prepareBWServer(s *side) error {
	c := s.cfg
	switch c.Test {
	case "read_bw":
		for i := 0; i < s.slots; i++ {
			pattern(s.slot(i), i)
		}
	case "write_bw", "atomic_bw":
		clear(s.buf)
	case "send_bw":
		per := s.perQP()
		for q, qp := range s.qps {
			for k := 0; k < per; k++ {
				slot := q*per + k
				if err := qp.PostRecv([]verbs.RecvWR{{WRID: uint64(slot), SGList: []verbs.SGE{s.mr.SGE(slot*c.Size, c.Size)}}}); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// runSendBWServer receives c.Iters messages, re-posting receives and checking data.
func runSendBWServer(s *side) error {
	c := s.cfg
	nqp := len(s.qps)
	count := make([]int, nqp) // messages received per QP
	wc := make([]verbs.WorkCompletion, 64)
	var sge [1]verbs.SGE
	var wr [1]verbs.RecvWR
	for got, i := 0, 0; got < c.Iters; i++ {
		k := s.cqs[i%len(s.cqs)].PollCQ(wc) // the client's threads have a CQ each
		if k == 0 {
			runtime.Gosched()
		}
		for _, e := range wc[:k] {
			if e.Status != verbs.WCSuccess {
				return fmt.Errorf("send_bw server: work completion %v", e.Status)
			}
			if e.Opcode != verbs.WCRecv {
				continue
			}
			q := s.qpIdx[e.QPNum]
			slot := int(e.WRID)
			if c.Check {
				it := count[q]*nqp + q
				if e.ByteLen != uint32(c.Size) {
					return fmt.Errorf("send_bw: message %d has %d bytes", it, e.ByteLen)
				}
				if off := checkPattern(s.slot(slot), it); off >= 0 {
					return fmt.Errorf("send_bw: message %d: byte %d differs", it, off)
				}
				clear(s.slot(slot))
			}
			count[q]++
			got++
			sge[0] = s.mr.SGE(slot*c.Size, c.Size)
			wr[0] = verbs.RecvWR{WRID: e.WRID, SGList: sge[:]}
			if err := s.qps[q].PostRecv(wr[:]); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkAtomicBW verifies the server's buffer after atomic_bw: its slots' counters add
// up to the iterations.
func checkAtomicBW(s *side) error {
	var sum uint64
	for i := 0; i < s.slots; i++ {
		sum += binary.LittleEndian.Uint64(s.slot(i))
	}
	if sum != uint64(s.cfg.Iters) {
		return fmt.Errorf("atomic_bw: the server's counters add up to %d, want %d", sum, s.cfg.Iters)
	}
	return nil
}

// checkWriteBW verifies the server's buffer after write_bw: every slot holds the last
// message written to it.
func checkWriteBW(s *side) error {
	c := s.cfg
	nqp, per := len(s.qps), s.perQP()
	for q := 0; q < nqp; q++ {
		m := (c.Iters - q + nqp - 1) / nqp // messages QP q carried
		for k := max(0, m-per); k < m; k++ {
			it := k*nqp + q
			if off := checkPattern(s.slot(s.slotOf(it)), it); off >= 0 {
				return fmt.Errorf("write_bw: message %d: byte %d differs", it, off)
			}
		}
	}
	return nil
}
