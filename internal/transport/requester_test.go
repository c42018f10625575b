package transport

import (
	"sync/atomic"
	"testing"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// TestOrderedWindow checks the ordered mode's window (requester.openWindow): it starts at
// BaseWindow, opens to the device's most after loss-free stretches (AckReq spaced a
// quarter window apart), and goes back to the start at a loss.
func TestOrderedWindow(t *testing.T) {
	var drop atomic.Bool // drop the next WRITE MIDDLE packet
	a := openSide(t, "127.0.0.1", Config{FaultFilter: func(pkt []byte) netio.Verdict {
		if len(pkt) >= wire.BTHLen && wire.Opcode(pkt[0]) == wire.OpWriteMiddle && drop.CompareAndSwap(true, false) {
			return netio.Verdict{Action: netio.Drop}
		}
		return netio.Verdict{Action: netio.Pass}
	}})
	b := openSide(t, "127.0.0.2", Config{})
	connectMode(t, a, b, wire.MTU1024, 0x100, 0x900, Ordered)
	window := func() (win int32, ackEvery int) {
		a.qp.mu.Lock()
		defer a.qp.mu.Unlock()
		return a.qp.req.win, a.qp.req.ackEvery
	}
	if w, e := window(); w != BaseWindow || e != DefaultAckReqEvery {
		t.Fatalf("a new QP's window %d, AckReq every %d packets; want %d, %d", w, e, BaseWindow, DefaultAckReqEvery)
	}
	if a.d.winMax <= BaseWindow {
		t.Skipf("the socket's receive buffer holds no more than the base window (%d packets)", a.d.winMax)
	}

	// 16,384 packets: the window doubles after 2,048, 4,096 and 8,192 more.
	const n = 8 << 20
	src, dst := make([]byte, n), make([]byte, n)
	ms, md := reg(t, a.d, src), reg(t, b.d, dst)
	write := func(wrid uint64, length uint32) {
		t.Helper()
		_, err := a.qp.PostSend([]SendWR{{WRID: wrid, Opcode: WRWrite, Flags: FlagSignaled, RemoteAddr: md.IOVA(), RKey: md.Key(),
			SG: []SGE{{Addr: ms.IOVA(), Length: length, LKey: ms.Key()}}}})
		must(t, err)
		if c := waitCQE(t, a.cq, 1)[0]; c.Status != StatusSuccess || c.WRID != wrid {
			t.Fatalf("completion %+v, want WRID %d successful", c, wrid)
		}
	}
	write(1, n)
	write(2, n)
	if w, e := window(); w != a.d.winMax || e != int(w)/4 {
		t.Fatalf("after %d packets without a loss: window %d, AckReq every %d packets; want %d, %d", 2*n/1024, w, e, a.d.winMax, a.d.winMax/4)
	}

	// A lost packet: a sequence NAK, go-back-N, and the window back at its start (the
	// 100 packets after it are too few to open it again).
	retransmits := a.qp.Stats().Retransmits
	drop.Store(true)
	write(3, 100<<10)
	if a.qp.Stats().Retransmits == retransmits {
		t.Fatal("no retransmission: the filter dropped nothing")
	}
	if w, e := window(); w != BaseWindow || e != DefaultAckReqEvery {
		t.Fatalf("after a loss: window %d, AckReq every %d packets; want %d, %d", w, e, BaseWindow, DefaultAckReqEvery)
	}
}
