package transport

import (
	"encoding/binary"

	"github.com/softrnic/softrnic/internal/holes"
	"github.com/softrnic/softrnic/internal/wire"
)

// weakCompleter is the weakly-ordered completer: it takes selective acknowledgements, READ
// responses and atomic ACKs wherever they fall, keeps which PSNs are done (acknowledged or
// answered) in a hole tracker whose base is the requester's una, finds losses by the
// reordering threshold (queuing them on the requester), and completes work requests in
// order once the holes before them close.
type weakCompleter struct {
	q   *QP
	c   *completer     // the QP's completer: retry budgets, completions, fatal NAKs
	req *weakRequester // what was sent, when, and the PSNs to send again

	reorder  int32          // transmissions after a missing PSN's that make it lost
	done     *holes.Tracker // PSNs acknowledged or answered; Base is una
	ackedSeq uint32         // highest transmission number found acknowledged or answered
	sample   int64          // round trip measured by the packet being processed (0: none)

	items  []holes.Item  // scratch
	ranges [][2]wire.PSN // scratch
}

func (wc *weakCompleter) init(q *QP, req *weakRequester, span uint32) {
	wc.q, wc.c, wc.req = q, &q.comp, req
	wc.reorder = int32(q.dev.cfg.ReorderThreshold)
	wc.done = holes.New(0, span)
}

// response runs the weakly-ordered completer for a response whose PSN was sent.
func (wc *weakCompleter) response(p *wire.Packet) {
	switch p.BTH.Opcode {
	case wire.OpWeakAck:
		wc.ack(p)
	case wire.OpAtomicAcknowledge:
		wc.atomicAck(p)
	case wire.OpAcknowledge:
		wc.q.stats.WrongMode++ // a weak peer acknowledges selectively
	default:
		wc.readResponse(p)
	}
}

// detectLoss declares lost every PSN still missing that was sent at least the reordering
// threshold of transmissions before one that was acknowledged or answered.
func (wc *weakCompleter) detectLoss() {
	r, wr := &wc.q.req, wc.req
	for p := r.una; p.Before(r.highPSN); p = p.Add(1) {
		m := wr.m(p)
		if int32(wc.ackedSeq-m.seq) < wc.reorder {
			break // later PSNs were sent later still
		}
		if !m.queued && !wc.done.Has(p) {
			wr.queueLost(p)
		}
	}
}

// markDone records that PSN p was acknowledged or answered at device time now; a work
// request it completes is held until everything before it is done.
func (wc *weakCompleter) markDone(p wire.PSN, now int64) bool {
	if wc.done.Mark(p, 1) != holes.Fresh {
		return false
	}
	wr := wc.req
	m := wr.m(p)
	wr.inflight--
	if !m.retx {
		wc.sample = now - m.sentAt
	}
	w := wc.q.sq.byIndex(m.wqe)
	w.doneCnt++
	if w.doneCnt == w.npkts {
		kind := kindSendDone
		switch w.op {
		case WRRead:
			kind = kindReadDone
		case WRAtomicCmpSwap, WRAtomicFetch:
			kind = kindAtomicDone
		}
		wc.done.Hold(holes.Item{PSN: w.lastPSN(), Kind: kind, Ref: m.wqe})
	}
	return true
}

// answered notes that the request m's PSN was sent in arrived (its response came back):
// unless it was sent more than once, its transmission number is known to have arrived.
func (wc *weakCompleter) answered(m *psnMeta) {
	if !m.retx && int32(m.seq-wc.ackedSeq) > 0 {
		wc.ackedSeq = m.seq
	}
}

// advance completes, in order, the work requests no longer waiting for a hole, finds
// losses and lets the requester send more. progress says whether something new was
// acknowledged or answered.
func (wc *weakCompleter) advance(progress bool, now int64) {
	q := wc.q
	wc.items = wc.done.Advance(wc.items[:0])
	for _, it := range wc.items {
		if !q.sq.isOldest(it.Ref) {
			break // cannot happen: items come in work request order
		}
		wc.c.completeSend(q.sq.oldest())
	}
	q.req.una = wc.done.Base()
	if progress {
		sample := wc.sample
		if sample > 0 {
			wc.sample = 0
		}
		wc.c.refill()
		wc.req.progress(sample, now)
		wc.detectLoss()
	}
	q.home.queueKick(q)
}

// ack handles a selective acknowledgement: every request PSN up to its PSN arrived, and
// the ranges it lists beyond. READ and atomic PSNs are done only when answered.
func (wc *weakCompleter) ack(p *wire.Packet) {
	q, r, wr := wc.q, &wc.q.req, wc.req
	q.stats.SACKsRecv++
	var err error
	wc.ranges, err = wire.DecodeSACK(p.Ext, p.Payload, wc.ranges[:0])
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
			if !wr.m(x).resp && wc.markDone(x, now) {
				progress = true
			}
		}
	}
	mark(r.una, p.BTH.PSN.Add(1))
	for _, rg := range wc.ranges {
		mark(rg[0], rg[1])
	}
	if echo := wire.SACKEcho(p.Ext); int32(echo-wc.ackedSeq) > 0 && int32(echo-wr.txSeq) <= 0 {
		wc.ackedSeq = echo
	}
	switch wire.AETHKind(syn) {
	case wire.AETHRNR:
		q.stats.RNRNAKsRecv++
		wc.advance(progress, now)
		if q.state != StateRTS && q.state != StateSQD || r.rnrWait {
			return // one RNR retry per wait, however many packets were refused
		}
		wc.c.startRNRWait(p.BTH.PSN.Add(1), syn)
	case wire.AETHNak:
		q.stats.NAKsRecv++
		wc.advance(progress, now)
		wc.c.fatalNAK(wire.AETHValue(syn))
	default:
		wc.advance(progress, now)
	}
}

// readResponse places a READ response wherever it falls in its work request.
func (wc *weakCompleter) readResponse(p *wire.Packet) {
	q, r, wr := wc.q, &wc.q.req, wc.req
	psn := p.BTH.PSN
	if psn.Before(r.una) || wc.done.Has(psn) {
		q.stats.Duplicates++
		return
	}
	m := wr.m(psn)
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
	wc.markDone(psn, now)
	wc.answered(m)
	chunk := uint32(q.dev.cfg.ReadChunk)
	cs := w.firstPSN.Add(uint32(psn.Diff(w.firstPSN)) / chunk * chunk)
	ce := r.readChunkEnd(w, psn)
	if wc.done.HasRange(cs, uint32(ce.Diff(cs))+1) {
		r.rdOut--
		wr.readSeqDone(w.readSN.Add(uint32(cs.Diff(w.firstPSN)) / chunk))
	}
	wc.advance(true, now)
}

// atomicAck takes an atomic's original value.
func (wc *weakCompleter) atomicAck(p *wire.Packet) {
	q, r, wr := wc.q, &wc.q.req, wc.req
	psn := p.BTH.PSN
	if psn.Before(r.una) || wc.done.Has(psn) {
		q.stats.Duplicates++
		return
	}
	w := q.sq.byIndex(wr.m(psn).wqe)
	if (w.op != WRAtomicCmpSwap && w.op != WRAtomicFetch) || w.firstPSN != psn {
		q.stats.Dropped++
		return
	}
	var v [8]byte
	binary.NativeEndian.PutUint64(v[:], p.AtomicAck)
	scatter(w.segs, 0, v[:])
	now := q.dev.now()
	wc.markDone(psn, now)
	wc.answered(wr.m(psn))
	r.rdOut--
	wr.readSeqDone(w.readSN)
	wc.advance(true, now)
}
