package transport

import (
	"encoding/binary"

	"github.com/softrnic/softrnic/internal/holes"
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// Weakly-ordered mode (as IRN, Falcon's weakly-ordered RDMA and NVIDIA's out-of-order
// placement): every packet describes itself and is placed the moment it arrives; what it
// completes is held, counted on the hole in the PSN space it waits for, and released in
// order when that hole closes (package holes). Losses are found from selective
// acknowledgements with a reordering threshold, or by the retransmission timer with
// back-off, and only the lost packets are sent again.
//
// Responder, per hole: receive completions (SEND, WRITE with immediate) whose CQEs are
// posted when it closes; READ requests whose responses are prepared but held for the
// doorbell that rings when it closes; atomics, executed when it closes.
// Requester, per hole in the acknowledged/answered PSNs: READ work requests whose
// responses all arrived, SEND/WRITE work requests all acknowledged, atomics answered; they
// complete when it closes.
//
// Memory visibility: bytes of a message may land in any order. Only a completion (a CQE,
// or a later message's CQE) says a message's bytes are all there; polling the last byte
// of a buffer does not.

// Kinds of held items.
const (
	// Responder.
	kindRecv    holes.Kind = 0 // a receive completion (SEND, WRITE with immediate)
	kindReadReq holes.Kind = 1 // a READ request whose responses wait for the doorbell
	kindAtomic  holes.Kind = 2 // an atomic, executed when the hole closes
	// Requester.
	kindSendDone   holes.Kind = 0 // a SEND or WRITE work request, acknowledged
	kindReadDone   holes.Kind = 1 // a READ work request, all responses arrived
	kindAtomicDone holes.Kind = 2 // an atomic work request, answered
)

// psnMeta is what the requester knows about one PSN in flight.
type psnMeta struct {
	sentAt int64  // device time of its last (re)transmission or of its READ request
	seq    uint32 // transmission number of its last (re)transmission or of its READ request
	wqe    uint32 // low bits of the index of the WQE it belongs to
	resp   bool   // completed by a response (READ, atomic), not by an acknowledgement
	queued bool   // on the retransmission list
	retx   bool   // sent more than once (no round-trip sample from it)
}

// weakMsg is a message that consumes a receive WQE, while its packets arrive.
type weakMsg struct {
	valid  bool
	rsn    wire.PSN
	first  wire.PSN // the message's first PSN
	npk    uint32   // packets
	got    uint32   // packets placed
	length uint32
	imm    uint32
	hasImm bool
	se     bool
	write  bool // WRITE with immediate
	wqe    recvWQE
}

// weakState is a weakly-ordered QP's bookkeeping, both directions.
type weakState struct {
	span    uint32
	reorder int32

	// Requester.
	done     *holes.Tracker // PSNs acknowledged or answered; Base is una
	meta     []psnMeta      // by PSN & (span-1)
	txSeq    uint32         // transmissions so far
	inflight uint32         // PSNs sent and not yet acknowledged or answered
	cap      uint32         // most PSNs in flight (the device's window)
	ackedSeq uint32         // highest transmission number found acknowledged or answered
	lost     []wire.PSN     // PSNs to retransmit (entries whose meta is no longer queued are stale)
	backoff  uint8          // retransmission timer doublings since the last progress
	probeAt  int64          // loss probe deadline (0: not armed)
	probeBo  uint8          // loss probe doublings since the last progress
	probe    int64          // minimum loss probe interval
	srtt     int64          // smoothed round trip (ns), from first transmissions only
	rttvar   int64
	sample   int64 // round trip measured by the packet being processed (0: none)
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

	// Responder.
	arrived *holes.Tracker // request PSNs arrived; Base is the expected PSN
	highTx  uint32         // highest transmission number received (echoed in SACKs)
	msgs    []weakMsg      // by receive sequence number & (span-1)
	rsnBase wire.PSN       // receive sequence number of the next receive WQE to consume
	inMsgs  uint32         // messages with a receive WQE in progress (not all packets placed)
	inSegs  uint32         // their packets placed

	items  []holes.Item  // scratch
	ranges [][2]wire.PSN // scratch
}

func newWeakState(q *QP, span uint32, epsn wire.PSN) *weakState {
	ws := &weakState{
		cap:     uint32(q.dev.cfg.Window),
		reorder: int32(q.dev.cfg.ReorderThreshold),
		probe:   int64(q.dev.cfg.LossProbe),
		arrived: holes.New(epsn, span),
		done:    holes.New(0, span),
	}
	ws.span = ws.arrived.Span()
	ws.meta = make([]psnMeta, ws.span)
	ws.msgs = make([]weakMsg, ws.span)
	return ws
}

// readSeqOK reports whether read sequence number seq may be sent: it lies within max of
// the oldest one not complete.
func (ws *weakState) readSeqOK(seq wire.PSN, max uint8) bool {
	return seq.Diff(ws.rdBase) < int32(max)
}

// readSeqDone records that read sequence number seq completed.
func (ws *weakState) readSeqDone(seq wire.PSN) {
	if d := seq.Diff(ws.rdBase); d < 0 || d >= int32(len(ws.rdDone)) {
		return
	}
	ws.rdDone[uint32(seq)%uint32(len(ws.rdDone))] = true
	for ws.rdDone[uint32(ws.rdBase)%uint32(len(ws.rdDone))] {
		ws.rdDone[uint32(ws.rdBase)%uint32(len(ws.rdDone))] = false
		ws.rdBase = ws.rdBase.Add(1)
	}
}

// inProgress returns the messages in progress and their packets placed.
func (ws *weakState) inProgress() (uint32, uint32) { return ws.inMsgs, ws.inSegs }

// startRequester sets the first PSN the requester sends.
func (ws *weakState) startRequester(psn wire.PSN) { ws.done.Reset(psn) }

func (ws *weakState) m(psn wire.PSN) *psnMeta { return &ws.meta[uint32(psn)&(ws.span-1)] }

// wqeAt returns the WQE whose index has low bits idx (it lies between tail and started).
func (q *QP) wqeAt(idx uint32) *sendWQE {
	full := q.sqTail + uint64(idx-uint32(q.sqTail))
	return &q.sq[full%uint64(len(q.sq))]
}

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
func (ws *weakState) sent(idx uint64, w *sendWQE, psn, next wire.PSN, now int64) {
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
	q.dev.timers.arm(q, ws.probeAt)
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
		w := q.wqeAt(m.wqe)
		end := p
		if w.op == WRRead {
			ce := q.readChunkEnd(w, p)
			for end != ce {
				n := end.Add(1)
				if ws.done.Has(n) {
					break
				}
				end = n
			}
		}
		idx := m.wqe
		q.buildRequest(b, w, p, end, true)
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
	w := q.wqeAt(m.wqe)
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
		if q.sqTail == q.sqStarted || uint32(q.sqTail) != it.Ref {
			break // cannot happen: items come in work request order
		}
		q.completeSend(&q.sq[q.sqTail%uint64(len(q.sq))])
	}
	r.una = ws.done.Base()
	if progress {
		ws.rtt()
		r.retryLeft = q.attr.RetryCnt
		r.rnrLeft = q.attr.RNRRetry
		ws.backoff, ws.probeBo = 0, 0
		q.restartRTO()
		q.detectLoss()
		ws.probeAt = 0
		q.armProbe(now)
	}
	q.dev.queueKick(q)
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
		q.startRNRWait(p.BTH.PSN.Add(1), syn)
	case wire.AETHNak:
		q.stats.NAKsRecv++
		q.doneAdvance(progress, now)
		q.fatalNAK(wire.AETHValue(syn))
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
	w := q.wqeAt(m.wqe)
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
	ce := q.readChunkEnd(w, psn)
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
	w := q.wqeAt(ws.m(psn).wqe)
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

// weakTimeout handles the retransmission timer: every missing PSN goes again, and the timer
// doubles (up to 64 times) until something is acknowledged.
func (q *QP) weakTimeout() {
	ws := q.weak
	q.queueMissing(q.req.una)
	if ws.backoff < 6 {
		ws.backoff++
	}
}

// Responder.

// weakRequest runs the weakly-ordered responder for one request packet.
func (q *QP) weakRequest(p *wire.Packet) {
	ws, rs := q.weak, &q.resp
	f := p.Info.Flags
	ooh, err := wire.DecodeOOH(p.Ext)
	if err != nil {
		q.stats.Dropped++
		return
	}
	if int32(ooh.TxSeq-ws.highTx) > 0 {
		ws.highTx = ooh.TxSeq
	}
	switch {
	case f&wire.IsRead != 0:
		q.weakRead(p, &ooh)
	case f&wire.IsAtomic != 0:
		q.weakAtomicReq(p, &ooh)
	default:
		q.weakData(p, &ooh)
	}
	if q.state == StateErr {
		return
	}
	if p.BTH.AckReq || ws.arrived.NumHoles() > 0 {
		rs.ackPending = true
	}
	ws.items = ws.arrived.Advance(ws.items[:0])
	for _, it := range ws.items {
		q.weakDeliver(it)
		if q.state == StateErr {
			return // refused: nothing behind it is delivered into the flushed queues
		}
	}
	rs.epsn = ws.arrived.Base()
	q.requestAck(p)
}

// weakMark records the arrival of [psn, psn+n); it returns false (after acknowledging a
// duplicate, or dropping a packet past the span) if the packet is not new.
func (q *QP) weakMark(psn wire.PSN, n uint32) bool {
	ws := q.weak
	if n > 0 && ws.arrived.HasRange(psn, n) {
		q.stats.Duplicates++
		q.resp.ackPending = true
		return false
	}
	// Anything not inside [base, base+span) — including PSNs so far ahead that the 24-bit
	// difference wraps negative — is beyond the span: dropped without touching memory.
	if d := psn.Diff(ws.arrived.Base()); d < 0 || int64(d)+int64(n) > int64(ws.span) {
		q.stats.BeyondSpan++
		return false
	}
	return true
}

// weakArrived records that [psn, psn+n), checked by weakMark, was placed or accepted.
func (q *QP) weakArrived(psn wire.PSN, n uint32) {
	ws := q.weak
	if psn != ws.arrived.Base() {
		q.stats.PlacedOutOfOrder++
	}
	ws.arrived.Mark(psn, n)
}

// weakData places a SEND or WRITE packet.
func (q *QP) weakData(p *wire.Packet, o *wire.OOH) {
	ws := q.weak
	f := p.Info.Flags
	psn := p.BTH.PSN
	l := uint64(len(p.Payload))
	// The PSN first: a packet outside the window (a duplicate, or beyond the span) is
	// acknowledged or dropped before any check that could end the connection.
	if !q.weakMark(psn, 1) {
		return
	}
	npk := packetsFor(o.Length, q.mtu)
	inside := o.Offset < o.Length || o.Length == 0 && o.Offset == 0
	if o.Length > MaxMessage || !inside || o.Offset%q.mtu != 0 || l != min(uint64(q.mtu), uint64(o.Length-o.Offset)) {
		q.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorLength, "packet payload does not match its offset and message length")
		return
	}
	recv := f&wire.IsSend != 0 || o.Flags&wire.OOHRecv != 0
	first := psn.Add(^(o.Offset / q.mtu) + 1) // the message's first PSN, as this packet says
	if q.lq != nil {
		var add [NumLimits]uint32
		if recv {
			got := uint32(0) // packets of the message already here
			if m := &ws.msgs[uint32(o.Seq)&(ws.span-1)]; !m.valid || m.rsn != o.Seq {
				add[LimitInOrderMsgs] = 1
				if q.srq {
					add[LimitSRQHeld] = 1
				}
			} else {
				got = m.got
			}
			add[LimitInOrderSegs] = 1
			if got+1 == npk && psn != ws.arrived.Base() {
				// The packet completes its message behind a hole: one more message held
				// out of order until the hole closes.
				add[LimitOOOMsgs] = 1
			}
		}
		if psn != ws.arrived.Base() {
			add[LimitOOOSegs] = 1
		}
		if d := (psn.Add(1)).Diff(ws.arrived.High()); d > 0 {
			add[LimitHoleSpan] = uint32(d)
		}
		if !q.admit(psn, &add, recv) {
			return
		}
	}
	var msg *weakMsg
	if recv {
		msg = &ws.msgs[uint32(o.Seq)&(ws.span-1)]
		if !msg.valid || msg.rsn != o.Seq {
			// The first packet of this message to arrive binds its receive WQE: the one
			// at its receive sequence number, so WQEs complete in posting order.
			// On a shared receive queue other QPs take WQEs too: this message takes the
			// next one now (completions still come in sequence order).
			k := uint32(o.Seq.Diff(ws.rsnBase))
			bound := false
			switch {
			case o.Seq.Diff(ws.rsnBase) < 0 || k >= ws.span:
			case q.srq:
				if bound = q.rq.pop(&msg.wqe); bound {
					q.srqTaken++
				}
			default:
				bound = q.rq.peek(int(k), &msg.wqe)
			}
			if !bound {
				q.sendRNR(psn)
				return
			}
			if msg.wqe.verr != 0 {
				q.respFatal(wire.NakRemoteOpError, StatusLocProtErr, msg.wqe.verr, "receive WQE has an invalid local key")
				return
			}
			msg.valid, msg.rsn, msg.first, msg.npk, msg.got, msg.length = true, o.Seq, first, npk, 0, o.Length
			msg.hasImm, msg.se, msg.write = false, false, f&wire.IsWrite != 0
			ws.inMsgs++
		}
		if msg.length != o.Length || msg.first != first {
			q.stats.Dropped++ // its packets disagree about the message
			return
		}
		if f&wire.IsSend != 0 && uint64(o.Length) > msg.wqe.length {
			q.weakRecvFatal(msg, wire.NakInvalidRequest, StatusLocLenErr, VendorLength, "message longer than the receive buffer")
			return
		}
	}
	if f&wire.IsWrite != 0 {
		mem, _, ok := q.remoteMem(tpt.RemoteWrite, p.RETH.RKey, p.RETH.VA, l, "RDMA WRITE")
		if !ok {
			return
		}
		copy(mem, p.Payload)
	} else {
		if msg.wqe.revoked() {
			q.weakRecvFatal(msg, wire.NakRemoteOpError, StatusLocProtErr, VendorRevoked, "receive buffer deregistered during the message")
			return
		}
		scatter(msg.wqe.segs, uint64(o.Offset), p.Payload)
	}
	q.weakArrived(psn, 1)
	if msg == nil {
		return
	}
	if f&wire.HasImmDt != 0 {
		msg.imm, msg.hasImm = p.Imm, true
	}
	if p.BTH.SE {
		msg.se = true
	}
	ws.inSegs++
	if msg.got++; msg.got == msg.npk {
		ws.inMsgs--
		ws.inSegs -= msg.npk
		ws.arrived.Hold(holes.Item{PSN: first.Add(npk - 1), Kind: kindRecv, Ref: uint32(msg.rsn)})
	}
}

