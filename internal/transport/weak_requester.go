package transport

import (
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// The weakly-ordered requester: sequence numbers for new WQEs, the PSNs in flight and their
// transmission numbers, round trips, the loss probe and selective retransmission.

// readSeqOK reports whether read sequence number seq may be sent: it lies within max of
// the oldest one not complete.
func (ws *weakState) readSeqOK(seq wire.PSN, max uint8) bool {
	return seq.Diff(ws.rdBase) < int32(max)
}

// readSeqDone records that read sequence number seq completed.
func (ws *weakState) readSeqDone(seq wire.PSN) {
	if !seq.InWindow(ws.rdBase, uint32(len(ws.rdDone))) {
		return
	}
	ws.rdDone[uint32(seq)%uint32(len(ws.rdDone))] = true
	for ws.rdDone[uint32(ws.rdBase)%uint32(len(ws.rdDone))] {
		ws.rdDone[uint32(ws.rdBase)%uint32(len(ws.rdDone))] = false
		ws.rdBase = ws.rdBase.Add(1)
	}
}

func (ws *weakState) m(psn wire.PSN) *psnMeta { return &ws.meta[uint32(psn)&(ws.span-1)] }

// start gives a WQE entering the wire its sequence numbers.
func (ws *weakState) start(q *QP, w *sendWQE) {
	w.doneCnt = 0
	switch w.op {
	case WRSend, WRSendImm, WRWriteImm:
		w.rsn = ws.nextRSN
		ws.nextRSN = ws.nextRSN.Add(1)
	case WRRead:
		w.readSN = ws.nextRdSN
		chunks := (w.npkts + uint32(q.dev.cfg.ReadChunk) - 1) / uint32(q.dev.cfg.ReadChunk)
		ws.nextRdSN = ws.nextRdSN.Add(chunks)
	case WRAtomicCmpSwap, WRAtomicFetch:
		w.readSN = ws.nextRdSN
		ws.nextRdSN = ws.nextRdSN.Add(1)
	}
}

// sent records a transmission, at device time now, of PSNs [psn, next) of the WQE at index
// idx.
func (ws *weakState) sent(_ *QP, idx uint64, w *sendWQE, psn, next wire.PSN, now int64) {
	ws.txSeq++ // buildRequest put this number (txSeq+1 then) in the packet
	for p := psn; p != next; p = p.Add(1) {
		ws.inflight++
		*ws.m(p) = psnMeta{seq: ws.txSeq, wqe: uint32(idx), resp: w.isReadOrAtomic(), sentAt: now}
	}
}

// armProbe starts the loss probe if requests are outstanding and it is not running.
func (q *QP) armProbe(now int64) {
	ws := q.weak
	if ws.probeAt != 0 || !q.req.outstanding() || ws.probe <= 0 {
		return
	}
	ws.probeAt = now + ws.probeInterval()<<ws.probeBo
	q.home.timers.arm(q, ws.probeAt)
}

// probeInterval is the loss probe's interval: at least the configured minimum, and long
// enough for a round trip with its variation (as a TCP retransmission timer, RFC 6298).
func (ws *weakState) probeInterval() int64 {
	return max(ws.probe, ws.srtt+4*ws.rttvar, 2*ws.srtt)
}

// rtt folds the round trip measured by the packet just processed into the estimate.
func (ws *weakState) rtt() {
	s := ws.sample
	if s <= 0 {
		return
	}
	ws.sample = 0
	if ws.srtt == 0 {
		ws.srtt, ws.rttvar = s, s/2
		return
	}
	d := ws.srtt - s
	if d < 0 {
		d = -d
	}
	ws.rttvar += (d - ws.rttvar) / 4
	ws.srtt += (s - ws.srtt) / 8
}

// lossProbe runs when the loss probe fires: nothing was acknowledged for a probe
// interval, so the first missing PSN goes again (if it was sent at least that long ago).
// Its acknowledgement, newer than everything still missing, lets the reordering threshold
// find the other losses — the last packets of a burst, a lost retransmission while the
// window is full — long before the ACK timeout; a probe sent because of a mere stall costs
// one packet. It uses none of the retry budget.
func (q *QP) lossProbe(now int64) {
	ws, r := q.weak, &q.req
	ws.probeAt = 0
	if !r.outstanding() {
		return
	}
	age := ws.probeInterval() << ws.probeBo
	for p := r.una; p.Before(r.highPSN); p = p.Add(1) {
		if m := ws.m(p); !ws.done.Has(p) {
			if !m.queued && now-m.sentAt >= age {
				ws.queueLost(p)
			}
			break
		}
	}
	if ws.probeBo < 4 {
		ws.probeBo++
	}
	q.armProbe(now)
}

// fillRetransmits sends the PSNs found lost, alone (a READ re-requests the run of missing
// responses). It returns true if b filled up.
func (q *QP) fillRetransmits(b *netio.SendBatch, now int64) bool {
	ws := q.weak
	r := &q.req
	for len(ws.lost) > 0 {
		p := ws.lost[0]
		m := ws.m(p)
		if !m.queued || ws.done.Has(p) || !p.Before(r.highPSN) {
			m.queued = false
			ws.lost = ws.lost[1:]
			continue
		}
		if !b.Room(maxPieces+2, wire.MaxHeaderLen+wire.OOHLen+16) {
			return true
		}
		w := q.sq.byIndex(m.wqe)
		end := p
		if w.op == WRRead {
			ce := q.req.readChunkEnd(w, p)
			for end != ce {
				n := end.Add(1)
				if ws.done.Has(n) {
					break
				}
				end = n
			}
		}
		idx := m.wqe
		q.req.buildRequest(b, w, p, end, true)
		ws.txSeq++
		for x := p; ; x = x.Add(1) {
			mx := ws.m(x)
			mx.seq, mx.queued, mx.wqe, mx.sentAt, mx.retx = ws.txSeq, false, idx, now, true
			if x == end {
				break
			}
		}
		ws.lost = ws.lost[1:]
		q.stats.Retransmits++
		q.stats.SelectiveRetransmits++
		r.closeWindow()
	}
	if len(ws.lost) == 0 {
		ws.lost = ws.lost[:0:cap(ws.lost)]
	}
	return false
}

// queueLost puts p on the retransmission list.
func (ws *weakState) queueLost(p wire.PSN) {
	m := ws.m(p)
	if !m.queued {
		m.queued = true
		ws.lost = append(ws.lost, p)
	}
}

// queueMissing puts every PSN in [from, high) not yet acknowledged or answered on the
// retransmission list (timer expiry, end of an RNR wait).
func (q *QP) queueMissing(from wire.PSN) {
	ws, r := q.weak, &q.req
	if from.Before(r.una) {
		from = r.una
	}
	for p := from; p.Before(r.highPSN); p = p.Add(1) {
		if !ws.done.Has(p) {
			ws.queueLost(p)
		}
	}
}

func (ws *weakState) rtoShift() uint8 { return ws.backoff }

func (ws *weakState) window(*QP) int32 { return int32(ws.span) }

func (ws *weakState) afterFill(q *QP, now int64) { q.armProbe(now) }

func (ws *weakState) startRequester(_ *QP, psn wire.PSN) { ws.done.Reset(psn) }

// beforeFill: the PSNs found lost go first, alone.
func (ws *weakState) beforeFill(q *QP, b *netio.SendBatch) (int64, bool) {
	now := q.dev.now()
	return now, q.fillRetransmits(b, now)
}

func (*weakState) checkPost(_ *QP, _ uint8, hasAH bool, _ uint32, _ uint64) error {
	return rcCheckPost(hasAH)
}
func (*weakState) transmitted(*QP) {}

// admit: in weak mode the window (requester.openWindow) bounds the packets in flight,
// not PSNs past una.
func (ws *weakState) admit(q *QP, _ *sendWQE, psn, end wire.PSN) bool {
	return ws.inflight+uint32(end.Diff(psn))+1 <= uint32(q.req.openWindow())
}

// readSlot: a READ request or atomic may go out only within max_rd_atomic of the oldest
// read sequence number not complete (see weakState.rdBase).
func (ws *weakState) readSlot(q *QP, w *sendWQE, psn wire.PSN) bool {
	seq := w.readSN
	if w.op == WRRead {
		seq = seq.Add(uint32(psn.Diff(w.firstPSN)) / uint32(q.dev.cfg.ReadChunk))
	}
	return ws.readSeqOK(seq, q.attr.MaxRdAtomic)
}

// format: weak opcodes, every packet with its OOH; a WRITE packet addresses its own
// payload, a READ request asks for one chunk under its own read sequence number.
func (ws *weakState) format(q *QP, w *sendWQE, idx uint32, last bool, off, n uint64) (wire.Opcode, wire.OOH, bool, bool) {
	var op wire.Opcode
	var ooh wire.OOH
	switch w.op {
	case WRSend, WRSendImm, WRWrite, WRWriteImm:
		op = weakDataOpcode(w.op, last)
		ooh = wire.OOH{Seq: w.rsn, Offset: uint32(off), Length: w.length}
		if w.op != WRWrite {
			ooh.Flags = wire.OOHRecv
		}
	case WRRead:
		op = wire.OpWeakReadReq
		chunk := idx / uint32(q.dev.cfg.ReadChunk)
		ooh = wire.OOH{Seq: w.readSN.Add(chunk), Offset: uint32(off), Length: uint32(n)}
	case WRAtomicCmpSwap:
		op = wire.OpWeakCmpSwap
		ooh = wire.OOH{Seq: w.readSN, Length: 8}
	case WRAtomicFetch:
		op = wire.OpWeakCmpSwap + (wire.OpFetchAdd - wire.OpCompareSwap)
		ooh = wire.OOH{Seq: w.readSN, Length: 8}
	}
	ooh.TxSeq = ws.txSeq + 1
	return op, ooh, true, true
}

// probeDue reports whether the loss probe is due.
func (ws *weakState) probeDue(now int64) bool { return ws.probeAt != 0 && now >= ws.probeAt }

// onTimer runs the loss probe.
func (ws *weakState) onTimer(q *QP, now int64) bool {
	if ws.probeAt == 0 || q.req.rnrWait {
		return false
	}
	if now < ws.probeAt {
		q.home.timers.arm(q, ws.probeAt)
		return false
	}
	q.lossProbe(now)
	return len(ws.lost) > 0
}

// resend: only what is missing goes again; a timeout also doubles the timer (up to 64
// times) until something is acknowledged.
func (ws *weakState) resend(q *QP, psn wire.PSN, timeout bool) {
	q.queueMissing(psn)
	if timeout && ws.backoff < 6 {
		ws.backoff++
	}
}
