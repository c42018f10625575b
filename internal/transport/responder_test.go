package transport

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// The responder's own tests, in ordered mode (ordered_responder.go), with what both modes
// share (responder.go: ACK timing, READ and atomic resources, fatal errors; rnr.go: RNR
// NAKs); weak mode's are in weak_responder_test.go.

const ackSyn = wire.AETHAck | wire.NoCredits

// write is an ordered RDMA WRITE packet to [va, va+DMALen) of region r's key.
func write(op wire.Opcode, psn wire.PSN, r *tpt.Region, va uint64, dmaLen uint32, payload []byte) rigPkt {
	return rigPkt{Op: op, PSN: psn, RETH: wire.RETH{VA: va, RKey: r.Key(), DMALen: dmaLen}, Payload: payload}
}

// TestResponderPlacesSend: a multi-packet SEND lands in the receive WQE's scatter list
// packet by packet and completes at its LAST with the length, immediate and sender; the
// AckReq on its last packet gets one ACK, with the MSN counting the message.
func TestResponderPlacesSend(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	buf, mb := rg.mem(4096)
	rg.postRecv(10, sge(mb, 0, 100), sge(mb, 1000, 3000))
	data := testutil.Pattern(2100, 5)
	rg.deliver(rigPkt{Op: wire.OpSendFirst, PSN: 0x200, Payload: data[:1024]},
		rigPkt{Op: wire.OpSendMiddle, PSN: 0x201, Payload: data[1024:2048]},
		rigPkt{Op: wire.OpSendLastImm, PSN: 0x202, AckReq: true, SE: true, Imm: 0xBEEF, Payload: data[2048:]})
	c := wantCQE(t, polled(rg.rcq), 10, StatusSuccess, WCRecv)
	if c.ByteLen != 2100 || c.Imm != 0xBEEF || c.Flags != WCFlagWithImm || c.SrcQP != rigPeerQPN || !c.solicited {
		t.Fatalf("receive completion %+v", c)
	}
	if !bytes.Equal(buf[:100], data[:100]) || !bytes.Equal(buf[1000:3000], data[100:]) {
		t.Fatal("SEND not scattered as the receive WQE's SGEs say")
	}
	if a := wantAck(t, rg.sent(), ackSyn, 0x202); a.AETH.MSN != 1 {
		t.Fatalf("ACK MSN %d, want 1", a.AETH.MSN)
	}
}

// TestResponderPlacesWrite: a multi-packet WRITE lands at its RETH's address, packet by
// packet, and completes nothing; a WRITE with immediate takes a receive WQE for its
// completion.
func TestResponderPlacesWrite(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	dst, md := rg.mem(4096)
	data := testutil.Pattern(2100, 7)
	va := md.IOVA() + 100
	rg.deliver(write(wire.OpWriteFirst, 0x200, md, va, 2100, data[:1024]),
		rigPkt{Op: wire.OpWriteMiddle, PSN: 0x201, Payload: data[1024:2048]},
		rigPkt{Op: wire.OpWriteLast, PSN: 0x202, AckReq: true, Payload: data[2048:]})
	if !bytes.Equal(dst[100:2200], data) || len(polled(rg.rcq)) != 0 {
		t.Fatal("WRITE not placed at its address, or it completed a receive")
	}
	wantAck(t, rg.sent(), ackSyn, 0x202)
	rg.postRecv(11, sge(md, 0, 0))
	rg.deliver(rigPkt{Op: wire.OpWriteOnlyImm, PSN: 0x203, AckReq: true, Imm: 9, RETH: wire.RETH{VA: va, RKey: md.Key(), DMALen: 4}, Payload: []byte("imm!")})
	c := wantCQE(t, polled(rg.rcq), 11, StatusSuccess, WCRecvRDMAImm)
	if c.ByteLen != 4 || c.Imm != 9 || string(dst[100:104]) != "imm!" {
		t.Fatalf("WRITE with immediate: %+v, %q", c, dst[100:104])
	}
	if a := wantAck(t, rg.sent(), ackSyn, 0x203); a.AETH.MSN != 2 {
		t.Fatalf("MSN %d after two WRITEs", a.AETH.MSN)
	}
}

