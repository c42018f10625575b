package perf

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/verbs"
)

// perftest mode's traffic, as perftest_resources.c runs it: run_iter_bw (the bandwidth
// client), run_iter_bw_server (send_bw's server), run_iter_lat_write, run_iter_lat (read
// and atomic latency) and run_iter_lat_send.

// traffic runs one size of the test on this side.
func (s *ptSide) traffic(size int) (Result, error) {
	switch s.cfg.Test {
	case "write_bw", "read_bw", "atomic_bw":
		return s.bwClient(size)
	case "send_bw":
		if s.client {
			return s.bwClient(size)
		}
		return s.sendBWServer(size)
	case "write_lat":
		return s.writeLat(size)
	case "send_lat":
		return s.sendLat(size)
	default: // read_lat, atomic_lat: the client only
		return s.oneSidedLat(size)
	}
}

// slots returns how many message positions a region has for size (messages up to half
// the cycle buffer move along it in cache-line steps, as perftest's increase_loc_addr and
// increase_rem_addr move them; larger ones stay at its start) and the step.
func (s *ptSide) slots(size int) (n, step int) {
	step = s.inc(size)
	if size <= s.params.Cycle/2 {
		return s.params.Cycle / step, step
	}
	return 1, step
}

// progress bounds how long a side waits without any completion (perftest's check_alive
// gives a server 60 s).
type progress struct {
	what string
	last time.Time
	n    int
}

func newProgress(what string) *progress { return &progress{what: what, last: time.Now()} }

func (p *progress) moved() { p.last = time.Now() }

// idle is called on each empty poll; every few thousand it looks at the clock.
func (p *progress) idle() error {
	p.n++
	if p.n&0xFFF != 0 {
		return nil
	}
	if time.Since(p.last) > ptCheckAlive {
		return fmt.Errorf("%s: nothing completed for %v", p.what, ptCheckAlive)
	}
	return nil
}

