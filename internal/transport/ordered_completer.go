package transport

import (
	"encoding/binary"

	"github.com/softrnic/softrnic/internal/wire"
)

// orderedCompleter is the ordered completer: cumulative ACKs complete the SEND and WRITE
// WQEs they cover, READ responses and atomic ACKs must come in PSN order, a sequence NAK
// or a response past a loss sends the requester back (go-back-N), and a sequence NAK
// repeated without progress uses a retry.
type orderedCompleter struct {
	q   *QP
	c   *completer        // the QP's completer: retry budgets, completions, fatal NAKs
	req *orderedRequester // which goes back
	// The last sequence NAK, to tell a repeated one without progress (which uses a retry).
	lastNakPSN wire.PSN
	nakRepeat  bool
}

// response dispatches a response whose PSN was sent.
func (oc *orderedCompleter) response(p *wire.Packet) {
	switch p.BTH.Opcode {
	case wire.OpAcknowledge:
		oc.ack(p)
	case wire.OpAtomicAcknowledge:
		oc.atomicAck(p)
	case wire.OpWeakAck:
		oc.q.stats.WrongMode++
	default:
		oc.readResponse(p)
	}
}

// ack handles an ACK, an RNR NAK (an RNR wait) or a NAK (a sequence error sends the
// requester back; any other fails the QP).
func (oc *orderedCompleter) ack(p *wire.Packet) {
	q := oc.q
	r := &q.req
	psn := p.BTH.PSN
	syn := p.AETH.Syndrome
	if psn.Before(r.una) {
		q.stats.Duplicates++ // an old or repeated acknowledgement
		return
	}
	switch wire.AETHKind(syn) {
	case wire.AETHAck:
		oc.ackUpTo(psn)
	case wire.AETHRNR:
		q.stats.RNRNAKsRecv++
		oc.ackUpTo(psn.Add(wire.PSNMask))
		if q.state != StateRTS && q.state != StateSQD {
			return
		}
		oc.c.startRNRWait(r.una, syn) // psn, unless READ responses before it are missing
	case wire.AETHNak:
		q.stats.NAKsRecv++
		oc.ackUpTo(psn.Add(wire.PSNMask))
		if q.state != StateRTS && q.state != StateSQD {
			return
		}
		code := wire.AETHValue(syn)
		if code == wire.NakPSNSeqError {
			// Go back to psn. A NAK for the same PSN again without progress uses a retry.
			if oc.nakRepeat && oc.lastNakPSN == psn {
				if oc.c.retryLeft == 0 {
					q.errorState(StatusRetryExcErr, VendorRetryTimer)
					return
				}
				oc.c.retryLeft--
			}
			oc.nakRepeat, oc.lastNakPSN = true, psn
			r.closeWindow()
			oc.req.rewind(r.una) // psn, unless READ responses before it are missing
			q.home.queueKick(q)
			return
		}
		oc.c.fatalNAK(code)
	default:
		q.stats.Dropped++
	}
}

// ackUpTo processes an acknowledgement of every PSN up to and including psn: SEND and
// WRITE WQEs it covers complete. READ and atomic WQEs complete only through their
// responses: an acknowledgement that reaches into one (an ACK of a later request, or a NAK
// whose PSN lies inside a READ sent as several requests) means responses before it were
// lost, so the requester goes back to the first missing one instead of moving past it.
func (oc *orderedCompleter) ackUpTo(psn wire.PSN) {
	q := oc.q
	r := &q.req
	if psn.Before(r.una) {
		return
	}
	old := r.una
	for q.sq.inFlight() {
		w := q.sq.oldest()
		if w.isReadOrAtomic() {
			if psn.Before(w.firstPSN) {
				r.una = psn.Add(1)
				break
			}
			if r.una.Before(w.firstPSN) {
				r.una = w.firstPSN
			}
			oc.req.goBackOnce()
			break
		}
		if psn.Before(w.lastPSN()) {
			r.una = psn.Add(1)
			break
		}
		oc.c.completeSend(w)
		if !q.sq.inFlight() {
			r.una = psn.Add(1)
		}
	}
	if r.una != old {
		oc.progress()
	}
}

// progress resets the retry budget and the ACK timer after the peer acknowledged something.
func (oc *orderedCompleter) progress() {
	q := oc.q
	r := &q.req
	oc.c.refill()
	oc.req.rewound = false
	oc.nakRepeat = false
	if r.curPSN.Before(r.una) && !q.sq.fresh() {
		// Acknowledged beyond what is being resent: skip ahead.
		oc.req.rewind(r.una)
	}
	q.req.restartRTO()
	q.home.queueKick(q)
}

// expectedResponse returns the WQE at the tail if psn is the response the requester waits
// for next. Otherwise it counts the packet (an old duplicate, or one past a loss, which
// sends the requester back) and returns nil.
func (oc *orderedCompleter) expectedResponse(psn wire.PSN) *sendWQE {
	q := oc.q
	r := &q.req
	switch {
	case psn.Before(r.una):
		q.stats.Duplicates++
	case psn != r.una:
		q.stats.OutOfSequence++
		oc.req.goBackOnce()
	case !q.sq.inFlight():
		q.stats.Dropped++
	default:
		return q.sq.oldest()
	}
	return nil
}

// readResponse places a READ response, which must be the next PSN expected.
func (oc *orderedCompleter) readResponse(p *wire.Packet) {
	q := oc.q
	r := &q.req
	psn := p.BTH.PSN
	w := oc.expectedResponse(psn)
	if w == nil {
		return
	}
	if w.op != WRRead || psn.Before(w.firstPSN) || w.lastPSN().Before(psn) {
		q.stats.Dropped++
		return
	}
	// LAST or ONLY exactly at the end of a READ request's range, FIRST or MIDDLE before
	// it. (FIRST is not tied to the chunk start: a READ re-requested from the middle of a
	// chunk gets responses that start with FIRST there.)
	idx := uint32(psn.Diff(w.firstPSN))
	last := psn == q.req.readChunkEnd(w, psn)
	isLast := p.BTH.Opcode == wire.OpReadResponseLast || p.BTH.Opcode == wire.OpReadResponseOnly
	off := uint64(idx) * uint64(q.mtu)
	n := min(uint64(q.mtu), uint64(w.length)-min(off, uint64(w.length)))
	if isLast != last || uint64(len(p.Payload)) != n {
		q.stats.Dropped++
		return
	}
	scatter(w.segs, off, p.Payload)
	r.una = psn.Add(1)
	if last {
		r.rdOut--
	}
	if psn == w.lastPSN() {
		oc.c.completeSend(w)
	}
	oc.progress()
}

// atomicAck takes an atomic's original value, which must be the next PSN expected.
func (oc *orderedCompleter) atomicAck(p *wire.Packet) {
	q := oc.q
	r := &q.req
	psn := p.BTH.PSN
	w := oc.expectedResponse(psn)
	if w == nil {
		return
	}
	if (w.op != WRAtomicCmpSwap && w.op != WRAtomicFetch) || w.firstPSN != psn {
		q.stats.Dropped++
		return
	}
	var v [8]byte
	binary.NativeEndian.PutUint64(v[:], p.AtomicAck)
	scatter(w.segs, 0, v[:])
	r.una = psn.Add(1)
	r.rdOut--
	oc.c.completeSend(w)
	oc.progress()
}