// weakRecvFatal fails the QP because of a message that bound a receive WQE. The WQE
// completes with status if it is the next to complete; otherwise it is flushed with the
// rest (an asynchronous event reports the error).
func (q *QP) weakRecvFatal(msg *weakMsg, nak, status uint8, verr uint32, why string) {
	rs := &q.resp
	switch {
	case q.srq: // taken from the SRQ already
		rs.rwqe.wrID, rs.haveRWQE = msg.wqe.wrID, true
	case msg.rsn == q.weak.rsnBase:
		rs.rwqe.segs = rs.rwqe.segs[:0]
		if q.rq.pop(&rs.rwqe) {
			rs.haveRWQE = true
		}
	}
	msg.valid = false
	q.respFatal(nak, status, verr, why)
}

// weakRead prepares a READ request: checked now, answered when every request before it
// has arrived (its doorbell rings when the hole before it closes).
func (q *QP) weakRead(p *wire.Packet, o *wire.OOH) {
	ws, rs := q.weak, &q.resp
	psn := p.BTH.PSN
	reth := &p.RETH
	npk := packetsFor(reth.DMALen, q.mtu)
	if reth.DMALen > MaxMessage {
		// Checked after the PSN: a duplicate or a packet beyond the span is only that.
		if q.weakMark(psn, 1) {
			q.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorLength, "RDMA READ longer than 2^31 bytes")
		}
		return
	}
	// The PSN first: a duplicate is answered, a packet beyond the span dropped, before
	// any check that can end the connection.
	if ws.arrived.HasRange(psn, npk) {
		// A re-request of responses that were lost: answer it from the resource.
		q.stats.Duplicates++
		if len(rs.res) == 0 {
			return
		}
		slot := int(uint32(o.Seq) % uint32(len(rs.res)))
		r := &rs.res[slot]
		if r.kind == resRead && !r.held && !psn.Before(r.firstPSN) && !r.lastPSN.Before(psn.Add(npk-1)) {
			r.start, r.next, r.stop = psn, psn, psn.Add(npk-1)
			q.queueResource(slot)
		}
		return
	}
	if !q.weakMark(psn, npk) {
		return
	}
	slot, ok := q.weakSlot(o, "RDMA READ")
	if !ok {
		return
	}
	mem, reg, ok := q.remoteMem(tpt.RemoteRead, reth.RKey, reth.VA, uint64(reth.DMALen), "RDMA READ")
	if !ok {
		return
	}
	last := psn.Add(npk - 1)
	q.unqueueResource(slot)
	rs.res[slot] = respResource{kind: resRead, held: true, firstPSN: psn, lastPSN: last, start: psn, next: psn, stop: last, mem: mem, reg: reg}
	q.weakArrived(psn, npk)
	ws.arrived.Hold(holes.Item{PSN: last, Kind: kindReadReq, Ref: uint32(slot)})
}