// bwClient is run_iter_bw: per QP up to TxDepth work requests in flight, every
// cqMod-th (and the last) signaled, each message at the next position of the regions.
func (s *ptSide) bwClient(size int) (Result, error) {
	c := s.cfg
	nqp := len(s.qps)
	iters, tot := c.Iters, c.Iters*nqp
	cqMod := c.cqMod(size)
	noPeak := c.Iters > ptNoPeakIters
	op := verbs.WRRDMAWrite
	length := size
	switch c.Test {
	case "read_bw":
		op = verbs.WRRDMARead
	case "send_bw":
		op = verbs.WRSend
	case "atomic_bw":
		op, length = verbs.WRAtomicFetchAndAdd, 8
		if c.AtomicType == AtomicTypes[1] {
			op = verbs.WRAtomicCmpAndSwp
		}
	}
	nslots, step := s.slots(size)
	// The post and completion times (perftest's tposted, tcompleted); without a peak only
	// the first post and the last completion.
	times := tot
	if noPeak {
		times = 1
	}
	tposted := make([]int64, times)
	tcompleted := make([]int64, times)
	scnt := make([]int, nqp) // per QP: posted
	ccnt := make([]int, nqp) // per QP: known complete
	totscnt, totccnt := 0, 0
	wrs := make([]verbs.SendWR, postBatch)
	sges := make([]verbs.SGE, postBatch)
	wc := make([]verbs.WorkCompletion, 16) // CTX_POLL_BATCH
	prog := newProgress(c.Test)
	start := startClock()
	base := time.Now()
	now := func() int64 { return int64(time.Since(base)) }
	for totccnt < tot {
		for q, qp := range s.qps {
			n := 0
			for n < postBatch && scnt[q] < iters && scnt[q]-ccnt[q]+1 <= c.TxDepth {
				k := scnt[q]
				off := (k % nslots) * step
				sges[n] = s.mr.SGE(s.srcOff(q)+off, length)
				w := &wrs[n]
				*w = verbs.SendWR{WRID: uint64(q)<<32 | uint64(k), Opcode: op, SGList: sges[n : n+1]}
				switch op {
				case verbs.WRRDMAWrite, verbs.WRRDMARead:
					w.RemoteAddr, w.RKey = s.rem[q].VAddr+uint64(off), s.rem[q].RKey
				case verbs.WRAtomicFetchAndAdd:
					w.RemoteAddr, w.RKey, w.CompareAdd = s.rem[q].VAddr+uint64(off), s.rem[q].RKey, 1 // ATOMIC_ADD_VALUE
				case verbs.WRAtomicCmpAndSwp:
					w.RemoteAddr, w.RKey = s.rem[q].VAddr+uint64(off), s.rem[q].RKey // compare 0, swap ATOMIC_SWAP_VALUE 0
				}
				if k%cqMod == cqMod-1 || k == iters-1 {
					w.SendFlags = verbs.SendSignaled
				}
				if totscnt < times {
					tposted[totscnt] = now()
				}
				scnt[q]++
				totscnt++
				n++
			}
			if n > 0 {
				if err := qp.PostSend(wrs[:n]); err != nil {
					return Result{}, fmt.Errorf("%s: post send: %w", c.Test, err)
				}
			}
		}
		k := s.cq.PollCQ(wc)
		if k == 0 {
			if err := prog.idle(); err != nil {
				return Result{}, err
			}
			continue
		}
		prog.moved()
		t := now()
		for _, e := range wc[:k] {
			if e.Status != verbs.WCSuccess {
				return Result{}, fmt.Errorf("%s: work completion %v (opcode %v, %v) after %d of %d completed", c.Test, e.Status, e.Opcode, e.VendorErr, totccnt, tot)
			}
			q, done := int(e.WRID>>32), int(e.WRID&0xFFFFFFFF)+1
			totccnt += done - ccnt[q]
			ccnt[q] = done
			tcompleted[min(totccnt, times)-1] = t
		}
	}
	r := ptBWResult(size, tot, tposted, tcompleted, cqMod, noPeak)
	cs := *c
	cs.Size, cs.MTU = size, s.params.MTU.Bytes()
	cs.Iters = tot
	start.account(&cs, &r)
	if c.Check && c.Test == "read_bw" {
		for q := range s.qps {
			if err := s.checkRange(s.srcOff(q), size, q, "read_bw: data read"); err != nil {
				return Result{}, err
			}
		}
	}
	return r, nil
}