// TestResponderAckCoalescing: the AckReqs of a receive batch get one ACK at its end, for
// the last PSN; a packet without AckReq gets none; a run of a quarter window (base window)
// of packets is acknowledged at once, in the batch.
func TestResponderAckCoalescing(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	_, md := rg.mem(64)
	w := func(psn wire.PSN, ackReq bool) rigPkt {
		p := write(wire.OpWriteOnly, psn, md, md.IOVA(), 4, []byte("data"))
		p.AckReq = ackReq
		return p
	}
	rg.deliver(w(0x200, true), w(0x201, true), w(0x202, true))
	wantAck(t, rg.sent(), ackSyn, 0x202)
	rg.deliver(w(0x203, false))
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("acknowledged a packet without AckReq: %v", p)
	}
	run := int(rg.d.winBase) / 4
	var batch []rigPkt
	for i := 0; i < run+8; i++ {
		batch = append(batch, w(wire.PSN(0x204+i), i == run-2 || i == run+7))
	}
	rg.deliver(batch...)
	p := rg.sent()
	if len(p) != 2 || p[0].BTH.PSN != wire.PSN(0x204+run-2) || p[1].BTH.PSN != wire.PSN(0x204+run+7) {
		t.Fatalf("a run of %d packets: ACKs %v, want one in the batch at PSN %#x and one at its end", run+8, p, 0x204+run-2)
	}
}

// TestResponderHeldAckFlushedByTimer: while a consumer polls, the batch's ACK is held back
// to ride along with a send; with none, the QP's timer sends it after ackDelay.
func TestResponderHeldAckFlushedByTimer(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	_, md := rg.mem(64)
	p := write(wire.OpWriteOnly, 0x200, md, md.IOVA(), 4, []byte("data"))
	p.AckReq = true
	rg.deliverPolling(p)
	if s := rg.sent(); len(s) != 0 {
		t.Fatalf("sent %v while a consumer polls", s)
	}
	rg.after(ackDelay - 1)
	if s := rg.sent(); len(s) != 0 {
		t.Fatalf("the held ACK went early: %v", s)
	}
	rg.after(1)
	wantAck(t, rg.sent(), ackSyn, 0x200)
}

// TestResponderDuplicates: a SEND or WRITE again (its PSN before the expected one) is not
// placed again; it is counted and the latest ACK goes again.
func TestResponderDuplicates(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	buf, mb := rg.mem(64)
	rg.postRecv(1, sge(mb, 0, 32))
	rg.postRecv(2, sge(mb, 32, 32))
	send := rigPkt{Op: wire.OpSendOnly, PSN: 0x200, AckReq: true, Payload: []byte("first")}
	wr := write(wire.OpWriteOnly, 0x201, mb, mb.IOVA()+40, 3, []byte("abc"))
	wr.AckReq = true
	rg.deliver(send, wr)
	wantAck(t, rg.sent(), ackSyn, 0x201)
	wantCQE(t, polled(rg.rcq), 1, StatusSuccess, WCRecv)
	copy(buf, "XXXXX")
	copy(buf[40:], "YYY")
	rg.deliver(send)
	rg.deliver(wr)
	p := rg.sent()
	if len(p) != 2 || p[0].BTH.PSN != 0x201 || p[1].BTH.PSN != 0x201 || p[0].AETH.Syndrome != ackSyn {
		t.Fatalf("duplicates answered with %v, want the ACK of PSN 0x201 each", p)
	}
	if string(buf[:5]) != "XXXXX" || string(buf[40:43]) != "YYY" || len(polled(rg.rcq)) != 0 || rg.qp.Stats().Duplicates != 2 {
		t.Fatalf("duplicates placed again or completed: %q %q %+v", buf[:5], buf[40:43], rg.qp.Stats())
	}
}