// weakSlot returns the responder resource slot of a new READ or atomic request (its read
// sequence number modulo max_dest_rd_atomic), or ends the connection if the request is
// one the QP cannot hold.
func (q *QP) weakSlot(o *wire.OOH, what string) (int, bool) {
	rs := &q.resp
	if len(rs.res) == 0 {
		q.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorNone, what+" with max_dest_rd_atomic 0")
		return 0, false
	}
	slot := int(uint32(o.Seq) % uint32(len(rs.res)))
	if rs.res[slot].held {
		q.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorNone, "more RDMA READ and atomic requests outstanding than max_dest_rd_atomic")
		return 0, false
	}
	return slot, true
}

// weakAtomicReq checks an atomic now and executes it when every request before it has
// arrived.
func (q *QP) weakAtomicReq(p *wire.Packet, o *wire.OOH) {
	ws, rs := q.weak, &q.resp
	psn := p.BTH.PSN
	if ws.arrived.Has(psn) { // the PSN first, as for READ
		q.stats.Duplicates++
		if len(rs.res) == 0 {
			return
		}
		slot := int(uint32(o.Seq) % uint32(len(rs.res)))
		r := &rs.res[slot]
		if r.kind == resAtomic && !r.held && r.firstPSN == psn {
			r.start, r.next, r.stop = psn, psn, psn
			q.queueResource(slot) // the recorded result again; never executed twice
		}
		return
	}
	if !q.weakMark(psn, 1) {
		return
	}
	slot, ok := q.weakSlot(o, "atomic")
	if !ok {
		return
	}
	at := &p.Atomic
	mem, reg, ok := q.remoteMem(tpt.RemoteAtomic, at.RKey, at.VA, 8, "atomics")
	if !ok {
		return
	}
	if at.VA%8 != 0 {
		q.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorBounds, "atomic target not 8-byte aligned")
		return
	}
	q.unqueueResource(slot)
	rs.res[slot] = respResource{kind: resAtomic, held: true, firstPSN: psn, lastPSN: psn, start: psn, next: psn, stop: psn,
		mem: mem, reg: reg, swapAdd: at.SwapAdd, compare: at.Compare, fetchAdd: p.BTH.Opcode == wire.OpWeakFetchAdd}
	q.weakArrived(psn, 1)
	ws.arrived.Hold(holes.Item{PSN: psn, Kind: kindAtomic, Ref: uint32(slot)})
}

