package transport

import (
	"errors"
	"fmt"

	"github.com/softrnic/softrnic/internal/tpt"
)

// Errors of PostSend and PostRecv.
var (
	ErrQPState = errors.New("QP state does not allow posting")
	// ErrDeviceClosed is returned by posts after the device was closed.
	ErrDeviceClosed = errors.New("device closed")
	ErrSQFull       = errors.New("send queue full")
	// ErrDestroyed is returned by posts to (and changes of) a destroyed QP or SRQ.
	ErrDestroyed = errors.New("destroyed")
	// ErrSGEBounds is returned by a post whose scatter/gather element reaches outside the
	// region its key names (the key, protection domain and rights being right: those are
	// found when the work request is used, as hardware finds them).
	ErrSGEBounds = errors.New("SGE outside its memory region")
)

// sgeBoundsError describes scatter/gather element i, which lies outside r.
func sgeBoundsError(i int, s SGE, r *tpt.Region) error {
	return fmt.Errorf("%w: SGE %d (addr %#x, %d bytes) is not within the region of lkey %#x (addr %#x, %d bytes)",
		ErrSGEBounds, i, s.Addr, s.Length, s.LKey, r.IOVA(), r.Len())
}

// PostSend posts work requests in order. It returns how many were posted and, if not all,
// why the next one was refused.
func (q *QP) PostSend(wrs []SendWR) (int, error) {
	if q.dev.closed.Load() {
		return 0, ErrDeviceClosed
	}
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return 0, fmt.Errorf("QP was %w", ErrDestroyed)
	}
	switch q.state {
	case StateRTS, StateSQD, StateErr:
	default:
		st := q.state
		q.mu.Unlock()
		return 0, fmt.Errorf("%w: PostSend in state %v (needs RTS)", ErrQPState, st)
	}
	for i := range wrs {
		if err := q.postOne(&wrs[i]); err != nil {
			q.finishPostUnlock(i)
			return i, err
		}
	}
	q.finishPostUnlock(len(wrs))
	return len(wrs), nil
}

// finishPostUnlock starts transmission of what was posted (or flushes it in ERR); it releases
// q.mu.
func (q *QP) finishPostUnlock(n int) {
	if n == 0 {
		q.mu.Unlock()
		return
	}
	if q.state == StateErr {
		q.flush(StatusWRFlushErr, 0)
		q.mu.Unlock()
		return
	}
	q.pushTxUnlock()
}

func (q *QP) postOne(wr *SendWR) error {
	if q.sq.full() {
		return ErrSQFull
	}
	var total uint64 // the message's length
	for _, s := range wr.SG {
		total += uint64(s.Length)
	}
	if err := q.svc.checkPost(wr.Opcode, wr.AH != nil, wr.RemoteQPN, total); err != nil {
		return err
	}
	if len(wr.SG) > q.maxSendSGE {
		return fmt.Errorf("%d SGEs exceed the QP's max_send_sge %d", len(wr.SG), q.maxSendSGE)
	}
	w := q.sq.slot()
	w.segs = w.segs[:0]
	w.verr = 0
	inline := wr.Flags&FlagInline != 0
	switch wr.Opcode {
	case WRSend, WRSendImm, WRWrite, WRWriteImm:
	case WRRead:
		if inline {
			return errors.New("INLINE is not valid for RDMA_READ")
		}
	case WRAtomicCmpSwap, WRAtomicFetch:
		if inline {
			return errors.New("INLINE is not valid for atomics")
		}
		if len(wr.SG) != 1 || wr.SG[0].Length != 8 {
			return errors.New("an atomic work request needs exactly one 8-byte SGE")
		}
	default:
		return fmt.Errorf("%s is not supported on an RC QP", WROpName(wr.Opcode))
	}
	if inline {
		w.inline = w.inline[:0]
		if total > uint64(q.maxInline) {
			// An element outside its region says more about the mistake than its size.
			for i, s := range wr.SG {
				r := q.dev.mrs.Lookup(s.LKey)
				if _, st := r.Check(q.pd, s.Addr, uint64(s.Length), tpt.LocalRead); st == tpt.OutOfBounds {
					return sgeBoundsError(i, s, r)
				}
			}
			return fmt.Errorf("inline data of %d bytes exceeds the QP's max_inline_data %d", total, q.maxInline)
		}
		for i, s := range wr.SG {
			r := q.dev.mrs.Lookup(s.LKey)
			b, st := r.Check(q.pd, s.Addr, uint64(s.Length), tpt.LocalRead)
			if st == tpt.OutOfBounds {
				return sgeBoundsError(i, s, r)
			}
			if st != tpt.OK {
				// Inline data may come from unregistered memory in libibverbs; here all
				// memory is reached through registrations, so an unknown key is an error.
				return fmt.Errorf("inline SGE %d: lkey %#x: %v", i, s.LKey, st)
			}
			w.inline = append(w.inline, b...)
		}
		if len(w.inline) > 0 {
			w.segs = append(w.segs, w.inline)
		}
	} else {
		need := tpt.LocalRead
		if wr.Opcode == WRRead || wr.Opcode >= WRAtomicCmpSwap {
			need = tpt.LocalWrite
		}
		for i, s := range wr.SG {
			r := q.dev.mrs.Lookup(s.LKey)
			b, st := r.Check(q.pd, s.Addr, uint64(s.Length), need)
			if st == tpt.OutOfBounds {
				clear(w.segs)
				return sgeBoundsError(i, s, r)
			}
			if st != tpt.OK {
				if w.verr == 0 {
					w.verr = localVendorErr(st)
				}
				continue
			}
			if len(b) > 0 {
				w.segs = append(w.segs, b)
			}
		}
	}
	if total > MaxMessage {
		clear(w.segs)
		return fmt.Errorf("message of %d bytes exceeds the maximum of 2^31", total)
	}
	w.wrID = wr.WRID
	w.op = wr.Opcode
	w.flags = wr.Flags
	w.signaled = q.sigAll || wr.Flags&FlagSignaled != 0
	w.imm = wr.Imm
	w.raddr = wr.RemoteAddr
	w.rkey = wr.RKey
	w.compareAdd = wr.CompareAdd
	w.swap = wr.Swap
	w.length = uint32(total)
	w.ah, w.remoteQPN, w.qkey = wr.AH, wr.RemoteQPN, wr.RemoteQKey
	if wr.RemoteQKey&0x80000000 != 0 {
		w.qkey = q.attr.QKey // a controlled Q_Key: the QP's own is sent instead
	}
	q.sq.post()
	return nil
}

// PostRecv posts receive work requests to the QP's own receive queue.
func (q *QP) PostRecv(wrs []RecvWR) (int, error) {
	if q.dev.closed.Load() {
		return 0, ErrDeviceClosed
	}
	if q.srq {
		return 0, errors.New("QP uses a shared receive queue; post to the SRQ")
	}
	q.mu.Lock()
	st, destroyed := q.state, q.destroyed
	q.mu.Unlock()
	if destroyed {
		return 0, fmt.Errorf("QP was %w", ErrDestroyed)
	}
	if st == StateReset {
		return 0, fmt.Errorf("%w: PostRecv in state RESET", ErrQPState)
	}
	for i := range wrs {
		if err := q.rq.post(&wrs[i]); err != nil {
			return i, err
		}
	}
	if st == StateErr {
		q.mu.Lock()
		if q.state == StateErr {
			q.rq.flush(q.recvCQ, q.qpn)
		}
		q.mu.Unlock()
	}
	return len(wrs), nil
}