// TestResponderDuplicateWithoutAckReq: a duplicate SEND or WRITE is acknowledged again even
// when it does not ask for an ACK (as Linux's rxe answers one): the requester that resends
// it has lost the ACK, and would otherwise wait for its timeout again.
func TestResponderDuplicateWithoutAckReq(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	_, mb := rg.mem(64)
	rg.postRecv(1, sge(mb, 0, 32))
	send := rigPkt{Op: wire.OpSendOnly, PSN: 0x200, Payload: []byte("first")}
	wr := write(wire.OpWriteOnly, 0x201, mb, mb.IOVA()+40, 3, []byte("abc"))
	rg.deliver(send, wr)
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("ACKs %v for requests that asked for none", p)
	}
	for _, dup := range []rigPkt{send, wr} {
		rg.deliver(dup)
		wantAck(t, rg.sent(), ackSyn, 0x201)
	}
	if d := rg.qp.Stats().Duplicates; d != 2 {
		t.Fatalf("%d duplicates counted, want 2", d)
	}
}

// TestResponderSequenceNAK: a packet past the expected PSN gets one PSN sequence error NAK
// for the expected PSN; the packets after it are dropped quietly; once the expected PSN
// arrived, the next gap is NAKed again.
func TestResponderSequenceNAK(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	_, md := rg.mem(64)
	w := func(psn wire.PSN) rigPkt {
		p := write(wire.OpWriteOnly, psn, md, md.IOVA(), 4, []byte("data"))
		p.AckReq = true
		return p
	}
	rg.deliver(w(0x202))
	wantAck(t, rg.sent(), wire.AETHNak|wire.NakPSNSeqError, 0x200)
	rg.deliver(w(0x203))
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("a second NAK for the same gap: %v", p)
	}
	rg.deliver(w(0x200))
	wantAck(t, rg.sent(), ackSyn, 0x200)
	rg.deliver(w(0x203))
	wantAck(t, rg.sent(), wire.AETHNak|wire.NakPSNSeqError, 0x201)
	if s := rg.qp.Stats(); s.OutOfSequence != 3 || s.NAKsSent != 2 || rg.qp.State() != StateRTS {
		t.Fatalf("%+v, state %v", s, rg.qp.State())
	}
}

// TestResponderInvalidRequest: a request that breaks the opcode sequence or the payload
// rules is NAKed (invalid request) and fails the QP: with a receive WQE in use it
// completes with the error, otherwise an asynchronous event says why.
func TestResponderInvalidRequest(t *testing.T) {
	// A WRITE_MIDDLE with no WRITE in progress: the event.
	rg := newQPRig(t, newRigConfig(Ordered))
	rg.deliver(rigPkt{Op: wire.OpWriteMiddle, PSN: 0x200, Payload: make([]byte, rigMTUBytes)})
	wantAck(t, rg.sent(), wire.AETHNak|wire.NakInvalidRequest, 0x200)
	wantEvent(t, rg.takeEvents(), EventQPReqErr)
	if rg.qp.State() != StateErr {
		t.Fatalf("state %v", rg.qp.State())
	}

	// A SEND_MIDDLE shorter than the MTU: the receive WQE the SEND took completes with it.
	rg = newQPRig(t, newRigConfig(Ordered))
	_, mb := rg.mem(4096)
	rg.postRecv(1, sge(mb, 0, 4096))
	rg.deliver(rigPkt{Op: wire.OpSendFirst, PSN: 0x200, Payload: make([]byte, rigMTUBytes)},
		rigPkt{Op: wire.OpSendMiddle, PSN: 0x201, Payload: make([]byte, 10)})
	wantAck(t, rg.sent(), wire.AETHNak|wire.NakInvalidRequest, 0x201)
	if c := wantCQE(t, polled(rg.rcq), 1, StatusRemInvReqErr, WCRecv); c.VendorErr != VendorLength {
		t.Fatalf("vendor error %#x", c.VendorErr)
	}

	// A SEND longer than the receive buffer: local length error.
	rg = newQPRig(t, newRigConfig(Ordered))
	_, mb = rg.mem(64)
	rg.postRecv(2, sge(mb, 0, 16))
	rg.deliver(rigPkt{Op: wire.OpSendOnly, PSN: 0x200, Payload: make([]byte, 17)})
	wantAck(t, rg.sent(), wire.AETHNak|wire.NakInvalidRequest, 0x200)
	wantCQE(t, polled(rg.rcq), 2, StatusLocLenErr, WCRecv)
}