// weakDeliver acts on an item whose hole closed: a receive completion is posted, a READ's
// doorbell rings, an atomic is executed.
func (q *QP) weakDeliver(it holes.Item) {
	ws, rs := q.weak, &q.resp
	switch it.Kind {
	case kindRecv:
		msg := &ws.msgs[it.Ref&(ws.span-1)]
		if msg.rsn != ws.rsnBase {
			// Messages that consume receive WQEs must number them in PSN order.
			q.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorOpcodeOrder, "receive sequence numbers out of order")
			return
		}
		if !q.srq {
			var w recvWQE
			w.segs, w.regs = msg.wqe.segs[:0], msg.wqe.regs[:0]
			q.rq.pop(&w) // the WQE msg bound: receive WQEs complete in sequence order
		}
		e := CQE{WRID: msg.wqe.wrID, QPN: q.qpn, SrcQP: q.attr.DestQPN, ByteLen: msg.length, Opcode: WCRecv, solicited: msg.se, srq: q.srq}
		if msg.write {
			e.Opcode = WCRecvRDMAImm
		}
		if msg.hasImm {
			e.Imm, e.Flags = msg.imm, WCFlagWithImm
		}
		msg.valid = false
		ws.rsnBase = ws.rsnBase.Add(1)
		rs.msn = (rs.msn + 1) & wire.PSNMask
		q.recvCQ.push(&e)
	case kindReadReq:
		rs.res[it.Ref].held = false
		rs.msn = (rs.msn + 1) & wire.PSNMask
		q.queueResource(int(it.Ref))
	case kindAtomic:
		r := &rs.res[it.Ref]
		if r.kind != resAtomic || len(r.mem) < 8 {
			// Cannot happen while held slots are never reused; never run an atomic on
			// anything but its own 8 bytes.
			q.respFatal(wire.NakInvalidRequest, StatusRemInvReqErr, VendorNone, "atomic resource lost")
			return
		}
		if r.reg.Revoked() {
			q.revoked(r.firstPSN, "atomic target deregistered before the atomic executed")
			return
		}
		orig := q.dev.executeAtomic(r.mem, r.fetchAdd, r.swapAdd, r.compare)
		r.orig, r.held, r.mem, r.reg = orig, false, nil, nil
		rs.msn = (rs.msn + 1) & wire.PSNMask
		q.queueResource(int(it.Ref))
	}
}

