package transport

import (
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// weakRequester is the weakly-ordered requester: it gives new WQEs their receive and read
// sequence numbers, bounds the packets in flight and the READ requests and atomics by
// read sequence number, records each transmission of a PSN (meta), keeps the list of PSNs
// found lost and sends them again alone, and runs the loss probe with its round-trip
// estimate. The completer (weakCompleter) reads what it recorded, finds losses and queues
// them here.
type weakRequester struct {
	q    *QP
	r    *requester     // the QP's requester, whose fill loop asks this one (see sendOrder)
	comp *weakCompleter // whose done tracker says which PSNs need no sending again
	span uint32

	meta     []psnMeta  // by PSN & (span-1)
	txSeq    uint32     // transmissions so far
	inflight uint32     // PSNs sent and not yet acknowledged or answered
	lost     []wire.PSN // PSNs to retransmit (entries whose meta is no longer queued are stale)
	probeBo  uint8      // loss probe doublings since the last progress (its deadline: requester.probeAt)
	probeMin int64      // minimum loss probe interval
	srtt     int64      // smoothed round trip (ns), from first transmissions only
	rttvar   int64
	nextRSN  wire.PSN
	nextRdSN wire.PSN
	// rdBase is the oldest read sequence number (READ request or atomic) not yet
	// complete; rdDone marks those after it that are, by sequence number & (len-1).
	// A new one may go out only within max_rd_atomic of rdBase: the responder keeps its
	// resource in slot seq % max_dest_rd_atomic, and in weak mode requests complete out of
	// order, so a count of outstanding ones is not enough — a later request would take the
	// slot of an older one whose lost responses are still to be asked for again.
	rdBase wire.PSN
	rdDone [256]bool
}

// psnMeta is what the requester knows about one PSN in flight.
type psnMeta struct {
	sentAt int64  // device time of its last (re)transmission or of its READ request
	seq    uint32 // transmission number of its last (re)transmission or of its READ request
	wqe    uint32 // low bits of the index of the WQE it belongs to
	resp   bool   // completed by a response (READ, atomic), not by an acknowledgement
	queued bool   // on the retransmission list
	retx   bool   // sent more than once (no round-trip sample from it)
}

func (wr *weakRequester) init(q *QP, comp *weakCompleter, span uint32) {
	wr.q, wr.r, wr.comp, wr.span = q, &q.req, comp, span
	wr.probeMin = int64(q.dev.cfg.LossProbe)
	wr.meta = make([]psnMeta, span)
}

func (wr *weakRequester) m(psn wire.PSN) *psnMeta { return &wr.meta[uint32(psn)&(wr.span-1)] }

// readSeqOK reports whether read sequence number seq may be sent: it lies within max of
// the oldest one not complete.
func (wr *weakRequester) readSeqOK(seq wire.PSN, max uint8) bool {
	return seq.Diff(wr.rdBase) < int32(max)
}

// readSeqDone records that read sequence number seq completed.
func (wr *weakRequester) readSeqDone(seq wire.PSN) {
	if !seq.InWindow(wr.rdBase, uint32(len(wr.rdDone))) {
		return
	}
	wr.rdDone[uint32(seq)%uint32(len(wr.rdDone))] = true
	for wr.rdDone[uint32(wr.rdBase)%uint32(len(wr.rdDone))] {
		wr.rdDone[uint32(wr.rdBase)%uint32(len(wr.rdDone))] = false
		wr.rdBase = wr.rdBase.Add(1)
	}
}

// begin: the requester's first PSN is the base of the completer's done tracker.
func (wr *weakRequester) begin(psn wire.PSN) {
	wr.r.resetPSN(psn)
	wr.comp.done.Reset(psn)
}

// fill sends the PSNs found lost first, alone, then new packets, and arms the loss probe.
func (wr *weakRequester) fill(b *netio.SendBatch) bool {
	now := wr.q.dev.now()
	full := wr.fillRetransmits(b, now) || wr.r.fillNew(b, now)
	wr.armProbe(now)
	return full
}

// window: the requester assigns PSNs up to the span past una (the window, which bounds
// the packets in flight, is admit's).
func (wr *weakRequester) window() int32 { return int32(wr.span) }

// start gives a WQE entering the wire its sequence numbers.
func (wr *weakRequester) start(w *sendWQE) {
	w.doneCnt = 0
	switch w.op {
	case WRSend, WRSendImm, WRWriteImm:
		w.rsn = wr.nextRSN
		wr.nextRSN = wr.nextRSN.Add(1)
	case WRRead:
		w.readSN = wr.nextRdSN
		chunks := (w.npkts + uint32(wr.q.dev.cfg.ReadChunk) - 1) / uint32(wr.q.dev.cfg.ReadChunk)
		wr.nextRdSN = wr.nextRdSN.Add(chunks)
	case WRAtomicCmpSwap, WRAtomicFetch:
		w.readSN = wr.nextRdSN
		wr.nextRdSN = wr.nextRdSN.Add(1)
	}
}

// admit: the packet's PSNs lie within the span past una, and the window
// (requester.openWindow) bounds the packets in flight, not PSNs past una.
func (wr *weakRequester) admit(_ *sendWQE, psn, end wire.PSN) bool {
	return end.Diff(wr.r.una) < int32(wr.span) && wr.inflight+uint32(end.Diff(psn))+1 <= uint32(wr.r.openWindow())
}

// readSlot: a READ request or atomic may go out while fewer than max_rd_atomic are
// outstanding, and only within max_rd_atomic of the oldest read sequence number not
// complete (see weakRequester.rdBase).
func (wr *weakRequester) readSlot(w *sendWQE, psn wire.PSN) bool {
	q := wr.q
	if wr.r.rdOut >= int(q.attr.MaxRdAtomic) {
		return false
	}
	seq := w.readSN
	if w.op == WRRead {
		seq = seq.Add(uint32(psn.Diff(w.firstPSN)) / uint32(q.dev.cfg.ReadChunk))
	}
	return wr.readSeqOK(seq, q.attr.MaxRdAtomic)
}

// format: weak opcodes, every packet with its OOH; a WRITE packet addresses its own
// payload, a READ request asks for one chunk under its own read sequence number.
func (wr *weakRequester) format(w *sendWQE, idx uint32, last bool, off, n uint64) (wire.Opcode, wire.OOH, bool, bool) {
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
		chunk := idx / uint32(wr.q.dev.cfg.ReadChunk)
		ooh = wire.OOH{Seq: w.readSN.Add(chunk), Offset: uint32(off), Length: uint32(n)}
	case WRAtomicCmpSwap:
		op = wire.OpWeakCmpSwap
		ooh = wire.OOH{Seq: w.readSN, Length: 8}
	case WRAtomicFetch:
		op = wire.OpWeakCmpSwap + (wire.OpFetchAdd - wire.OpCompareSwap)
		ooh = wire.OOH{Seq: w.readSN, Length: 8}
	}
	ooh.TxSeq = wr.txSeq + 1
	return op, ooh, true, true
}

