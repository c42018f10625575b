package transport

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/wire"
)

// The weakly-ordered responder's own tests (weak_responder.go): its SACKs, atomics held
// until the holes before them close and executed once, READ re-requests answered from
// their resources, fatal errors in SACK form. Placement around holes is in weak_test.go
// and weakhostile_test.go, the RNR rounds in weak_rnr_test.go.

// weakSend is a one-packet weak SEND at psn, receive sequence number rsn, transmission
// txSeq, with AckReq.
func weakSend(psn, rsn wire.PSN, txSeq uint32, data []byte) rigPkt {
	return rigPkt{Op: wire.OpWeakSend, PSN: psn, AckReq: true, Payload: data,
		OOH: wire.OOH{Seq: rsn, Length: uint32(len(data)), Flags: wire.OOHRecv, TxSeq: txSeq}}
}

// wantSACK fails the test unless pkts are one SACK with syndrome syn for every PSN up to
// cum and ranges beyond, echoing transmission echo; it returns it.
func wantSACK(t *testing.T, pkts []sentPkt, syn uint8, cum wire.PSN, echo uint32, ranges ...[2]wire.PSN) *sentPkt {
	t.Helper()
	if len(pkts) != 1 || pkts[0].BTH.Opcode != wire.OpWeakAck {
		t.Fatalf("sent %v, want one SACK", pkts)
	}
	p := &pkts[0]
	ok := p.AETH.Syndrome == syn && p.BTH.PSN == cum && wire.SACKEcho(p.Ext) == echo && len(p.sack) == len(ranges)
	for i := 0; ok && i < len(ranges); i++ {
		ok = p.sack[i] == ranges[i]
	}
	if !ok {
		t.Fatalf("SACK %#x for %#x, echo %d, ranges %x; want %#x for %#x, echo %d, ranges %x",
			p.AETH.Syndrome, uint32(p.BTH.PSN), wire.SACKEcho(p.Ext), p.sack, syn, uint32(cum), echo, ranges)
	}
	return p
}

// TestWeakResponderSACK: the batch's SACK acknowledges every PSN before the first hole and
// names the runs received beyond it, echoing the highest transmission number received,
// with the MSN of the messages completed; when the hole closes the next SACK is
// cumulative again.
func TestWeakResponderSACK(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Weak))
	_, mb := rg.mem(256)
	for i := 0; i < 4; i++ {
		rg.postRecv(uint64(i), sge(mb, i*64, 64))
	}
	rg.deliver(weakSend(0x200, 0, 1, []byte("a")), weakSend(0x202, 2, 3, []byte("c")), weakSend(0x203, 3, 4, []byte("d")))
	if a := wantSACK(t, rg.sent(), ackSyn, 0x200, 4, [2]wire.PSN{0x202, 0x204}); a.AETH.MSN != 1 {
		t.Fatalf("MSN %d with one message complete", a.AETH.MSN)
	}
	wantStatuses(t, polled(rg.rcq), [2]uint64{0, 0})
	rg.deliver(weakSend(0x201, 1, 5, []byte("b")))
	if a := wantSACK(t, rg.sent(), ackSyn, 0x203, 5); a.AETH.MSN != 4 {
		t.Fatalf("MSN %d with four messages complete", a.AETH.MSN)
	}
	wantStatuses(t, polled(rg.rcq), [2]uint64{1, 0}, [2]uint64{2, 0}, [2]uint64{3, 0})
	if s := rg.qp.Stats(); s.SACKsSent != 2 || s.PlacedOutOfOrder != 2 {
		t.Fatalf("%+v", s)
	}
}

// TestWeakResponderAtomicHeld: an atomic beyond a hole is checked on arrival and executed
// when the hole closes, its ACK leaving then; a duplicate gets the recorded value again
// and does not execute it twice.
func TestWeakResponderAtomicHeld(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Weak))
	tgt, mt := rg.mem(64)
	binary.NativeEndian.PutUint64(tgt[8:], 100)
	fetchAdd := rigPkt{Op: wire.OpWeakFetchAdd, PSN: 0x201, Atomic: wire.AtomicETH{VA: mt.IOVA() + 8, RKey: mt.Key(), SwapAdd: 1},
		OOH: wire.OOH{Seq: 0, Length: 8, TxSeq: 2}}
	rg.deliver(fetchAdd)
	wantSACK(t, rg.sent(), ackSyn, 0x1FF, 2, [2]wire.PSN{0x201, 0x202})
	if v := binary.NativeEndian.Uint64(tgt[8:]); v != 100 {
		t.Fatalf("the atomic executed across the hole: %d", v)
	}
	rg.deliver(rigPkt{Op: wire.OpWeakWrite, PSN: 0x200, RETH: wire.RETH{VA: mt.IOVA(), RKey: mt.Key(), DMALen: 4},
		OOH: wire.OOH{Length: 4, TxSeq: 1}, Payload: []byte("data")})
	p := rg.sent()
	if len(p) != 1 || p[0].BTH.Opcode != wire.OpAtomicAcknowledge || p[0].BTH.PSN != 0x201 || p[0].AtomicAck != 100 {
		t.Fatalf("sent %v, want the atomic's ACK with 100", p)
	}
	if v := binary.NativeEndian.Uint64(tgt[8:]); v != 101 {
		t.Fatalf("target %d after the hole closed", v)
	}
	rg.deliver(fetchAdd)
	p = rg.sent()
	if len(p) != 1 || p[0].BTH.Opcode != wire.OpAtomicAcknowledge || p[0].AtomicAck != 100 || binary.NativeEndian.Uint64(tgt[8:]) != 101 {
		t.Fatalf("duplicate atomic: sent %v, target %d", p, binary.NativeEndian.Uint64(tgt[8:]))
	}
}

