package transport

import (
	"sync/atomic"
	"testing"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// TestWindow checks a QP's window (requester.openWindow), in both modes: it starts at
// BaseWindow, opens to the device's most after loss-free stretches (AckReq spaced a
// quarter window apart), and goes back to the start at a loss.
func TestWindow(t *testing.T) {
	for _, mode := range []Ordering{Ordered, Weak} {
		t.Run(mode.String(), func(t *testing.T) { testWindow(t, mode) })
	}
}

func testWindow(t *testing.T, mode Ordering) {
	lossy := wire.OpWriteMiddle // the packet to drop: a WRITE's second or later
	if mode == Weak {
		lossy = wire.OpWeakWrite
	}
	var drop atomic.Int32 // drop the drop-th next packet of opcode lossy (0: none)
	// No loss probe: on a loaded machine a stall of a few milliseconds would send a packet
	// again as if lost, and close the window (only a lost packet or a timeout should here).
	a := openSide(t, "127.0.0.1", Config{LossProbe: -1, FaultFilter: func(pkt []byte) netio.Verdict {
		if len(pkt) >= wire.BTHLen && wire.Opcode(pkt[0]) == lossy && drop.Load() > 0 && drop.Add(-1) == 0 {
			return netio.Verdict{Action: netio.Drop}
		}
		return netio.Verdict{Action: netio.Pass}
	}})
	b := openSide(t, "127.0.0.2", Config{})
	connectMode(t, a, b, wire.MTU1024, 0x100, 0x900, mode)
	// The window the next packet would be sent in (the requester opens it when it sends).
	window := func() (win int32, ackEvery int) {
		a.qp.mu.Lock()
		defer a.qp.mu.Unlock()
		return a.qp.req.openWindow(), a.qp.req.ackEvery
	}
	if w, e := window(); w != BaseWindow || e != DefaultAckReqEvery {
		t.Fatalf("a new QP's window %d, AckReq every %d packets; want %d, %d", w, e, BaseWindow, DefaultAckReqEvery)
	}
	if a.d.winMax <= BaseWindow {
		t.Skipf("the socket's receive buffer holds no more than the base window (%d packets)", a.d.winMax)
	}

	// 8,192 packets a message: the window doubles after 2,048, 4,096 and 8,192 more, so
	// after two messages; more if a stall on a loaded machine reached the ACK timeout.
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
	wrid := uint64(1)
	for ; wrid <= 16; wrid++ {
		write(wrid, n)
		if w, _ := window(); wrid >= 2 && w == a.d.winMax {
			break
		}
	}
	if w, e := window(); w != a.d.winMax || e != int(w)/4 {
		t.Fatalf("after %d messages of %d packets: window %d, AckReq every %d packets; want %d, %d (%+v)", min(wrid, 16), n/1024, w, e, a.d.winMax, a.d.winMax/4, a.qp.Stats())
	}

	// A lost packet (the third of the next message): go-back-N after a sequence NAK, or a
	// selective retransmission after a SACK, and the window back at its start (the 100
	// packets after it are too few to open it again).
	retransmits := a.qp.Stats().Retransmits
	drop.Store(3)
	write(wrid+1, 100<<10)
	if a.qp.Stats().Retransmits == retransmits {
		t.Fatal("no retransmission: the filter dropped nothing")
	}
	if w, e := window(); w != BaseWindow || e != DefaultAckReqEvery {
		t.Fatalf("after a loss: window %d, AckReq every %d packets; want %d, %d", w, e, BaseWindow, DefaultAckReqEvery)
	}
}
