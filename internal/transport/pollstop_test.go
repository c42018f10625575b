package transport

import (
	"math"
	"sync"
	"testing"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// TestStoppedPollLeavesReceivePath stops a consumer's poll of b in the middle, after it
// found nothing to receive (once a stall was seen: see stallWatch), as a machine busy with other work stops a thread for want of a
// processor (up to a second now and then), and a sends b a SEND meanwhile: b's receive
// goroutine takes it and b acknowledges it while the poll is stopped. Were the receive path
// held through an empty poll, the device would stop with the polling thread: b's receive
// and timer goroutines would wait for it, and a's QP would spend its retry count on the
// silence (the SEND completing with StatusRetryExcErr).
func TestStoppedPollLeavesReceivePath(t *testing.T) {
	a := openSide(t, "127.0.0.1", Config{})
	b := openSide(t, "127.0.0.2", Config{})
	// A local ACK timeout of a second (8.6 s without progress before the QP fails): with
	// the receive path free, b's goroutines answer unless the machine stops them longer.
	connectTimeout(t, a, b, wire.MTU1024, 0x100, 0x200, Ordered, 18)
	dst := make([]byte, 64)
	md := reg(t, b.d, dst)
	_, err := b.qp.PostRecv([]RecvWR{{WRID: 1, SG: []SGE{{Addr: md.IOVA(), Length: 64, LKey: md.Key()}}}})
	must(t, err)
	src := []byte("while the poll is stopped")
	ms := reg(t, a.d, src)

	u := b.d.q0()
	u.stalls.lookUntil.Store(math.MaxInt64) // a stall was seen: empty polls look first
	stopped, resume, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	u.testPause = func() {
		close(stopped)
		<-resume
	}
	go func() {
		b.cq.Progress() // nothing has been sent to b yet: the poll finds nothing, and stops
		close(returned)
	}()
	<-stopped
	_, err = a.qp.PostSend([]SendWR{{WRID: 2, Opcode: WRSend, Flags: FlagSignaled,
		SG: []SGE{{Addr: ms.IOVA(), Length: uint32(len(src)), LKey: ms.Key()}}}})
	must(t, err)
	wc := waitCQE(t, a.cq, 1)
	close(resume)
	<-returned
	u.testPause = nil
	if wc[0].Status != StatusSuccess {
		// StatusRetryExcErr: b answered nothing while its poll was stopped.
		t.Fatalf("a's SEND completed with status %d while b's poll was stopped (want %d): the stopped poll held b's receive path",
			wc[0].Status, StatusSuccess)
	}
	if wc := waitCQE(t, b.cq, 1); wc[0].Status != StatusSuccess || string(dst[:wc[0].ByteLen]) != string(src) {
		t.Fatalf("b's receive completion %+v, %q", wc[0], dst[:wc[0].ByteLen])
	}
}

// TestPollSendsNextResponseRound: a poll that finds the socket empty still sends the next
// round of READ responses waiting for it (it takes the receive path for them), with the
// receive goroutine asleep.
func TestPollSendsNextResponseRound(t *testing.T) {
	var mu sync.Mutex
	responses := 0
	mon := func(pkt []byte) netio.Verdict {
		var p wire.Packet
		if p.Decode(pkt) == nil && p.Info.Flags&wire.IsRead != 0 && p.Info.Flags&wire.IsRequest == 0 {
			mu.Lock()
			responses++
			mu.Unlock()
		}
		return netio.Verdict{Action: netio.Deliver}
	}
	sent := func() int {
		mu.Lock()
		defer mu.Unlock()
		return responses
	}
	a := openSide(t, "127.0.0.1", Config{})
	b := openSide(t, "127.0.0.2", Config{FaultFilter: mon})
	const psnA = 0x300
	connectMode(t, a, b, wire.MTU1024, psnA, 0x400, Ordered)
	const pkts = 2*respBudget + 2 // three rounds
	mem := make([]byte, pkts*1024)
	md := reg(t, b.d, mem)
	u := b.d.q0()
	// The receive goroutine asleep in the poller (after its first look at the socket), so
	// that nothing but the poll below sends the next round.
	for parked := false; !parked; {
		u.rxMu.Lock()
		parked = u.parked
		u.rxMu.Unlock()
	}
	fl := wiretest.Flow(a.d.LocalAddr(), b.d.LocalAddr())
	req := wiretest.Build(&fl, wire.BTH{Opcode: wire.OpReadRequest, PKey: wire.DefaultPKey, DestQP: b.qp.QPN(), PSN: psnA},
		func(hdr []byte) {
			r := wire.RETH{VA: md.IOVA(), RKey: md.Key(), DMALen: uint32(len(mem))}
			r.Put(hdr[wire.BTHLen:])
		}, nil)
	u.rxMu.Lock()
	u.input(req, a.d.LocalAddr())
	u.finishBatch()
	u.rxMu.Unlock()
	if n := sent(); n != respBudget || !u.responding.Load() {
		t.Fatalf("%d responses sent in the first round (want %d), more to come: %v", n, respBudget, u.responding.Load())
	}
	u.progress()
	if n := sent(); n < 2*respBudget {
		t.Fatalf("%d responses sent after a poll of the empty socket, want the second round's too (%d)", n, 2*respBudget)
	}
}