// checkRange compares the message positions of size in the region at offset at of buf
// with the pattern QP q's peer region was filled with (messages keep their positions:
// the source's position is the target's).
func (s *ptSide) checkRange(at, size, q int, what string) error {
	nslots, step := s.slots(size)
	want := make([]byte, s.region)
	pattern(want, q+1)
	for j := 0; j < min(nslots, s.cfg.Iters); j++ {
		o := j * step
		got := s.buf[at+o : at+o+size]
		if i := firstDiff(got, want[o:o+size]); i >= 0 {
			return fmt.Errorf("%s: QP %d, position %d: byte %d is %#x, want %#x", what, q, j, i, got[i], want[o+i])
		}
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// ptBWResult is print_report_bw for tot messages of size: the average from the first
// post to the last completion, the peak as the best rate of any run of consecutive work
// requests from a post to a signaled completion (with noPeak none: the times are only the
// first post and the last completion), the message rate.
func ptBWResult(size, tot int, tposted, tcompleted []int64, cqMod int, noPeak bool) Result {
	total := float64(tcompleted[len(tcompleted)-1]-tposted[0]) / 1e9
	r := Result{Size: size, Iters: tot, Seconds: total,
		BW:      float64(size) * float64(tot) / total / (1 << 20),
		MsgRate: float64(tot) / total / 1e6,
	}
	if !noPeak {
		best := math.Inf(1)
		try := func(i, j int) {
			if tcompleted[j] == 0 {
				return
			}
			if t := float64(tcompleted[j]-tposted[i]) / float64(j-i+1); t > 0 && t < best {
				best = t
			}
		}
		for i := 0; i < tot; i++ {
			for j := (i+cqMod)/cqMod*cqMod - 1; j < tot; j += cqMod { // ROUND_UP(i+1, cq_mod) - 1
				try(i, j)
			}
			if tot%cqMod != 0 {
				try(i, tot-1)
			}
		}
		if !math.IsInf(best, 1) {
			r.BWPeak = float64(size) / (best / 1e9) / (1 << 20)
		}
	}
	return r
}

// ptLatResult is print_report_lat: the intervals between successive posts (divided by
// rtt: 2 for the ping-pongs, 1 for READ and atomics), sorted, the two largest left out;
// t_typical their median, t_avg their mean, t_stdev perftest's standard deviation (each
// deviation truncated to whole microseconds before squaring, as perftest does), the 99 %
// and 99.9 % percentiles and t_max as perftest indexes them.
func ptLatResult(size int, tposted []int64, rtt int) Result {
	n := len(tposted) - 1
	d := make([]float64, n)
	for i := range d {
		d[i] = float64(tposted[i+1]-tposted[i]) / 1e3 / float64(rtt)
	}
	slices.Sort(d)
	mc := n - ptTailDropped
	median := d[mc/2]
	if (mc-1)%2 != 0 {
		median = (d[mc/2] + d[mc/2-1]) / 2
	}
	var sum, sq float64
	for _, v := range d[:mc] {
		sum += v
	}
	avg := sum / float64(mc)
	for _, v := range d[:mc] {
		tv := int(avg - v) // C's int conversion truncates toward zero
		sq += float64(tv * tv)
	}
	total := float64(tposted[n]-tposted[0]) / 1e9
	return Result{Size: size, Iters: len(tposted), Seconds: total,
		BW:      float64(size) * float64(n) / total / (1 << 20),
		MsgRate: float64(n) / total / 1e6,
		Lat: &Latency{Min: d[0], Max: d[mc], P50: median, Avg: avg, Stdev: math.Sqrt(sq / float64(mc)),
			P99: d[int(math.Ceil(float64(mc)*0.99))], P999: d[int(math.Ceil(float64(mc)*0.999))]},
	}
}

// postRecvs posts the first RxDepth receives of each QP for a send test of size: send_bw's
// move along the target region, send_lat's all land at its start.
func (s *ptSide) postRecvs(size int) error {
	s.posted = make([]int, len(s.qps))
	for q := range s.qps {
		for range s.cfg.RxDepth {
			if err := s.postRecv(q, size); err != nil {
				return err
			}
		}
	}
	return nil
}

// postRecv posts QP q's next receive.
func (s *ptSide) postRecv(q, size int) error {
	off := 0
	if s.cfg.Test == "send_bw" {
		nslots, step := s.slots(size)
		off = (s.posted[q] % nslots) * step
	}
	wr := [1]verbs.RecvWR{{WRID: uint64(q)<<32 | uint64(s.posted[q]), SGList: []verbs.SGE{s.mr.SGE(s.targetOff(q)+off, size)}}}
	if err := s.qps[q].PostRecv(wr[:]); err != nil {
		return fmt.Errorf("%s: post receive: %w", s.cfg.Test, err)
	}
	s.posted[q]++
	return nil
}

// sendBWServer is run_iter_bw_server: count the messages, re-post receives up to the
// iterations, time from the first arrival to the last (no peak: perftest computes none
// on this side).
func (s *ptSide) sendBWServer(size int) (Result, error) {
	c := s.cfg
	tot := c.Iters * len(s.qps)
	wc := make([]verbs.WorkCompletion, 16)
	prog := newProgress("send_bw server")
	var start clock
	var first time.Time
	for got := 0; got < tot; {
		k := s.cq.PollCQ(wc)
		if k == 0 {
			if err := prog.idle(); err != nil {
				return Result{}, err
			}
			continue
		}
		prog.moved()
		if first.IsZero() {
			first, start = time.Now(), startClock()
		}
		for _, e := range wc[:k] {
			if e.Status != verbs.WCSuccess {
				return Result{}, fmt.Errorf("send_bw server: work completion %v (opcode %v, %v) after %d of %d messages", e.Status, e.Opcode, e.VendorErr, got, tot)
			}
			if e.Opcode != verbs.WCRecv {
				return Result{}, fmt.Errorf("send_bw server: a %v completion", e.Opcode)
			}
			if e.ByteLen != uint32(size) {
				return Result{}, fmt.Errorf("send_bw server: message %d has %d bytes, want %d", got, e.ByteLen, size)
			}
			got++
			q := int(e.WRID >> 32)
			if s.posted[q] < c.Iters {
				if err := s.postRecv(q, size); err != nil {
					return Result{}, err
				}
			}
		}
	}
	elapsed := time.Since(first)
	r := Result{Size: size, Iters: tot, Seconds: elapsed.Seconds(),
		BW: float64(size) * float64(tot) / elapsed.Seconds() / (1 << 20), MsgRate: float64(tot) / elapsed.Seconds() / 1e6}
	cs := *c
	cs.Size, cs.MTU, cs.Iters = size, s.params.MTU.Bytes(), tot
	start.account(&cs, &r)
	return r, nil
}

// lat is the state of a latency loop on the side's one QP: completions polled from the
// shared CQ, counted by kind.
type lat struct {
	s          *ptSide
	wc         []verbs.WorkCompletion
	recvs      int // receive completions seen
	sends      int // send-side completions seen
	prog       *progress
	wantLength uint32
}

func (s *ptSide) newLat(size int) *lat {
	return &lat{s: s, wc: make([]verbs.WorkCompletion, 16), prog: newProgress(s.cfg.Test), wantLength: uint32(size)}
}

// poll takes what the CQ has; an error completion, or a receive of the wrong length, is
// an error.
func (l *lat) poll() error {
	k := l.s.cq.PollCQ(l.wc)
	if k == 0 {
		return l.prog.idle()
	}
	l.prog.moved()
	for _, e := range l.wc[:k] {
		if e.Status != verbs.WCSuccess {
			return fmt.Errorf("%s: work completion %v (opcode %v, %v)", l.s.cfg.Test, e.Status, e.Opcode, e.VendorErr)
		}
		if e.Opcode&verbs.WCRecv != 0 {
			if e.ByteLen != l.wantLength {
				return fmt.Errorf("%s: received %d bytes, want %d", l.s.cfg.Test, e.ByteLen, l.wantLength)
			}
			l.recvs++
		} else {
			l.sends++
		}
	}
	return nil
}

func (l *lat) untilSends(n int) error {
	for l.sends < n {
		if err := l.poll(); err != nil {
			return err
		}
	}
	return nil
}

func (l *lat) untilRecvs(n int) error {
	for l.recvs < n {
		if err := l.poll(); err != nil {
			return err
		}
	}
	return nil
}

// byteAt returns a function that loads byte off of buf atomically (through its aligned
// 32-bit word), as a peer's RDMA WRITE lands.
func byteAt(buf []byte, off int) func() byte {
	word := (*uint32)(unsafe.Pointer(&buf[off&^3]))
	shift := 8 * uint(off&3)
	return func() byte { return byte(atomic.LoadUint32(word) >> shift) }
}

// writeLat is run_iter_lat_write: the server writes first; each side waits until the
// last byte of its target region holds the peer's count (1, 2, ... as a char), then
// writes its own count into the last byte of the message it writes, and waits for that
// write's completion.
func (s *ptSide) writeLat(size int) (Result, error) {
	c := s.cfg
	qp := s.qps[0]
	l := s.newLat(size)
	iters := c.Iters
	arrived := byteAt(s.buf, s.targetOff(0)+size-1)
	post := s.buf[s.srcOff(0)+size-1 : s.srcOff(0)+size]
	wr := []verbs.SendWR{{Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
		SGList: []verbs.SGE{s.mr.SGE(s.srcOff(0), size)}, RemoteAddr: s.rem[0].VAddr, RKey: s.rem[0].RKey}}
	if size <= 64 {
		wr[0].SendFlags |= verbs.SendInline
	}
	tposted := make([]int64, iters)
	start := startClock()
	base := time.Now()
	for scnt, ccnt, rcnt := 0, 0, 0; scnt < iters || ccnt < iters || rcnt < iters; {
		if rcnt < iters && !(scnt < 1 && !s.client) {
			rcnt++
			for arrived() != byte(rcnt) {
				if err := l.poll(); err != nil {
					return Result{}, fmt.Errorf("%s: waiting for the peer's write %d: %w", c.Test, rcnt, err)
				}
			}
			l.prog.moved()
		}
		if scnt < iters {
			tposted[scnt] = int64(time.Since(base))
			scnt++
			post[0] = byte(scnt)
			if err := qp.PostSend(wr); err != nil {
				return Result{}, fmt.Errorf("%s: post send: %w", c.Test, err)
			}
		}
		if ccnt < iters {
			ccnt++
			if err := l.untilSends(ccnt); err != nil {
				return Result{}, err
			}
		}
	}
	r := ptLatResult(size, tposted, 2)
	s.accountLat(start, size, &r)
	if c.Check {
		// The last write's count is visible, and RC places in order: all of it is.
		if err := s.checkPrefix(s.targetOff(0), size-1, "write_lat: data written"); err != nil {
			return Result{}, err
		}
		// The counts went into the source's last byte, which -a's next sizes send as data.
		pattern(s.buf[s.srcOff(0):s.srcOff(0)+size], 1)
	}
	return r, nil
}

// checkPrefix compares buf[at:at+n] with the start of QP 0's pattern.
func (s *ptSide) checkPrefix(at, n int, what string) error {
	want := make([]byte, n)
	pattern(want, 1)
	if i := firstDiff(s.buf[at:at+n], want); i >= 0 {
		return fmt.Errorf("%s: byte %d is %#x, want %#x", what, i, s.buf[at+i], want[i])
	}
	return nil
}

func (s *ptSide) accountLat(start clock, size int, r *Result) {
	cs := *s.cfg
	cs.Size, cs.MTU = size, s.params.MTU.Bytes()
	start.account(&cs, r)
}

// sendLat is run_iter_lat_send: the client sends first; each side waits for the peer's
// message, re-posts a receive while fewer than the iterations are posted, and sends its
// own, signaled every cqMod-th (which it then waits for) and at the last.
func (s *ptSide) sendLat(size int) (Result, error) {
	c := s.cfg
	qp := s.qps[0]
	l := s.newLat(size)
	iters := c.Iters
	cqMod := c.cqMod(size)
	wr := []verbs.SendWR{{Opcode: verbs.WRSend, SGList: []verbs.SGE{s.mr.SGE(s.srcOff(0), size)}}}
	if size <= 64 {
		wr[0].SendFlags |= verbs.SendInline
	}
	tposted := make([]int64, iters)
	start := startClock()
	base := time.Now()
	signaled := 0
	for scnt, rcnt := 0, 0; scnt < iters || rcnt < iters; {
		if rcnt < iters && !(scnt < 1 && s.client) {
			rcnt++
			if err := l.untilRecvs(rcnt); err != nil {
				return Result{}, fmt.Errorf("%s: waiting for the peer's message %d: %w", c.Test, rcnt, err)
			}
			if s.posted[0] < iters {
				if err := s.postRecv(0, size); err != nil {
					return Result{}, err
				}
			}
		}
		if scnt < iters {
			tposted[scnt] = int64(time.Since(base))
			scnt++
			sig := scnt%cqMod == 0 || scnt == iters
			wr[0].SendFlags &^= verbs.SendSignaled
			if sig {
				wr[0].SendFlags |= verbs.SendSignaled
			}
			if err := qp.PostSend(wr); err != nil {
				return Result{}, fmt.Errorf("%s: post send: %w", c.Test, err)
			}
			if sig {
				signaled++
				if err := l.untilSends(signaled); err != nil {
					return Result{}, err
				}
			}
		}
	}
	r := ptLatResult(size, tposted, 2)
	s.accountLat(start, size, &r)
	if c.Check {
		if err := s.checkPrefix(s.targetOff(0), size, "send_lat: data received"); err != nil {
			return Result{}, err
		}
	}
	return r, nil
}

// oneSidedLat is run_iter_lat for read_lat and atomic_lat: post one operation, wait for
// its completion, again.
func (s *ptSide) oneSidedLat(size int) (Result, error) {
	c := s.cfg
	qp := s.qps[0]
	l := s.newLat(size)
	iters := c.Iters
	wr := []verbs.SendWR{{Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled,
		SGList: []verbs.SGE{s.mr.SGE(s.srcOff(0), size)}, RemoteAddr: s.rem[0].VAddr, RKey: s.rem[0].RKey}}
	rtt := 1
	if c.Test == "atomic_lat" {
		wr[0].SGList[0] = s.mr.SGE(s.srcOff(0), 8)
		wr[0].Opcode, wr[0].CompareAdd = verbs.WRAtomicFetchAndAdd, 1
		if c.AtomicType == AtomicTypes[1] {
			wr[0].Opcode, wr[0].CompareAdd = verbs.WRAtomicCmpAndSwp, 0
		}
	}
	tposted := make([]int64, iters)
	start := startClock()
	base := time.Now()
	for scnt := 0; scnt < iters; {
		tposted[scnt] = int64(time.Since(base))
		scnt++
		if err := qp.PostSend(wr); err != nil {
			return Result{}, fmt.Errorf("%s: post send: %w", c.Test, err)
		}
		if err := l.untilSends(scnt); err != nil {
			return Result{}, err
		}
		if c.Check && wr[0].Opcode == verbs.WRAtomicFetchAndAdd {
			if got := binary.LittleEndian.Uint64(s.buf[s.srcOff(0):]); got != uint64(scnt-1) {
				return Result{}, fmt.Errorf("atomic_lat: fetch-and-add %d returned %d", scnt-1, got)
			}
		}
	}
	r := ptLatResult(size, tposted, rtt)
	s.accountLat(start, size, &r)
	if c.Check && c.Test == "read_lat" {
		if err := s.checkPrefix(s.srcOff(0), size, "read_lat: data read"); err != nil {
			return Result{}, err
		}
	}
	return r, nil
}

// verifyTargets checks, with --check between two rperfs, what the peer left in this
// side's target regions once it has finished (the session calls it after the peer's last
// handshake): the messages written or sent there, the atomics' sums.
func (s *ptSide) verifyTargets() error {
	c := s.cfg
	if !c.Check || s.client {
		return nil // the client checks what it reads as it goes, as do both ping-pong sides
	}
	size := c.ptSizes()[len(c.ptSizes())-1]
	switch c.Test {
	case "write_bw", "send_bw":
		for q := range s.qps {
			if err := s.checkRange(s.targetOff(q), size, q, c.Test+": data received"); err != nil {
				return err
			}
		}
	case "atomic_bw":
		nslots, step := s.slots(8)
		var sum uint64
		for q := range s.qps {
			for j := range nslots {
				sum += binary.LittleEndian.Uint64(s.buf[s.targetOff(q)+j*step:])
			}
		}
		want := uint64(c.Iters * len(s.qps))
		if c.AtomicType == AtomicTypes[1] {
			want = 0 // compare 0, swap 0
		}
		if sum != want {
			return fmt.Errorf("atomic_bw: the targets add up to %d, want %d", sum, want)
		}
	case "atomic_lat":
		got := binary.LittleEndian.Uint64(s.buf[s.targetOff(0):])
		want := uint64(c.Iters)
		if c.AtomicType == AtomicTypes[1] {
			want = 0
		}
		if got != want {
			return fmt.Errorf("atomic_lat: the target holds %d, want %d", got, want)
		}
	}
	return nil
}
