package transport

import "github.com/softrnic/softrnic/internal/wire"

// RNR (receiver not ready) flow control, the same in both modes, in one place: the
// responder refuses a packet for lack of a receive WQE with an RNR NAK (sendRNR,
// sendRNRTimer); the completer, on receiving one, starts the wait its timer asks for
// (startRNRWait), using one RNR retry (rnr_retry 7 retries forever); when the QP's timer
// finds the wait over, the requester sends again from the refused PSN (endRNRWait).

// sendRNR refuses the packet at psn for lack of a receive WQE.
func (rs *responder) sendRNR(psn wire.PSN) {
	rs.sendRNRTimer(psn, rs.q.attr.MinRNRTimer)
}

// sendRNRTimer refuses the packet at psn with an RNR NAK asking the requester to wait the
// timer with the given code.
func (rs *responder) sendRNRTimer(psn wire.PSN, code uint8) {
	rs.nakSent = true // later packets of the burst are dropped quietly
	rs.sendNak(wire.AETHRNR|code&0x1F, psn)
}

// startRNRWait handles an RNR NAK (syndrome syn) in either mode: it uses an RNR retry (or fails
// the QP with RNR_RETRY_EXC_ERR when none is left; rnr_retry 7 is infinite) and waits the
// timer the NAK asks for before sending again from psn.
func (c *completer) startRNRWait(psn wire.PSN, syn uint8) {
	q := c.q
	r := &q.req
	if c.rnrLeft == 0 {
		q.errorState(StatusRNRRetryExcErr, VendorRNRTimer)
		return
	}
	if c.rnrLeft != 7 {
		c.rnrLeft--
	}
	r.rnrWait, r.rnrPSN = true, psn
	r.rnrUntil = q.dev.now() + int64(wire.RNRTimer(wire.AETHValue(syn)))
	r.rtoAt = 0
	q.home.timers.arm(q, r.rnrUntil)
}

// endRNRWait ends the RNR wait if its time has come (now, device time), making the
// requester send again from the refused PSN; it re-arms the QP's timer otherwise. It
// reports whether the requester has packets to send.
func (r *requester) endRNRWait(now int64) bool {
	q := r.q
	if now < r.rnrUntil {
		q.home.timers.arm(q, r.rnrUntil)
		return false
	}
	r.rnrWait = false
	r.recover.resend(r.rnrPSN, false)
	r.rtoAt = 0
	return true
}