// TestResponderRemoteAccessError: a WRITE, READ or atomic whose key does not grant the
// access, or on a QP that does not allow it, is NAKed (remote access error): the access
// error event, the QP in ERR.
func TestResponderRemoteAccessError(t *testing.T) {
	for _, c := range []struct {
		name   string
		access tpt.Access
		pkt    func(r *tpt.Region) rigPkt
	}{
		{"WRITE bad key", 0, func(r *tpt.Region) rigPkt {
			return rigPkt{Op: wire.OpWriteOnly, PSN: 0x200, RETH: wire.RETH{VA: r.IOVA(), RKey: r.Key() ^ 0x100, DMALen: 4}, Payload: []byte("data")}
		}},
		{"WRITE out of bounds", 0, func(r *tpt.Region) rigPkt {
			return rigPkt{Op: wire.OpWriteOnly, PSN: 0x200, RETH: wire.RETH{VA: r.IOVA() + 62, RKey: r.Key(), DMALen: 4}, Payload: []byte("data")}
		}},
		{"READ not allowed", tpt.LocalWrite | tpt.RemoteWrite, func(r *tpt.Region) rigPkt {
			return rigPkt{Op: wire.OpReadRequest, PSN: 0x200, RETH: wire.RETH{VA: r.IOVA(), RKey: r.Key(), DMALen: 4}}
		}},
		{"atomic bad key", 0, func(r *tpt.Region) rigPkt {
			return rigPkt{Op: wire.OpFetchAdd, PSN: 0x200, Atomic: wire.AtomicETH{VA: r.IOVA(), RKey: r.Key() + 1}}
		}},
	} {
		cfg := newRigConfig(Ordered)
		if c.access != 0 {
			cfg.Attr.Access = c.access
		}
		rg := newQPRig(t, cfg)
		buf, mb := rg.mem(64)
		rg.deliver(c.pkt(mb))
		wantAck(t, rg.sent(), wire.AETHNak|wire.NakRemoteAccessError, 0x200)
		wantEvent(t, rg.takeEvents(), EventQPAccessErr)
		if rg.qp.State() != StateErr || !bytes.Equal(buf, make([]byte, 64)) {
			t.Fatalf("%s: state %v, memory changed", c.name, rg.qp.State())
		}
	}
}

// TestResponderRNR: a SEND that finds no receive WQE gets an RNR NAK with the QP's RNR
// timer; the rest of the burst is dropped quietly; sent again once a WQE is posted, it is
// placed.
func TestResponderRNR(t *testing.T) {
	cfg := newRigConfig(Ordered)
	cfg.Attr.MinRNRTimer = 12
	rg := newQPRig(t, cfg)
	_, mb := rg.mem(64)
	send := func(psn wire.PSN) rigPkt {
		return rigPkt{Op: wire.OpSendOnly, PSN: psn, AckReq: true, Payload: []byte("hi")}
	}
	rg.deliver(send(0x200), send(0x201))
	wantAck(t, rg.sent(), wire.AETHRNR|12, 0x200)
	rg.postRecv(1, sge(mb, 0, 8))
	rg.postRecv(2, sge(mb, 8, 8))
	rg.deliver(send(0x200), send(0x201))
	wantAck(t, rg.sent(), ackSyn, 0x201)
	if c := polled(rg.rcq); len(c) != 2 || rg.qp.Stats().RNRNAKsSent != 1 {
		t.Fatalf("completions %+v, %+v", c, rg.qp.Stats())
	}
}

