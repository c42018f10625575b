package transport

import "github.com/softrnic/softrnic/internal/wire"

// completer is the QP's role that handles what comes back for its requests: ACKs, NAKs,
// READ responses and atomic ACKs, as its ordering mode reads them (order:
// orderedCompleter or weakCompleter), completing send WQEs in order. It decides when to
// try again and when to give up, and owns the retry budgets for that; it moves the
// requester's PSN window (requester.una) and retires WQEs from the send queue.
type completer struct {
	q     *QP
	order responseOrder
	// The retry budgets, whole again whenever the peer acknowledges something new (refill):
	// for local ACK timeouts and repeated sequence NAKs (retry_cnt), and for RNR NAKs
	// (rnr_retry; 7 retries forever).
	retryLeft uint8
	rnrLeft   uint8
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
	r.recover.resend(r.una, true)
	r.rtoAt = 0
	return true
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