// sendSACK builds the selective acknowledgement: every PSN before the first hole, and the
// runs received beyond.
func (q *QP) sendSACK(b *netio.SendBatch, syn uint8, psn wire.PSN) {
	ws := q.weak
	ws.ranges = ws.arrived.Received(ws.ranges[:0], wire.MaxSACKRanges)
	hdr := b.Alloc(wire.BTHLen + wire.AETHLen + wire.SACKHeaderLen)
	bth := wire.BTH{Opcode: wire.OpWeakAck, PKey: wire.DefaultPKey, DestQP: q.attr.DestQPN, PSN: psn}
	bth.Put(hdr)
	aeth := wire.AETH{Syndrome: syn, MSN: q.resp.msn}
	aeth.Put(hdr[wire.BTHLen:])
	wire.PutSACKHeader(hdr[wire.BTHLen+wire.AETHLen:], len(ws.ranges), ws.highTx)
	pay := b.Alloc(len(ws.ranges) * wire.SACKRangeLen)
	wire.PutSACKRanges(pay, ws.ranges)
	q.emit(b, hdr, [][]byte{pay}, len(pay))
	q.stats.SACKsSent++
}

// flushTaken completes, with WR_FLUSH_ERR, receive WQEs that messages in progress took
// from a shared receive queue (the QP is entering ERR).
func (q *QP) flushTaken() {
	ws := q.weak
	for i := range ws.msgs {
		if m := &ws.msgs[i]; m.valid {
			q.recvCQ.push(&CQE{WRID: m.wqe.wrID, QPN: q.qpn, Status: StatusWRFlushErr, Opcode: WCRecv, srq: true})
			m.valid = false
		}
	}
}

// Holes reports a weakly-ordered QP's open holes: in the request PSNs it receives, with
// what completed beyond each, and in the PSNs of its own requests not yet acknowledged or
// answered. Both are empty in ordered mode.
type Holes struct {
	Responder []holes.Hole // counts by kind: 0 receive completions, 1 READ requests held, 2 atomics held
	Requester []holes.Hole // counts by kind: 0 SEND/WRITE acknowledged, 1 READ answered, 2 atomics answered
}

// Holes returns the QP's open holes.
func (q *QP) Holes() Holes {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.weak == nil {
		return Holes{}
	}
	return Holes{Responder: q.weak.arrived.Holes(nil), Requester: q.weak.done.Holes(nil)}
}