// TestResponderReadResponses: a READ request is answered with FIRST/MIDDLE/LAST responses
// of the source's bytes (the AETH with the MSN on the first and last); a zero-length
// READ with one ONLY; a duplicate request for part of it is answered again from its
// resource, from the PSN it asks for.
func TestResponderReadResponses(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	src, ms := rg.mem(4096)
	copy(src, testutil.Pattern(4096, 9))
	read := func(psn wire.PSN, off, n uint32) rigPkt {
		return rigPkt{Op: wire.OpReadRequest, PSN: psn, RETH: wire.RETH{VA: ms.IOVA() + uint64(off), RKey: ms.Key(), DMALen: n}}
	}
	rg.deliver(read(0x200, 100, 3000), read(0x203, 0, 0))
	p := rg.sent()
	wantSent(t, p, 0x200, wire.OpReadResponseFirst, wire.OpReadResponseMiddle, wire.OpReadResponseLast, wire.OpReadResponseOnly)
	for i, n := range []int{1024, 1024, 952} {
		if !bytes.Equal(p[i].Payload, src[100+i*1024:100+i*1024+n]) {
			t.Fatalf("response %d: %d bytes, not the source's", i, len(p[i].Payload))
		}
	}
	if p[0].AETH.MSN != 1 || p[2].AETH.MSN != 1 || p[3].AETH.MSN != 2 || len(p[3].Payload) != 0 {
		t.Fatalf("MSNs %d %d %d, empty READ's payload %d", p[0].AETH.MSN, p[2].AETH.MSN, p[3].AETH.MSN, len(p[3].Payload))
	}
	// The requester lost the MIDDLE and LAST and asks again from 0x201.
	rg.deliver(read(0x201, 100+1024, 3000-1024))
	p = rg.sent()
	wantSent(t, p, 0x201, wire.OpReadResponseFirst, wire.OpReadResponseLast)
	if !bytes.Equal(p[1].Payload, src[100+2048:3100]) || p[1].AETH.MSN != 2 || rg.qp.Stats().Duplicates != 1 {
		t.Fatalf("replay: MSN %d, %+v", p[1].AETH.MSN, rg.qp.Stats())
	}
}

// TestResponderAtomics: an atomic executes once, its original value in the atomic ACK; a
// duplicate gets the recorded value again without executing again; a misaligned target
// is an invalid request.
func TestResponderAtomics(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	tgt, mt := rg.mem(64)
	binary.NativeEndian.PutUint64(tgt[8:], 10)
	fetchAdd := rigPkt{Op: wire.OpFetchAdd, PSN: 0x200, Atomic: wire.AtomicETH{VA: mt.IOVA() + 8, RKey: mt.Key(), SwapAdd: 5}}
	cmpSwap := rigPkt{Op: wire.OpCompareSwap, PSN: 0x201, Atomic: wire.AtomicETH{VA: mt.IOVA() + 8, RKey: mt.Key(), Compare: 15, SwapAdd: 99}}
	rg.deliver(fetchAdd, cmpSwap)
	p := rg.sent()
	wantSent(t, p, 0x200, wire.OpAtomicAcknowledge, wire.OpAtomicAcknowledge)
	if p[0].AtomicAck != 10 || p[1].AtomicAck != 15 || binary.NativeEndian.Uint64(tgt[8:]) != 99 {
		t.Fatalf("original values %d %d, target %d", p[0].AtomicAck, p[1].AtomicAck, binary.NativeEndian.Uint64(tgt[8:]))
	}
	rg.deliver(fetchAdd)
	p = rg.sent()
	wantSent(t, p, 0x200, wire.OpAtomicAcknowledge)
	if p[0].AtomicAck != 10 || binary.NativeEndian.Uint64(tgt[8:]) != 99 {
		t.Fatalf("replayed %d, target %d: executed twice", p[0].AtomicAck, binary.NativeEndian.Uint64(tgt[8:]))
	}
	rg.deliver(rigPkt{Op: wire.OpFetchAdd, PSN: 0x202, Atomic: wire.AtomicETH{VA: mt.IOVA() + 4, RKey: mt.Key(), SwapAdd: 1}})
	wantAck(t, rg.sent(), wire.AETHNak|wire.NakInvalidRequest, 0x202)
	if rg.qp.State() != StateErr {
		t.Fatalf("state %v", rg.qp.State())
	}
}

