package transport

import (
	"encoding/binary"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// requester is the send side of an RC QP: it turns send WQEs into request packets, keeps
// the PSN window, the RNR wait and the ACK timers, and asks its ordering mode (order,
// recover: orderedRequester or weakRequester) what the packets look like, when they may
// go, and what to send again.
type requester struct {
	q       *QP // the QP whose send queue it sends
	order   sendOrder
	recover recovery

	nextPSN     wire.PSN // first PSN of the next WQE to start
	curPSN      wire.PSN // next PSN to (re)send within the current WQE (sendQueue.cur)
	una         wire.PSN // oldest unacknowledged PSN
	highPSN     wire.PSN // one past the highest PSN ever sent
	rdOut       int      // read and atomic requests outstanding
	rnrWait     bool     // waiting out an RNR NAK's timer (until rnrUntil) before sending from rnrPSN
	rnrUntil    int64
	rnrPSN      wire.PSN
	rtoAt       int64 // local ACK timeout deadline; 0: not armed
	backoff     uint8 // doublings of the ACK timeout since the last progress (weak mode backs off)
	probeAt     int64 // weak mode's loss probe deadline (weakRequester.lossProbe); 0: not armed
	sinceAckReq int
	// The window (see openWindow), where it last changed, and the AckReq spacing that
	// goes with it.
	win      int32
	winAt    wire.PSN
	ackEvery int
}

func (r *requester) resetPSN(psn wire.PSN) {
	r.nextPSN, r.curPSN, r.una, r.highPSN = psn, psn, psn, psn
	r.setWindow(r.q.dev.winBase)
}

// The window: how many packets the requester keeps in flight (ordered mode: PSNs past
// the oldest unacknowledged one; weak mode: packets unacknowledged). A lost packet costs
// ordered mode's go-back-N about a window of packets sent again, and a window that a loss
// does not shrink keeps a congested receiver's socket overflowing, so the window starts
// small (Device.winBase, 128 packets), doubles each time windowRuns windows' worth of
// packets were acknowledged without a loss since it last changed, up to Device.winMax (1024
// by default: on loopback up to a quarter more throughput and a fifth less CPU per GiB
// than 128, whose stalls for ACKs left both sides polling), and goes back to the start at
// every loss: a sequence NAK, a response missing, a local ACK timeout, a selective
// retransmission. A window opened only after 16 windows without a loss sends again at most
// about a sixteenth of what it sent; under 0.1 % loss it stays near 128 (opening after 4
// windows cost ordered mode a quarter of the throughput there), and a fixed 1024 lost four
// fifths of it under 1 %.

// windowRuns is how many windows must be acknowledged without a loss before the window
// doubles.
const windowRuns = 16

// openWindow doubles the window if windowRuns windows were acknowledged since it last
// changed.
func (r *requester) openWindow() int32 {
	if r.win < r.q.dev.winMax && r.una.Diff(r.winAt) >= windowRuns*r.win {
		r.setWindow(min(2*r.win, r.q.dev.winMax))
	}
	return r.win
}

// closeWindow puts the window back to its start after a loss.
func (r *requester) closeWindow() { r.setWindow(r.q.dev.winBase) }

// setWindow sets the window, from the oldest unacknowledged PSN, and the AckReq spacing
// that goes with it: every quarter window's packet (at least every DefaultAckReqEvery-th),
// unless the device's configuration fixes it. The responder acknowledges each at once
// (responder.requestAck): the requester hears about its window four times a window, and
// the responder sends no more ACKs than that.
func (r *requester) setWindow(w int32) {
	r.win, r.winAt = w, r.una
	r.ackEvery = r.q.dev.cfg.AckReqEvery
	if r.ackEvery == 0 {
		r.ackEvery = max(DefaultAckReqEvery, int(w)/4)
	}
}

// outstanding reports whether sent PSNs await acknowledgement.
func (r *requester) outstanding() bool { return r.una != r.highPSN }

// maxPieces bounds the payload pieces of one packet (one per SGE).
const maxPieces = 32

// pktsFor returns how many PSNs a WQE uses.
func (r *requester) pktsFor(w *sendWQE) uint32 {
	q := r.q
	switch w.op {
	case WRAtomicCmpSwap, WRAtomicFetch:
		return 1
	}
	n := (w.length + q.mtu - 1) / q.mtu
	if n == 0 {
		n = 1
	}
	return n
}

// fill builds request packets into b, as the QP's ordering mode has it (sendOrder.fill),
// unless an RNR wait holds them back; a held-back ACK rides along after them. It returns
// true when it stopped because b is full.
func (r *requester) fill(b *netio.SendBatch) bool {
	q := r.q
	if q.state != StateRTS && q.state != StateSQD {
		return false
	}
	n := b.Len()
	full := false
	if !r.rnrWait {
		full = r.order.fill(b)
		r.armRTO()
	}
	// A held-back ACK rides along after the requests (the peer is waiting for those), if
	// there are any.
	r.piggybackAck(b, n)
	return full
}

// fillNew builds new request packets into b (and, in ordered mode, those it went back
// to) until the window, the queue or b is exhausted, at device time now (0 if the mode
// records no times). It returns true when it stopped because b is full.
func (r *requester) fillNew(b *netio.SendBatch, now int64) bool {
	q := r.q
	window := r.order.window()
	for q.sq.unsent() {
		w := q.sq.current()
		if q.sq.fresh() {
			if q.state == StateSQD {
				return false
			}
			if w.verr != 0 || (w.isReadOrAtomic() && q.attr.MaxRdAtomic == 0) {
				// Everything before it completes first; then it fails and the QP errors.
				if q.sq.atOldest() {
					if w.verr != 0 {
						q.errorState(StatusLocProtErr, w.verr)
					} else {
						q.errorState(StatusLocQPOpErr, VendorNone)
					}
				}
				return false
			}
			if w.flags&FlagFence != 0 && r.rdOut > 0 {
				return false
			}
			if w.isReadOrAtomic() && r.rdOut >= int(q.attr.MaxRdAtomic) {
				return false
			}
			if r.nextPSN.Diff(r.una) >= window {
				return false
			}
			w.firstPSN = r.nextPSN
			w.npkts = r.pktsFor(w)
			r.nextPSN = r.nextPSN.Add(w.npkts)
			r.curPSN = w.firstPSN
			q.sq.start()
			r.order.start(w)
		}
		end := r.curPSN // last PSN the next packet covers
		if w.op == WRRead {
			end = r.readChunkEnd(w, r.curPSN)
		}
		if !r.order.admit(w, r.curPSN, end) {
			return false
		}
		if !b.Room(maxPieces+2, wire.MaxHeaderLen+wire.OOHLen+16) {
			return true
		}
		fresh := !r.curPSN.Before(r.highPSN)
		if fresh && w.isReadOrAtomic() && r.chunkStart(w, r.curPSN) {
			if !r.order.readSlot(w, r.curPSN) {
				return false
			}
			r.rdOut++
		}
		psn := r.curPSN
		r.curPSN = r.buildRequest(b, w, psn, end, false)
		r.order.sent(q.sq.cur, w, psn, r.curPSN, now)
		if fresh {
			r.highPSN = r.curPSN
		} else {
			q.stats.Retransmits++
		}
		if r.curPSN == w.lastPSN().Add(1) {
			if next := q.sq.next(); next != nil {
				r.curPSN = next.firstPSN
			}
		}
	}
	return false
}

// piggybackAck adds a held-back ACK to b if requests were added to b since it held n
// packets, and there is room.
func (r *requester) piggybackAck(b *netio.SendBatch, n int) {
	q := r.q
	if b.Len() > n && q.resp.ackDeferred && q.resp.ackPending && b.Room(2, 64) {
		q.resp.sendAck(b)
	}
}

// readChunkEnd returns the last PSN of the READ request that starts at psn.
func (r *requester) readChunkEnd(w *sendWQE, psn wire.PSN) wire.PSN {
	q := r.q
	c := uint32(q.dev.cfg.ReadChunk)
	idx := uint32(psn.Diff(w.firstPSN))
	end := (idx/c+1)*c - 1
	if end >= w.npkts {
		end = w.npkts - 1
	}
	return w.firstPSN.Add(end)
}

// chunkStart reports whether psn begins one of w's READ requests (always true for atomics).
func (r *requester) chunkStart(w *sendWQE, psn wire.PSN) bool {
	q := r.q
	if w.op != WRRead {
		return true
	}
	return uint32(psn.Diff(w.firstPSN))%uint32(q.dev.cfg.ReadChunk) == 0
}

// buildRequest emits w's request packet at psn (a READ request covers psn..end) and
// returns the PSN after it. ackReq forces the AckReq bit (retransmissions).
func (r *requester) buildRequest(b *netio.SendBatch, w *sendWQE, psn, end wire.PSN, ackReq bool) wire.PSN {
	q := r.q
	idx := uint32(psn.Diff(w.firstPSN))
	off := uint64(idx) * uint64(q.mtu)
	bth := wire.BTH{PKey: wire.DefaultPKey, DestQP: q.attr.DestQPN, PSN: psn}
	var pieces [maxPieces][]byte
	var pay [][]byte
	payLen := 0
	next := psn.Add(1)
	last := psn == w.lastPSN()
	var n uint64 // payload bytes, or what a READ request asks for
	switch w.op {
	case WRSend, WRSendImm, WRWrite, WRWriteImm:
		n = min(uint64(q.mtu), uint64(w.length)-off)
	case WRRead:
		n = uint64(end.Diff(psn)+1) * uint64(q.mtu)
		n = min(n, uint64(w.length)-min(off, uint64(w.length)))
		next = end.Add(1)
	}
	op, ooh, hasOOH, ownVA := r.order.format(w, idx, last, off, n)
	bth.Opcode = op
	info := op.Info()
	hdr := b.Alloc(info.HdrLen)
	switch w.op {
	case WRSend, WRSendImm, WRWrite, WRWriteImm:
		o := wire.BTHLen
		if info.Flags&wire.HasRETH != 0 {
			va := w.raddr
			if ownVA {
				va += off // the packet addresses its own payload
			}
			reth := wire.RETH{VA: va, RKey: w.rkey, DMALen: w.length}
			reth.Put(hdr[o:])
			o += wire.RETHLen
		}
		if info.Flags&wire.HasImmDt != 0 {
			binary.BigEndian.PutUint32(hdr[o:], w.imm)
		}
		bth.SE = last && w.flags&FlagSolicited != 0 && w.op != WRWrite
		r.sinceAckReq++
		if last || ackReq || r.sinceAckReq >= r.ackEvery {
			bth.AckReq = true
			r.sinceAckReq = 0
		}
		pay = gather(w.segs, off, int(n), pieces[:0])
		payLen = int(n)
	case WRRead:
		reth := wire.RETH{VA: w.raddr + off, RKey: w.rkey, DMALen: uint32(n)}
		reth.Put(hdr[wire.BTHLen:])
		bth.AckReq = ackReq
	default: // atomics
		at := wire.AtomicETH{VA: w.raddr, RKey: w.rkey, SwapAdd: w.swap, Compare: w.compareAdd}
		if w.op == WRAtomicFetch {
			at.SwapAdd, at.Compare = w.compareAdd, 0
		}
		at.Put(hdr[wire.BTHLen:])
		bth.AckReq = ackReq
	}
	if hasOOH {
		ooh.Put(hdr[info.HdrLen-wire.OOHLen:])
	}
	bth.PadCnt = uint8(wire.PadFor(payLen))
	bth.Put(hdr)
	q.emit(b, hdr, pay, payLen)
	return next
}

// armRTO starts the local ACK timer when requests are outstanding and it is not running.
func (r *requester) armRTO() {
	q := r.q
	to := wire.AckTimeout(q.attr.Timeout)
	if !r.outstanding() || to == 0 {
		r.rtoAt = 0
		return
	}
	if r.rtoAt == 0 {
		to <<= r.backoff
		r.rtoAt = q.dev.now() + int64(to)
		q.home.timers.arm(q, r.rtoAt)
	}
}

// restartRTO restarts the local ACK timer after progress.
func (r *requester) restartRTO() {
	r.rtoAt = 0
	r.armRTO()
}

// lossDue reports whether a timer that declares a loss is due at now: the ACK timeout with
// requests outstanding, or weak mode's loss probe.
func (r *requester) lossDue(now int64) bool {
	return (r.rtoAt != 0 && now >= r.rtoAt && r.outstanding()) || (r.probeAt != 0 && now >= r.probeAt)
}
