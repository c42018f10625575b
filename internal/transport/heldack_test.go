package transport

import (
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// TestHeldAckSentOnTeardown: an ACK held back to ride along with the consumer's next send
// (a SEND received while a consumer polls) goes out when the QP is destroyed, the device
// closed, or the QP moved to ERR or RESET, right after the receive completed and before
// the next send. Dropped, it left the peer's last SEND unacknowledged: ibv_rc_pingpong's
// server (Linux rxe) ended in "transport retry counter exceeded" when a softrnic client
// destroyed its QP as soon as the server's last SEND arrived, and a connection manager's
// disconnect moves the QP to ERR just as soon.
func TestHeldAckSentOnTeardown(t *testing.T) {
	for _, c := range []struct {
		name     string
		teardown func(b *side) error
	}{
		{"DestroyQP", func(b *side) error { b.qp.Destroy(); return nil }},
		{"Close", func(b *side) error { return b.d.Close() }},
		{"ModifyToErr", func(b *side) error { return b.qp.Modify(&Attr{State: StateErr}, MaskState, DeviceCaps{}) }},
		{"ModifyToReset", func(b *side) error { return b.qp.Modify(&Attr{State: StateReset}, MaskState, DeviceCaps{}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			const psnA = 0x777
			var mu sync.Mutex
			acked := []wire.PSN{}
			mon := func(pkt []byte) netio.Verdict {
				var p wire.Packet
				if p.Decode(pkt) == nil && p.BTH.Opcode == wire.OpAcknowledge {
					mu.Lock()
					acked = append(acked, p.BTH.PSN)
					mu.Unlock()
				}
				return netio.Verdict{Action: netio.Deliver}
			}
			a := openSide(t, "127.0.0.1", Config{})
			b := openSide(t, "127.0.0.2", Config{FaultFilter: mon})
			connectMode(t, a, b, wire.MTU1024, psnA, 0x100, Ordered)
			buf := make([]byte, 64)
			mr := reg(t, b.d, buf)
			_, err := b.qp.PostRecv([]RecvWR{{WRID: 1, SG: []SGE{{Addr: mr.IOVA(), Length: 64, LKey: mr.Key()}}}})
			must(t, err)

			// a's SEND, received by b's receive path as a polling consumer runs it: the
			// ACK is held back.
			fl := wiretest.Flow(a.d.LocalAddr(), b.d.LocalAddr())
			pkt := wiretest.Build(&fl, wire.BTH{Opcode: wire.OpSendOnly, PKey: wire.DefaultPKey, DestQP: b.qp.QPN(),
				PSN: psnA, AckReq: true}, nil, []byte("last"))
			u := b.d.q0()
			u.rxMu.Lock()
			// The ACK is held back out of the timer's reach, so that only the teardown
			// can send it.
			b.d.ackDelay.Store(int64(time.Hour))
			u.polling = true
			u.input(pkt, a.d.LocalAddr())
			u.finishBatch()
			u.polling = false
			u.rxMu.Unlock()
			b.qp.mu.Lock()
			held := b.qp.resp.ackDeferred && b.qp.resp.ackPending
			b.qp.mu.Unlock()
			if !held {
				t.Fatal("the SEND's ACK was not held back: the test does not test the teardown")
			}
			if wc := waitCQE(t, b.cq, 1); wc[0].Status != StatusSuccess || wc[0].ByteLen != 4 {
				t.Fatalf("receive completion %+v", wc[0])
			}
			mu.Lock()
			if len(acked) != 0 {
				t.Fatalf("ACKs sent before the teardown: %v", acked)
			}
			mu.Unlock()

			must(t, c.teardown(b))
			mu.Lock()
			defer mu.Unlock()
			if len(acked) != 1 || acked[0] != psnA {
				t.Fatalf("ACKs sent at %s: %v, want one for PSN %#x", c.name, acked, psnA)
			}
		})
	}
}
