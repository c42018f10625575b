package transport

import (
	"encoding/binary"

	"github.com/softrnic/softrnic/internal/wire"
)

// completer is the QP's role that handles what comes back for its requests: ACKs, NAKs
// (go-back or fail), READ responses and atomic ACKs, and completes send WQEs in order. It
// decides when to try again and when to give up, and owns the retry budgets for that; it
// moves the requester's PSN window (requester.una) and retires WQEs from the send queue.
type completer struct {
	q *QP
	// The retry budgets, whole again whenever the peer acknowledges something new (refill):
	// for local ACK timeouts and repeated sequence NAKs (retry_cnt), and for RNR NAKs
	// (rnr_retry; 7 retries forever).
	retryLeft uint8
	rnrLeft   uint8
	// The last sequence NAK, to tell a repeated one without progress (which uses a retry).
	lastNakPSN wire.PSN
	nakRepeat  bool
}

// refill makes the retry budgets whole: the peer acknowledged something new.
func (c *completer) refill() {
	c.retryLeft = c.q.attr.RetryCnt
	c.rnrLeft = c.q.attr.RNRRetry
}

// timeout handles the local ACK timeout, fired with requests outstanding: it uses a retry
// (or fails the QP with RETRY_EXC_ERR when none is left) and has the requester send again
// what was not acknowledged. It reports whether the requester has packets to send.
func (c *completer) timeout() bool {
	q := c.q
	r := &q.req
	q.stats.Timeouts++
	if c.retryLeft == 0 {
		q.errorState(StatusRetryExcErr, VendorRetryTimer)
		return false
	}
	c.retryLeft--
	q.mode.resend(q, r.una, true)
	r.rtoAt = 0
	return true
}

// handleResponse processes an ACK, NAK, READ response or atomic ACK (q.mu and rxMu held).
func (c *completer) handleResponse(p *wire.Packet) {
	q := c.q
	r := &q.req
	psn := p.BTH.PSN
	// A response can only be for a PSN that was sent.
	if !psn.Before(r.highPSN) {
		q.stats.Dropped++
		return
	}
	q.mode.response(q, p)
}

// orderedResponse is the ordered completer's dispatch.
func (c *completer) orderedResponse(p *wire.Packet) {
	q := c.q
	switch p.BTH.Opcode {
	case wire.OpAcknowledge:
		c.handleAck(p)
	case wire.OpAtomicAcknowledge:
		c.handleAtomicAck(p)
	case wire.OpWeakAck:
		q.stats.WrongMode++
	default:
		c.handleReadResponse(p)
	}
}

func (c *completer) handleAck(p *wire.Packet) {
	q := c.q
	r := &q.req
	psn := p.BTH.PSN
	syn := p.AETH.Syndrome
	if psn.Before(r.una) {
		q.stats.Duplicates++ // an old or repeated acknowledgement
		return
	}
	switch wire.AETHKind(syn) {
	case wire.AETHAck:
		c.ackUpTo(psn)
	case wire.AETHRNR:
		q.stats.RNRNAKsRecv++
		c.ackUpTo(psn.Add(wire.PSNMask))
		if q.state != StateRTS && q.state != StateSQD {
			return
		}
		c.startRNRWait(r.una, syn) // psn, unless READ responses before it are missing
	case wire.AETHNak:
		q.stats.NAKsRecv++
		c.ackUpTo(psn.Add(wire.PSNMask))
		if q.state != StateRTS && q.state != StateSQD {
			return
		}
		code := wire.AETHValue(syn)
		if code == wire.NakPSNSeqError {
			// Go back to psn. A NAK for the same PSN again without progress uses a retry.
			if c.nakRepeat && c.lastNakPSN == psn {
				if c.retryLeft == 0 {
					q.errorState(StatusRetryExcErr, VendorRetryTimer)
					return
				}
				c.retryLeft--
			}
			c.nakRepeat, c.lastNakPSN = true, psn
			r.closeWindow()
			q.req.rewind(r.una) // psn, unless READ responses before it are missing
			q.home.queueKick(q)
			return
		}
		c.fatalNAK(code)
	default:
		q.stats.Dropped++
	}
}

