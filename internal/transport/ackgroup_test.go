package transport

import (
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// A closed device leaves its ACK group: no member left, and none counted as holding ACKs
// back even if its queues held some when it closed.
func TestCloseLeavesAckGroup(t *testing.T) {
	g := NewAckGroup()
	a := openSide(t, "127.0.0.1", Config{Queues: 2, AckGroup: g})
	b := openSide(t, "127.0.0.2", Config{AckGroup: g})
	if m := g.members.Load(); m == nil || len(*m) != 3 {
		t.Fatalf("members %v, want the 3 queues", m)
	}
	for _, u := range a.d.queues {
		g.hold(u, true)
	}
	a.d.Close()
	if m := *g.members.Load(); len(m) != 1 || m[0] != b.d.queues[0] {
		t.Errorf("members after a closed: %v, want b's queue", m)
	}
	for _, u := range a.d.queues {
		if u.holdingAcks.Load() {
			t.Errorf("queue %d of the closed device still counted as holding ACKs back", u.idx)
		}
	}
}

// A poller of one device of the group sends an ACK another device of the group held back
// after it released that device's receive path: a thread the system stops in the send (a
// machine busy with other work stops threads for up to a second) holds nothing the other
// device needs to go on receiving.
func TestCrossFlushSendsOutsideReceivePath(t *testing.T) {
	const psnA = 0x4400
	g := NewAckGroup()
	var b *side
	var mu sync.Mutex
	acked, free := false, false
	mon := func(pkt []byte) netio.Verdict {
		var p wire.Packet
		if p.Decode(pkt) == nil && p.BTH.Opcode == wire.OpAcknowledge && p.BTH.PSN == psnA {
			u := b.d.q0()
			f := u.rxMu.TryLock() // nothing else runs b's receive path here
			if f {
				u.rxMu.Unlock()
			}
			mu.Lock()
			acked, free = true, f
			mu.Unlock()
		}
		return netio.Verdict{Action: netio.Deliver}
	}
	a := openSide(t, "127.0.0.1", Config{AckGroup: g})
	b = openSide(t, "127.0.0.2", Config{AckGroup: g, FaultFilter: mon})
	connectMode(t, a, b, wire.MTU1024, psnA, 0x100, Ordered)
	buf := make([]byte, 64)
	mr := reg(t, b.d, buf)
	_, err := b.qp.PostRecv([]RecvWR{{WRID: 1, SG: []SGE{{Addr: mr.IOVA(), Length: 64, LKey: mr.Key()}}}})
	must(t, err)
	u := b.d.q0()
	for parked := false; !parked; { // b's receive goroutine asleep: nothing else takes b's receive path
		u.rxMu.Lock()
		parked = u.parked
		u.rxMu.Unlock()
	}
	// a's SEND, received by b's receive path as a polling consumer runs it: the ACK is held
	// back, out of b's timer's reach, for a's poller to send.
	b.d.ackDelay.Store(int64(time.Hour))
	fl := wiretest.Flow(a.d.LocalAddr(), b.d.LocalAddr())
	pkt := wiretest.Build(&fl, wire.BTH{Opcode: wire.OpSendOnly, PKey: wire.DefaultPKey, DestQP: b.qp.QPN(),
		PSN: psnA, AckReq: true}, nil, []byte("held"))
	u.rxMu.Lock()
	u.polling = true
	u.input(pkt, a.d.LocalAddr())
	u.finishBatch()
	u.polling = false
	u.rxMu.Unlock()
	if !u.holdingAcks.Load() {
		t.Fatal("the SEND's ACK was not held back: the test does not test the cross flush")
	}
	// a's poller sends it once it has been held for crossFlushAge.
	for deadline := time.Now().Add(testutil.WaitLimit); ; {
		mu.Lock()
		done := acked
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a's poller did not send b's held-back ACK")
		}
		a.d.q0().progress()
	}
	mu.Lock()
	defer mu.Unlock()
	if !free {
		t.Error("b's held-back ACK was sent with b's receive path held")
	}
}
