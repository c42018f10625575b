package transport

import (
	"encoding/binary"

	"github.com/softrnic/softrnic/internal/holes"
	"github.com/softrnic/softrnic/internal/wire"
)

// The weakly-ordered completer: selective acknowledgements, READ responses and atomic
// ACKs wherever they fall, loss detection by reordering threshold, and work requests
// completed in order once the holes before them close.

// detectLoss declares lost every PSN still missing that was sent at least the reordering
// threshold of transmissions before one that was acknowledged or answered.
func (q *QP) detectLoss() {
	ws, r := q.weak, &q.req
	for p := r.una; p.Before(r.highPSN); p = p.Add(1) {
		m := ws.m(p)
		if int32(ws.ackedSeq-m.seq) < ws.reorder {
			break // later PSNs were sent later still
		}
		if !m.queued && !ws.done.Has(p) {
			ws.queueLost(p)
		}
	}
}

// markDone records that PSN p was acknowledged or answered at device time now; a work
// request it completes is held until everything before it is done.
func (q *QP) markDone(p wire.PSN, now int64) bool {
	ws := q.weak
	if ws.done.Mark(p, 1) != holes.Fresh {
		return false
	}
	m := ws.m(p)
	ws.inflight--
	if !m.retx {
		ws.sample = now - m.sentAt
	}
	w := q.sq.byIndex(m.wqe)
	w.doneCnt++
	if w.doneCnt == w.npkts {
		kind := kindSendDone
		switch w.op {
		case WRRead:
			kind = kindReadDone
		case WRAtomicCmpSwap, WRAtomicFetch:
			kind = kindAtomicDone
		}
		ws.done.Hold(holes.Item{PSN: w.lastPSN(), Kind: kind, Ref: m.wqe})
	}
	return true
}

// answered notes that the request m's PSN was sent in arrived (its response came back):
// unless it was sent more than once, its transmission number is known to have arrived.
func (ws *weakState) answered(m *psnMeta) {
	if !m.retx && int32(m.seq-ws.ackedSeq) > 0 {
		ws.ackedSeq = m.seq
	}
}

// doneAdvance completes, in order, the work requests no longer waiting for a hole, finds
// losses and lets the requester send more. progress says whether something new was
// acknowledged or answered.
func (q *QP) doneAdvance(progress bool, now int64) {
	ws, r := q.weak, &q.req
	ws.items = ws.done.Advance(ws.items[:0])
	for _, it := range ws.items {
		if !q.sq.isOldest(it.Ref) {
			break // cannot happen: items come in work request order
		}
		q.comp.completeSend(q.sq.oldest())
	}
	r.una = ws.done.Base()
	if progress {
		ws.rtt()
		q.comp.refill()
		ws.backoff, ws.probeBo = 0, 0
		q.req.restartRTO()
		q.detectLoss()
		ws.probeAt = 0
		q.armProbe(now)
	}
	q.home.queueKick(q)
}

// weakAck handles a selective acknowledgement: every request PSN up to its PSN arrived,
// and the ranges it lists beyond. READ and atomic PSNs are done only when answered.
func (q *QP) weakAck(p *wire.Packet) {
	ws, r := q.weak, &q.req
	q.stats.SACKsRecv++
	var err error
	ws.ranges, err = wire.DecodeSACK(p.Ext, p.Payload, ws.ranges[:0])
	if err != nil {
		q.stats.Dropped++
		return
	}
	syn := p.AETH.Syndrome
	progress := false
	now := q.dev.now()
	mark := func(a, e wire.PSN) {
		if a.Before(r.una) {
			a = r.una
		}
		if r.highPSN.Before(e) {
			e = r.highPSN
		}
		for x := a; x.Before(e); x = x.Add(1) {
			if !ws.m(x).resp && q.markDone(x, now) {
				progress = true
			}
		}
	}
	mark(r.una, p.BTH.PSN.Add(1))
	for _, rg := range ws.ranges {
		mark(rg[0], rg[1])
	}
	if echo := wire.SACKEcho(p.Ext); int32(echo-ws.ackedSeq) > 0 && int32(echo-ws.txSeq) <= 0 {
		ws.ackedSeq = echo
	}
	switch wire.AETHKind(syn) {
	case wire.AETHRNR:
		q.stats.RNRNAKsRecv++
		q.doneAdvance(progress, now)
		if q.state != StateRTS && q.state != StateSQD || r.rnrWait {
			return // one RNR retry per wait, however many packets were refused
		}
		q.comp.startRNRWait(p.BTH.PSN.Add(1), syn)
	case wire.AETHNak:
		q.stats.NAKsRecv++
		q.doneAdvance(progress, now)
		q.comp.fatalNAK(wire.AETHValue(syn))
	default:
		q.doneAdvance(progress, now)
	}
}

// weakReadResponse places a READ response wherever it falls in its work request.
func (q *QP) weakReadResponse(p *wire.Packet) {
	ws, r := q.weak, &q.req
	psn := p.BTH.PSN
	if psn.Before(r.una) || ws.done.Has(psn) {
		q.stats.Duplicates++
		return
	}
	m := ws.m(psn)
	w := q.sq.byIndex(m.wqe)
	if w.op != WRRead || psn.Before(w.firstPSN) || w.lastPSN().Before(psn) {
		q.stats.Dropped++
		return
	}
	off := uint64(psn.Diff(w.firstPSN)) * uint64(q.mtu)
	if uint64(len(p.Payload)) != min(uint64(q.mtu), uint64(w.length)-min(off, uint64(w.length))) {
		q.stats.Dropped++
		return
	}
	if psn != r.una {
		q.stats.PlacedOutOfOrder++
	}
	scatter(w.segs, off, p.Payload)
	now := q.dev.now()
	q.markDone(psn, now)
	ws.answered(m)
	cs := w.firstPSN.Add(uint32(psn.Diff(w.firstPSN)) / uint32(q.dev.cfg.ReadChunk) * uint32(q.dev.cfg.ReadChunk))
	ce := q.req.readChunkEnd(w, psn)
	if ws.done.HasRange(cs, uint32(ce.Diff(cs))+1) {
		r.rdOut--
		ws.readSeqDone(w.readSN.Add(uint32(cs.Diff(w.firstPSN)) / uint32(q.dev.cfg.ReadChunk)))
	}
	q.doneAdvance(true, now)
}

// weakAtomicAck takes an atomic's original value.
func (q *QP) weakAtomicAck(p *wire.Packet) {
	ws, r := q.weak, &q.req
	psn := p.BTH.PSN
	if psn.Before(r.una) || ws.done.Has(psn) {
		q.stats.Duplicates++
		return
	}
	w := q.sq.byIndex(ws.m(psn).wqe)
	if (w.op != WRAtomicCmpSwap && w.op != WRAtomicFetch) || w.firstPSN != psn {
		q.stats.Dropped++
		return
	}
	var v [8]byte
	binary.NativeEndian.PutUint64(v[:], p.AtomicAck)
	scatter(w.segs, 0, v[:])
	now := q.dev.now()
	q.markDone(psn, now)
	ws.answered(ws.m(psn))
	r.rdOut--
	ws.readSeqDone(w.readSN)
	q.doneAdvance(true, now)
}

func (ws *weakState) response(q *QP, p *wire.Packet) {
	switch p.BTH.Opcode {
	case wire.OpWeakAck:
		q.weakAck(p)
	case wire.OpAtomicAcknowledge:
		q.weakAtomicAck(p)
	case wire.OpAcknowledge:
		q.stats.WrongMode++ // a weak peer acknowledges selectively
	default:
		q.weakReadResponse(p)
	}
}