// weakDataOpcode returns the weak-mode opcode of a SEND or WRITE packet; the immediate
// travels on the message's last packet.
func weakDataOpcode(op uint8, last bool) wire.Opcode {
	switch {
	case op == WRSendImm && last:
		return wire.OpWeakSendImm
	case op == WRSend || op == WRSendImm:
		return wire.OpWeakSend
	case op == WRWriteImm && last:
		return wire.OpWeakWriteImm
	}
	return wire.OpWeakWrite
}

// sent records a transmission, at device time now, of PSNs [psn, next) of the WQE at index
// idx.
func (wr *weakRequester) sent(idx uint64, w *sendWQE, psn, next wire.PSN, now int64) {
	wr.txSeq++ // buildRequest put this number (txSeq+1 then) in the packet
	for p := psn; p != next; p = p.Add(1) {
		wr.inflight++
		*wr.m(p) = psnMeta{seq: wr.txSeq, wqe: uint32(idx), resp: w.isReadOrAtomic(), sentAt: now}
	}
}

// fillRetransmits sends the PSNs found lost, alone (a READ re-requests the run of missing
// responses). It returns true if b filled up.
func (wr *weakRequester) fillRetransmits(b *netio.SendBatch, now int64) bool {
	q, r, done := wr.q, wr.r, wr.comp.done
	for len(wr.lost) > 0 {
		p := wr.lost[0]
		m := wr.m(p)
		if !m.queued || done.Has(p) || !p.Before(r.highPSN) {
			m.queued = false
			wr.lost = wr.lost[1:]
			continue
		}
		if !b.Room(maxPieces+2, wire.MaxHeaderLen+wire.OOHLen+16) {
			return true
		}
		w := q.sq.byIndex(m.wqe)
		end := p
		if w.op == WRRead {
			ce := r.readChunkEnd(w, p)
			for end != ce {
				n := end.Add(1)
				if done.Has(n) {
					break
				}
				end = n
			}
		}
		idx := m.wqe
		r.buildRequest(b, w, p, end, true)
		wr.txSeq++
		for x := p; ; x = x.Add(1) {
			mx := wr.m(x)
			mx.seq, mx.queued, mx.wqe, mx.sentAt, mx.retx = wr.txSeq, false, idx, now, true
			if x == end {
				break
			}
		}
		wr.lost = wr.lost[1:]
		q.stats.Retransmits++
		q.stats.SelectiveRetransmits++
		r.closeWindow()
	}
	if len(wr.lost) == 0 {
		wr.lost = wr.lost[:0:cap(wr.lost)]
	}
	return false
}

