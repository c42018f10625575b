package transport

import (
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
)

// A weakly-ordered responder given hostile or inconsistent headers (receive sequence
// numbers out of step with PSNs, packets of one message that disagree about where it
// starts or ends, a request for a resource slot still held, a PSN as far ahead as the PSN
// space goes) must never lose, duplicate or misplace a completion, touch memory outside
// the window, or panic. (Each case was found by the weak-mode fuzz targets or tests.)

// A weak SEND at the expected PSN whose OOH claims receive sequence number 2 while
// messages 0 and 1 never arrived binds the third receive WQE, but when it completes the
// responder pops the oldest one (weakDeliver assumes the message it delivers is the one
// at rsnBase): the oldest WQE disappears without a completion, the third completes twice
// (success, then WR_FLUSH_ERR when the QP is flushed), and the application gets a
// completion for a WQE that is still on the queue. Every receive WQE must complete
// exactly once, in posting order.
func TestWeakRecvSeqAhead(t *testing.T) {
	rg := newWeakRig(t)
	buf := make([]byte, 3*64)
	mr := reg(t, rg.b.d, buf)
	rg.postRecvs(t, mr, 3, 64) // WRIDs 100, 101, 102
	rg.deliver(rg.b, rg.a, rg.send1(0, 2, []byte("ahead")))
	must(t, rg.b.qp.Modify(&Attr{State: StateErr}, MaskState, lim)) // flush what is left
	got := wrids(pollAll(rg.b.cq))
	if !eqU64(got, []uint64{100, 101, 102}) {
		t.Fatalf("receive WQEs 100, 101, 102 completed as %v: each must complete once, in posting order", got)
	}
}

// The same with the messages' receive sequence numbers swapped: message 0 arrives at PSN
// 1, message 2 at PSN 0 (with no message 1 at all). Both are complete when PSN 0 arrives
// and are delivered in PSN order, message 2 first. Every receive WQE must still complete
// exactly once, in posting order, and none successfully once the QP is in the error
// state: refusing message 2 (the QP goes to ERR and flushes its receive queue) must also
// stop the delivery of message 0 behind it.
func TestWeakRecvSeqSwapped(t *testing.T) {
	rg := newWeakRig(t)
	buf := make([]byte, 3*64)
	mr := reg(t, rg.b.d, buf)
	rg.postRecvs(t, mr, 3, 64) // WRIDs 100, 101, 102
	rg.deliver(rg.b, rg.a, rg.send1(1, 0, []byte("zero")))
	rg.deliver(rg.b, rg.a, rg.send1(0, 2, []byte("two")))
	must(t, rg.b.qp.Modify(&Attr{State: StateErr}, MaskState, lim)) // flush what is left
	es := pollAll(rg.b.cq)
	if got := wrids(es); !eqU64(got, []uint64{100, 101, 102}) {
		t.Fatalf("receive WQEs 100, 101, 102 completed as %v: each must complete once, in posting order", got)
	}
	failed := false
	for _, e := range es {
		if e.Status != StatusSuccess {
			failed = true
		} else if failed {
			t.Fatalf("WQE %d completed successfully after an error completion: %+v", e.WRID, es)
		}
	}
}

// arrivedCheck runs the responder's hole tracker's invariant check (holes.Tracker.Check).
func arrivedCheck(q *QP) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.weak.resp.arrived.Check()
}

// The packets of one weak SEND disagree about where the message starts: its second
// packet (offset 1 MTU) arrives at PSN 5, its first (offset 0) at PSN 2. Each is placed;
// when the second of them arrives the message is complete, and weakData holds its
// completion at the PSN the last packet implies (2 + 2 - 1 = 3), which never arrived:
// the completion is counted on the hole before PSN 2 although it lies inside the next
// hole [3, 5), and the tracker's invariants no longer hold (the completion would also
// wait for PSN 3, which belongs to another message). A packet that disagrees with the
// rest of its message about the message's first PSN must be refused, as one that
// disagrees about its length is.
func TestWeakMessageFirstPSNMismatch(t *testing.T) {
	rg := newWeakRig(t)
	buf := make([]byte, 2*rigMTU)
	mr := reg(t, rg.b.d, buf)
	rg.postRecvs(t, mr, 1, 2*rigMTU)
	const n = rigMTU + 10
	rg.deliver(rg.b, rg.a, rg.weakData(wire.OpWeakSend, 5, wire.OOH{Seq: 0, Offset: rigMTU, Length: n, Flags: wire.OOHRecv}, nil, 0, make([]byte, 10)))
	rg.deliver(rg.b, rg.a, rg.weakData(wire.OpWeakSend, 2, wire.OOH{Seq: 0, Offset: 0, Length: n, Flags: wire.OOHRecv}, nil, 0, make([]byte, rigMTU)))
	if err := arrivedCheck(rg.b.qp); err != nil {
		t.Fatalf("responder's hole tracker after packets of one message at PSNs 5 (offset 1 MTU) and 2 (offset 0): %v", err)
	}
}