// fatalNAK fails the QP for a NAK other than a PSN sequence error, in either mode: the
// status says which (invalid request, remote access or remote operational error) and the
// vendor error carries the NAK code.
func (c *completer) fatalNAK(code uint8) {
	q := c.q
	st := StatusRemOpErr
	switch code {
	case wire.NakInvalidRequest, wire.NakInvalidRDRequest:
		st = StatusRemInvReqErr
	case wire.NakRemoteAccessError:
		st = StatusRemAccessErr
	}
	q.errorState(st, VendorRemoteNAK|uint32(code))
}

// ackUpTo processes an acknowledgement of every PSN up to and including psn: SEND and
// WRITE WQEs it covers complete. READ and atomic WQEs complete only through their
// responses: an acknowledgement that reaches into one (an ACK of a later request, or a NAK
// whose PSN lies inside a READ sent as several requests) means responses before it were
// lost, so the requester goes back to the first missing one instead of moving past it.
func (c *completer) ackUpTo(psn wire.PSN) {
	q := c.q
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
			c.goBackOnce()
			break
		}
		if psn.Before(w.lastPSN()) {
			r.una = psn.Add(1)
			break
		}
		c.completeSend(w)
		if !q.sq.inFlight() {
			r.una = psn.Add(1)
		}
	}
	if r.una != old {
		c.progress()
	}
}

// progress resets the retry budget and the ACK timer after the peer acknowledged something.
func (c *completer) progress() {
	q := c.q
	r := &q.req
	c.refill()
	r.rewound = false
	c.nakRepeat = false
	if r.curPSN.Before(r.una) && !q.sq.fresh() {
		// Acknowledged beyond what is being resent: skip ahead.
		q.req.rewind(r.una)
	}
	q.req.restartRTO()
	q.home.queueKick(q)
}

// completeSend retires the WQE at the tail successfully.
func (c *completer) completeSend(w *sendWQE) {
	q := c.q
	if w.signaled {
		e := CQE{WRID: w.wrID, QPN: q.qpn, Opcode: wcOpcode(w.op), ByteLen: w.length}
		q.sendCQ.push(&e)
	}
	clear(w.segs)
	q.sq.retire()
	if q.state == StateSQD {
		c.checkDrained()
	}
}

// checkDrained raises SQ_DRAINED once an SQD QP has nothing outstanding.
func (c *completer) checkDrained() {
	q := c.q
	if !q.sq.inFlight() && q.sqdNotify {
		q.sqdNotify = false
		q.dev.raise(Event{Type: EventSQDrained, QP: q, Detail: "send queue drained"})
	}
}

// goBackOnce makes the requester resend from una, unless it already went back there and
// has made no progress since (later packets of the same loss must not restart it again).
func (c *completer) goBackOnce() {
	q := c.q
	r := &q.req
	if !(r.rewound && r.rewindPSN == r.una) {
		r.closeWindow()
		q.req.rewind(r.una)
		q.home.queueKick(q)
	}
}

// expectedResponse returns the WQE at the tail if psn is the response the requester waits
// for next. Otherwise it counts the packet (an old duplicate, or one past a loss, which
// sends the requester back) and returns nil.
func (c *completer) expectedResponse(psn wire.PSN) *sendWQE {
	q := c.q
	r := &q.req
	switch {
	case psn.Before(r.una):
		q.stats.Duplicates++
	case psn != r.una:
		q.stats.OutOfSequence++
		c.goBackOnce()
	case !q.sq.inFlight():
		q.stats.Dropped++
	default:
		return q.sq.oldest()
	}
	return nil
}

func (c *completer) handleReadResponse(p *wire.Packet) {
	q := c.q
	r := &q.req
	psn := p.BTH.PSN
	w := c.expectedResponse(psn)
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
		c.completeSend(w)
	}
	c.progress()
}

func (c *completer) handleAtomicAck(p *wire.Packet) {
	q := c.q
	r := &q.req
	psn := p.BTH.PSN
	w := c.expectedResponse(psn)
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
	c.completeSend(w)
	c.progress()
}
