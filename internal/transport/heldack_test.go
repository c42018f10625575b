package transport

import (
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
)

// TestHeldAckSentOnTeardown: an ACK held back to ride along with the consumer's next send
// (a SEND received while a consumer polls) goes out when the QP is destroyed, the device
// closed, or the QP moved to ERR or RESET, right after the receive completed and before
// the next send. Dropped, it left the peer's last SEND unacknowledged: ibv_rc_pingpong's
// server (Linux rxe) ended in "transport retry counter exceeded" when a softrnic client
// destroyed its QP as soon as the server's last SEND arrived, and a connection manager's
// disconnect moves the QP to ERR just as soon. (On the rig, whose clock stands still, the
// ACK's own deadline never passes: only the teardown can send it.)
func TestHeldAckSentOnTeardown(t *testing.T) {
	for _, c := range []struct {
		name     string
		teardown func(rg *qpRig) error
	}{
		{"DestroyQP", func(rg *qpRig) error { rg.qp.Destroy(); return nil }},
		{"Close", func(rg *qpRig) error { return rg.d.Close() }},
		{"ModifyToErr", func(rg *qpRig) error { return rg.qp.Modify(&Attr{State: StateErr}, MaskState, DeviceCaps{}) }},
		{"ModifyToReset", func(rg *qpRig) error { return rg.qp.Modify(&Attr{State: StateReset}, MaskState, DeviceCaps{}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			rg := newQPRig(t, newRigConfig(Ordered))
			_, mb := rg.mem(64)
			rg.postRecv(1, sge(mb, 0, 64))
			rg.deliverPolling(rigPkt{Op: wire.OpSendOnly, PSN: 0x200, AckReq: true, Payload: []byte("last")})
			if !rg.qp.resp.ackDeferred || !rg.qp.resp.ackPending {
				t.Fatal("the SEND's ACK was not held back: the test does not test the teardown")
			}
			if c := wantCQE(t, polled(rg.rcq), 1, StatusSuccess, WCRecv); c.ByteLen != 4 {
				t.Fatalf("receive completion %+v", c)
			}
			if p := rg.sent(); len(p) != 0 {
				t.Fatalf("sent before the teardown: %v", p)
			}
			must(t, c.teardown(rg))
			wantAck(t, rg.sent(), ackSyn, 0x200)
		})
	}
}