// TestWeakResponderReadReRequest: a READ request for responses already sent (the
// requester lost some) is answered again from its resource, from the PSN it asks for.
func TestWeakResponderReadReRequest(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Weak))
	src, ms := rg.mem(4096)
	copy(src, testutil.Pattern(4096, 2))
	read := func(psn wire.PSN, off, n uint32, txSeq uint32) rigPkt {
		return rigPkt{Op: wire.OpWeakReadReq, PSN: psn, RETH: wire.RETH{VA: ms.IOVA() + uint64(off), RKey: ms.Key(), DMALen: n},
			OOH: wire.OOH{Seq: 0, Offset: off, Length: n, TxSeq: txSeq}}
	}
	rg.deliver(read(0x200, 0, 3000, 1))
	wantSent(t, rg.sent(), 0x200, wire.OpReadResponseFirst, wire.OpReadResponseMiddle, wire.OpReadResponseLast)
	rg.deliver(read(0x201, 1024, 3000-1024, 2))
	p := rg.sent()
	wantSent(t, p, 0x201, wire.OpReadResponseFirst, wire.OpReadResponseLast)
	if !bytes.Equal(p[0].Payload, src[1024:2048]) || !bytes.Equal(p[1].Payload, src[2048:3000]) || rg.qp.Stats().Duplicates != 1 {
		t.Fatalf("re-requested responses: %d and %d bytes, %+v", len(p[0].Payload), len(p[1].Payload), rg.qp.Stats())
	}
}

// TestWeakResponderRemoteAccessError: a WRITE whose key does not grant it is NAKed in SACK
// form; the access error event, the QP in ERR, nothing placed.
func TestWeakResponderRemoteAccessError(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Weak))
	buf, mb := rg.mem(64)
	rg.deliver(rigPkt{Op: wire.OpWeakWrite, PSN: 0x200, RETH: wire.RETH{VA: mb.IOVA(), RKey: mb.Key() ^ 0x100, DMALen: 4},
		OOH: wire.OOH{Length: 4, TxSeq: 1}, Payload: []byte("data")})
	wantSACK(t, rg.sent(), wire.AETHNak|wire.NakRemoteAccessError, 0x1FF, 1)
	wantEvent(t, rg.takeEvents(), EventQPAccessErr)
	if rg.qp.State() != StateErr || !bytes.Equal(buf, make([]byte, 64)) {
		t.Fatalf("state %v, memory changed", rg.qp.State())
	}
}

// TestWeakResponderAbortFlushesSRQWQEs: receive WQEs that messages still arriving took
// from a shared receive queue complete with WR_FLUSH_ERR when the QP enters ERR (the
// QP's own queue is flushed whole; a shared one keeps its WQEs for the other QPs).
func TestWeakResponderAbortFlushesSRQWQEs(t *testing.T) {
	cfg := newRigConfig(Weak)
	rg := newQPRig(t, cfg)
	srq := rg.d.NewRecvQueue(1, 8, 1, true)
	qp, err := rg.d.CreateQP(QPConfig{PD: 1, SendCQ: rg.scq, RecvCQ: rg.rcq, SRQ: srq, MaxSendWR: 4, MaxSendSGE: 1})
	must(t, err)
	rg.qp = qp
	rg.bringUp(StateRTS)
	_, mb := rg.mem(8192)
	for i := 0; i < 3; i++ {
		_, err := srq.Post([]RecvWR{{WRID: uint64(10 + i), SG: []SGE{sge(mb, i*2048, 2048)}}})
		must(t, err)
	}
	// The second packet of a two-packet SEND: it binds a WQE, the message waits for its first.
	rg.deliver(rigPkt{Op: wire.OpWeakSend, PSN: 0x201, Payload: make([]byte, 10),
		OOH: wire.OOH{Seq: 0, Offset: rigMTUBytes, Length: rigMTUBytes + 10, Flags: wire.OOHRecv, TxSeq: 2}})
	must(t, rg.qp.Modify(&Attr{State: StateErr}, MaskState, lim))
	wantStatuses(t, polled(rg.rcq), [2]uint64{10, uint64(StatusWRFlushErr)})
	if n := srq.Posted(); n != 2 {
		t.Fatalf("%d WQEs left on the shared queue, want 2", n)
	}
	wantEvent(t, rg.takeEvents(), EventQPLastWQE)
}

// TestWeakResponderDuplicateAcked: a WRITE that arrives again is not placed again, and is
// acknowledged again whether it asks for an ACK or not: the requester resends it because
// it lost the acknowledgement.
func TestWeakResponderDuplicateAcked(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Weak))
	buf, mb := rg.mem(64)
	wr := rigPkt{Op: wire.OpWeakWrite, PSN: 0x200, RETH: wire.RETH{VA: mb.IOVA(), RKey: mb.Key(), DMALen: 4},
		OOH: wire.OOH{Length: 4, TxSeq: 1}, Payload: []byte("data")}
	rg.deliver(wr)
	rg.sent()
	copy(buf, "XXXX")
	rg.deliver(wr)
	if p := rg.sent(); len(p) != 1 || p[0].BTH.Opcode != wire.OpWeakAck || string(buf[:4]) != "XXXX" || rg.qp.Stats().Duplicates != 1 {
		t.Fatalf("duplicate WRITE: sent %v, buffer %q, %+v", p, buf[:4], rg.qp.Stats())
	}
}