// TestResponderNAKAfterResponses: a NAK generated while READ responses are still queued
// leaves after them, so that responses leave in PSN order.
func TestResponderNAKAfterResponses(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	_, ms := rg.mem(4096)
	rg.deliver(rigPkt{Op: wire.OpReadRequest, PSN: 0x200, RETH: wire.RETH{VA: ms.IOVA(), RKey: ms.Key(), DMALen: 2048}},
		rigPkt{Op: wire.OpSendOnly, PSN: 0x205, Payload: []byte("ahead")})
	p := rg.sent()
	if len(p) != 3 || p[0].BTH.Opcode != wire.OpReadResponseFirst || p[1].BTH.Opcode != wire.OpReadResponseLast ||
		p[2].BTH.Opcode != wire.OpAcknowledge || p[2].AETH.Syndrome != wire.AETHNak|wire.NakPSNSeqError || p[2].BTH.PSN != 0x202 {
		t.Fatalf("sent %v (syndromes %v), want the two responses, then the NAK for PSN 0x202", p, syndromes(p))
	}
}

// TestResponderNoReadResources: a READ to a QP with max_dest_rd_atomic 0 is an invalid
// request.
func TestResponderNoReadResources(t *testing.T) {
	cfg := newRigConfig(Ordered)
	cfg.Attr.MaxDestRdAtomic = 0
	rg := newQPRig(t, cfg)
	_, ms := rg.mem(64)
	rg.deliver(rigPkt{Op: wire.OpReadRequest, PSN: 0x200, RETH: wire.RETH{VA: ms.IOVA(), RKey: ms.Key(), DMALen: 8}})
	wantAck(t, rg.sent(), wire.AETHNak|wire.NakInvalidRequest, 0x200)
	wantEvent(t, rg.takeEvents(), EventQPReqErr)
}

// TestResponderAbortFlushesWQEInProgress: a QP that enters ERR in the middle of a SEND
// completes the receive WQE the SEND took with WR_FLUSH_ERR, before the WQEs still
// posted.
func TestResponderAbortFlushesWQEInProgress(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	_, mb := rg.mem(4096)
	rg.postRecv(1, sge(mb, 0, 4096))
	rg.postRecv(2, sge(mb, 0, 4096))
	rg.deliver(rigPkt{Op: wire.OpSendFirst, PSN: 0x200, Payload: make([]byte, rigMTUBytes)})
	must(t, rg.qp.Modify(&Attr{State: StateErr}, MaskState, lim))
	wantStatuses(t, polled(rg.rcq), [2]uint64{1, uint64(StatusWRFlushErr)}, [2]uint64{2, uint64(StatusWRFlushErr)})
}

// TestResponderByState: a QP answers requests from RTR on, the first one raising the
// communication-established event (the application may move it to RTS); in RTR it takes
// no responses, and before RTR nothing.
func TestResponderByState(t *testing.T) {
	cfg := newRigConfig(Ordered)
	cfg.State = StateInit
	rg := newQPRig(t, cfg)
	_, md := rg.mem(64)
	w := func(psn wire.PSN) rigPkt {
		p := write(wire.OpWriteOnly, psn, md, md.IOVA(), 4, []byte("data"))
		p.AckReq = true
		return p
	}
	rg.deliver(w(0x200))
	if p := rg.sent(); len(p) != 0 || rg.qp.Stats().Dropped != 1 {
		t.Fatalf("in INIT: sent %v, %+v", p, rg.qp.Stats())
	}

	cfg.State = StateRTR
	rg = newQPRig(t, cfg)
	_, md = rg.mem(64)
	rg.deliver(w(0x200), okAck(0x100))
	wantAck(t, rg.sent(), ackSyn, 0x200)
	wantEvent(t, rg.takeEvents(), EventCommEst)
	rg.deliver(w(0x201))
	wantAck(t, rg.sent(), ackSyn, 0x201)
	if e := rg.takeEvents(); len(e) != 0 || rg.qp.Stats().Dropped != 1 {
		t.Fatalf("a second request in RTR: events %+v, %+v (the response in RTR dropped)", e, rg.qp.Stats())
	}
}