// The same through a packet outside its message: a 2-MTU SEND's first packet arrives at
// PSN 2, and an empty packet claiming offset 2 MTU (= the message's length, which
// weakData accepts) at PSN 4. The message counts two packets and is complete; its
// completion is held at PSN 3 (2 + 2 - 1), which never arrived and lies in the hole
// [3, 4), and the tracker's invariants no longer hold. A packet's offset must lie inside
// its message (unless the message is empty).
func TestWeakOffsetAtMessageEnd(t *testing.T) {
	rg := newWeakRig(t)
	buf := make([]byte, 2*rigMTU)
	mr := reg(t, rg.b.d, buf)
	rg.postRecvs(t, mr, 1, 2*rigMTU)
	rg.deliver(rg.b, rg.a, rg.weakData(wire.OpWeakSend, 2, wire.OOH{Seq: 0, Offset: 0, Length: 2 * rigMTU, Flags: wire.OOHRecv}, nil, 0, make([]byte, rigMTU)))
	rg.deliver(rg.b, rg.a, rg.weakData(wire.OpWeakSend, 4, wire.OOH{Seq: 0, Offset: 2 * rigMTU, Length: 2 * rigMTU, Flags: wire.OOHRecv}, nil, 0, nil))
	if err := arrivedCheck(rg.b.qp); err != nil {
		t.Fatalf("responder's hole tracker after a packet at offset 0 (PSN 2) and an empty one at offset = length (PSN 4): %v", err)
	}
}

// deliverCatching is pktRig.deliver returning the engine's panic, if any (with rxMu
// released).
func (rg *pktRig) deliverCatching(to, from *side, pkt []byte) (perr any) {
	d := to.d
	d.q0().rxMu.Lock()
	defer d.q0().rxMu.Unlock()
	defer func() { perr = recover() }()
	d.q0().input(pkt, from.d.LocalAddr())
	d.q0().finishBatch()
	return nil
}

// weakReq builds a weak READ request (reth) or atomic (at) from a to b.
func (rg *pktRig) weakReq(op wire.Opcode, psn uint32, o wire.OOH, reth *wire.RETH, at *wire.AtomicETH) []byte {
	pkt := make([]byte, op.Info().HdrLen)
	(&wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: rg.b.qp.QPN(), PSN: wire.PSN(psn), AckReq: true}).Put(pkt)
	if reth != nil {
		reth.Put(pkt[wire.BTHLen:])
	} else {
		at.Put(pkt[wire.BTHLen:])
	}
	o.Put(pkt[len(pkt)-wire.OOHLen:])
	return seal(rg.a, rg.b, pkt)
}

// A weak responder keeps a READ request or atomic that arrived beyond a hole in the
// resource slot its read sequence number selects (OOH.Seq modulo max_dest_rd_atomic, 16
// here) until the hole closes; a later request with a sequence number 16 higher takes the
// same slot and overwrites it while it is held. Here a fetch-and-add (sequence 0, PSN 1)
// waits for PSN 0, and a zero-length READ (sequence 16, PSN 2) replaces it; when PSN 0
// arrives, the atomic's turn comes and weakDeliver executes an atomic on the READ's
// resource: binary.NativeEndian.Uint64 of its empty memory panics in the receive path (a
// remote peer, or a requester whose max_rd_atomic exceeds the responder's
// max_dest_rd_atomic, crashes the process). With a READ of 8 bytes or more it would
// instead run a compare-and-swap on the READ's memory and answer neither request. The
// responder must refuse a request for a resource still held (or keep both), and never
// panic.
func TestWeakResourceSlotTakenWhileHeld(t *testing.T) {
	rg := newWeakRig(t)
	tgt := make([]byte, 64)
	mt := reg(t, rg.b.d, tgt)
	rg.deliver(rg.b, rg.a, rg.weakReq(wire.OpWeakFetchAdd, 1, wire.OOH{Seq: 0, Length: 8}, nil,
		&wire.AtomicETH{VA: mt.IOVA() + 8, RKey: mt.Key(), SwapAdd: 1}))
	rg.deliver(rg.b, rg.a, rg.weakReq(wire.OpWeakReadReq, 2, wire.OOH{Seq: 16}, &wire.RETH{VA: mt.IOVA(), RKey: mt.Key(), DMALen: 0}, nil))
	if perr := rg.deliverCatching(rg.b, rg.a, rg.weakData(wire.OpWeakWrite, 0, wire.OOH{Length: 4},
		&wire.RETH{VA: mt.IOVA() + 32, RKey: mt.Key(), DMALen: 4}, 0, []byte("fill"))); perr != nil {
		t.Fatalf("closing the hole before a held atomic whose resource a READ took: panic: %v", perr)
	}
}

// A weak WRITE packet at PSN expected + 2^23 - 1 (as far ahead as the 24-bit PSN space
// goes, far beyond the bitmap span) is placed in memory but not recorded: weakMark's
// span check looks at PSNDiff(psn+1, expected), which wraps to -2^23 and passes, while
// holes.Tracker.Mark sees the range as old and records nothing (it returns Duplicate).
// The packet is neither in the window nor acknowledged: it must be dropped (BeyondSpan)
// without touching memory, like any packet past the span.
func TestWeakFarPSNPlaced(t *testing.T) {
	rg := newWeakRig(t)
	tgt := make([]byte, 64)
	mt := reg(t, rg.b.d, tgt)
	rg.deliver(rg.b, rg.a, rg.weakData(wire.OpWeakWrite, 1<<23-1, wire.OOH{Length: 4}, &wire.RETH{VA: mt.IOVA(), RKey: mt.Key(), DMALen: 4}, 0, []byte("far!")))
	placed(rg.b.d, func() bool {
		if string(tgt[:4]) != "\x00\x00\x00\x00" {
			t.Errorf("a WRITE at PSN 2^23-1 past the expected PSN 0 was placed: %q", tgt[:4])
		}
		return true
	})
	if s := rg.b.qp.Stats(); s.BeyondSpan != 1 {
		t.Errorf("BeyondSpan %d, want 1", s.BeyondSpan)
	}
}