// queueLost puts p on the retransmission list.
func (wr *weakRequester) queueLost(p wire.PSN) {
	m := wr.m(p)
	if !m.queued {
		m.queued = true
		wr.lost = append(wr.lost, p)
	}
}

// queueMissing puts every PSN in [from, high) not yet acknowledged or answered on the
// retransmission list (timer expiry, end of an RNR wait).
func (wr *weakRequester) queueMissing(from wire.PSN) {
	r, done := wr.r, wr.comp.done
	if from.Before(r.una) {
		from = r.una
	}
	for p := from; p.Before(r.highPSN); p = p.Add(1) {
		if !done.Has(p) {
			wr.queueLost(p)
		}
	}
}

// resend: only what is missing goes again; a timeout also doubles the timer (up to 64
// times) until something is acknowledged.
func (wr *weakRequester) resend(psn wire.PSN, timeout bool) {
	wr.queueMissing(psn)
	if timeout && wr.r.backoff < 6 {
		wr.r.backoff++
	}
}

// progress runs when the completer found something new acknowledged or answered at
// device time now, with the round trip that told it (0: none): the timers' back-off
// ends, the ACK timer restarts and the loss probe is armed again from now.
func (wr *weakRequester) progress(sample, now int64) {
	if sample > 0 {
		wr.rtt(sample)
	}
	wr.r.backoff, wr.probeBo = 0, 0
	wr.r.restartRTO()
	wr.r.probeAt = 0
	wr.armProbe(now)
}

// rtt folds a round trip sample s into the estimate.
func (wr *weakRequester) rtt(s int64) {
	if wr.srtt == 0 {
		wr.srtt, wr.rttvar = s, s/2
		return
	}
	d := wr.srtt - s
	if d < 0 {
		d = -d
	}
	wr.rttvar += (d - wr.rttvar) / 4
	wr.srtt += (s - wr.srtt) / 8
}

// armProbe starts the loss probe if requests are outstanding and it is not running.
func (wr *weakRequester) armProbe(now int64) {
	q, r := wr.q, wr.r
	if r.probeAt != 0 || !r.outstanding() || wr.probeMin <= 0 {
		return
	}
	r.probeAt = now + wr.probeInterval()<<wr.probeBo
	q.home.timers.arm(q, r.probeAt)
}

// probeInterval is the loss probe's interval: at least the configured minimum, and long
// enough for a round trip with its variation (as a TCP retransmission timer, RFC 6298).
func (wr *weakRequester) probeInterval() int64 {
	return max(wr.probeMin, wr.srtt+4*wr.rttvar, 2*wr.srtt)
}

// probe runs the loss probe (its deadline passed) and reports whether it found a PSN to
// send again.
func (wr *weakRequester) probe(now int64) bool {
	wr.lossProbe(now)
	return len(wr.lost) > 0
}

// lossProbe runs when the loss probe fires: nothing was acknowledged for a probe
// interval, so the first missing PSN goes again (if it was sent at least that long ago).
// Its acknowledgement, newer than everything still missing, lets the reordering threshold
// find the other losses — the last packets of a burst, a lost retransmission while the
// window is full — long before the ACK timeout; a probe sent because of a mere stall costs
// one packet. It uses none of the retry budget.
func (wr *weakRequester) lossProbe(now int64) {
	r, done := wr.r, wr.comp.done
	r.probeAt = 0
	if !r.outstanding() {
		return
	}
	age := wr.probeInterval() << wr.probeBo
	for p := r.una; p.Before(r.highPSN); p = p.Add(1) {
		if m := wr.m(p); !done.Has(p) {
			if !m.queued && now-m.sentAt >= age {
				wr.queueLost(p)
			}
			break
		}
	}
	if wr.probeBo < 4 {
		wr.probeBo++
	}
	wr.armProbe(now)
}
