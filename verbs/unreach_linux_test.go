package verbs_test

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// TestPeerPortClosed: the peer device is closed, its port with it, and Linux answers the
// QP's requests with ICMP port unreachable: the oldest WR completes with
// IBV_WC_RETRY_EXC_ERR (VendorUnreachable) and the others flush, as when the retries run
// out, but with no local ACK timeout spent (the link's ACK timeout is 4.3 s, 7 retries).
func TestPeerPortClosed(t *testing.T) { forEachOrdering(t, testPeerPortClosed) }

func testPeerPortClosed(t *testing.T, mode verbs.Ordering) {
	l := defaultLink()
	l.Timeout, l.RetryCnt = 20, 7
	a, b := newPair(t, pairConfig{Link: l.InMode(mode)})
	local := mustReg(t, a.pd, pattern(8192, 50), verbs.AccessLocalWrite)
	if err := b.ctx.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	mustPostSend(t, a.qp,
		verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(local, 0, 3000)},
		verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(local, 0, 10)})
	wc := pollOne(t, a.scq)
	t.Logf("error completion %v after %v", wc.VendorErr, time.Since(start))
	wantStatus(t, wc, 1, verbs.WCRetryExcErr, a.qp)
	if wc.VendorErr != verbs.VendorUnreachable {
		t.Errorf("vendor error %v, want VendorUnreachable", wc.VendorErr)
	}
	expectFlushed(t, a.scq, a.qp, 2)
	expectState(t, a.qp, verbs.StateErr)
	if k := a.qp.Counters(); k.Timeouts != 0 || k.Retransmits != 0 {
		t.Errorf("%d local ACK timeouts, %d retransmissions; want none", k.Timeouts, k.Retransmits)
	}
}
