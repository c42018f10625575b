package transport

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/wire"
)

// The completer's own tests, in ordered mode (ordered_completer.go), with the retry
// budgets and the RNR wait it owns (completer.go, rnr.go); weak mode's are in
// weak_completer_test.go.

// sends posts n signaled one-packet SENDs, WRIDs from first, and checks that they went out
// from PSN psn.
func (rg *qpRig) sends(first uint64, n int, psn wire.PSN) {
	rg.t.Helper()
	_, ms := rg.mem(64)
	for i := 0; i < n; i++ {
		rg.post(SendWR{WRID: first + uint64(i), Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{sge(ms, 0, 8)}})
	}
	wantSent(rg.t, rg.sent(), psn, repeat(wire.OpSendOnly, n)...)
}

// statuses returns the WRIDs and statuses of cqes, as pairs.
func statuses(cqes []CQE) [][2]uint64 {
	var s [][2]uint64
	for _, c := range cqes {
		s = append(s, [2]uint64{c.WRID, uint64(c.Status)})
	}
	return s
}

func wantStatuses(t *testing.T, cqes []CQE, want ...[2]uint64) {
	t.Helper()
	got := statuses(cqes)
	if len(got) != len(want) {
		t.Fatalf("completions (WRID, status) %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("completions (WRID, status) %v, want %v", got, want)
		}
	}
}

// TestCompleterCumulativeAck: an ACK completes, in order, the SEND and WRITE work
// requests all of whose PSNs it covers (one inside a message completes nothing);
// unsignaled ones leave no completion; an old ACK is a duplicate; one for a PSN never
// sent, or of the reserved AETH kind, is dropped.
func TestCompleterCumulativeAck(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	_, ms := rg.mem(4096)
	rg.post(SendWR{WRID: 1, Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{sge(ms, 0, 3000)}},
		SendWR{WRID: 2, Opcode: WRWrite, RemoteAddr: 0x1000, RKey: 1, SG: []SGE{sge(ms, 0, 8)}},
		SendWR{WRID: 3, Opcode: WRWrite, Flags: FlagSignaled, RemoteAddr: 0x1000, RKey: 1, SG: []SGE{sge(ms, 0, 8)}})
	wantSent(t, rg.sent(), 0x100, wire.OpSendFirst, wire.OpSendMiddle, wire.OpSendLast, wire.OpWriteOnly, wire.OpWriteOnly)
	rg.deliver(okAck(0x101))
	if c := polled(rg.scq); len(c) != 0 || rg.qp.req.una != 0x102 {
		t.Fatalf("an ACK inside the SEND: completions %+v, una %#x", c, uint32(rg.qp.req.una))
	}
	rg.deliver(ack(0x103, 0x40, 0)) // an AETH of the reserved kind: no acknowledgement
	if c := polled(rg.scq); len(c) != 0 || rg.qp.Stats().Dropped != 1 {
		t.Fatalf("reserved AETH: completions %+v, %+v", c, rg.qp.Stats())
	}
	rg.deliver(okAck(0x104))
	c := polled(rg.scq)
	wantStatuses(t, c, [2]uint64{1, 0}, [2]uint64{3, 0})
	if c[0].Opcode != WCSend || c[0].ByteLen != 3000 || c[1].Opcode != WCWrite || c[1].QPN != rg.qp.QPN() {
		t.Fatalf("completions %+v", c)
	}
	rg.deliver(okAck(0x102))  // old
	rg.deliver(okAck(0x1000)) // never sent
	if s := rg.qp.Stats(); s.Duplicates != 1 || s.Dropped != 2 || len(rg.sent()) != 0 {
		t.Fatalf("old and unsent ACKs: %+v", s)
	}
	// A weakly-ordered acknowledgement is not this mode's.
	rg.deliver(rigPkt{Op: wire.OpWeakAck, PSN: 0x104})
	if s := rg.qp.Stats(); s.WrongMode != 1 {
		t.Fatalf("weak ACK to an ordered QP: %+v", s)
	}
}

// TestCompleterSequenceNAK: a PSN sequence error NAK acknowledges what is before its PSN
// and sends the requester back there; the same NAK again without progress uses a retry,
// and with none left the QP fails with RETRY_EXC_ERR.
func TestCompleterSequenceNAK(t *testing.T) {
	cfg := newRigConfig(Ordered)
	cfg.Attr.RetryCnt = 1
	rg := newQPRig(t, cfg)
	rg.sends(0, 4, 0x100)
	rg.deliver(nak(0x102, wire.NakPSNSeqError))
	wantStatuses(t, polled(rg.scq), [2]uint64{0, 0}, [2]uint64{1, 0})
	wantSent(t, rg.sent(), 0x102, wire.OpSendOnly, wire.OpSendOnly)
	if s := rg.qp.Stats(); s.NAKsRecv != 1 || s.Retransmits != 2 || rg.qp.comp.retryLeft != 1 {
		t.Fatalf("after the first NAK: %+v, retries left %d", s, rg.qp.comp.retryLeft)
	}
	rg.deliver(nak(0x102, wire.NakPSNSeqError)) // again, no progress: a retry
	wantSent(t, rg.sent(), 0x102, wire.OpSendOnly, wire.OpSendOnly)
	if rg.qp.comp.retryLeft != 0 {
		t.Fatalf("retries left %d after a repeated NAK", rg.qp.comp.retryLeft)
	}
	rg.deliver(nak(0x102, wire.NakPSNSeqError)) // none left
	c := polled(rg.scq)
	wantStatuses(t, c, [2]uint64{2, uint64(StatusRetryExcErr)}, [2]uint64{3, uint64(StatusWRFlushErr)})
	if c[0].VendorErr != VendorRetryTimer || rg.qp.State() != StateErr || len(rg.sent()) != 0 {
		t.Fatalf("retry exhausted: %+v, state %v", c, rg.qp.State())
	}
}

// TestCompleterFatalNAKs: a NAK other than a sequence error acknowledges what is before
// its PSN, then fails the work request at its PSN with the status the NAK code maps to
// (the code in the vendor error) and the QP; the rest flush.
func TestCompleterFatalNAKs(t *testing.T) {
	for _, c := range []struct {
		code uint8
		st   uint8
	}{
		{wire.NakInvalidRequest, StatusRemInvReqErr},
		{wire.NakRemoteAccessError, StatusRemAccessErr},
		{wire.NakRemoteOpError, StatusRemOpErr},
		{wire.NakInvalidRDRequest, StatusRemInvReqErr},
	} {
		rg := newQPRig(t, newRigConfig(Ordered))
		rg.sends(0, 3, 0x100)
		rg.deliver(nak(0x101, c.code))
		cq := polled(rg.scq)
		wantStatuses(t, cq, [2]uint64{0, 0}, [2]uint64{1, uint64(c.st)}, [2]uint64{2, uint64(StatusWRFlushErr)})
		if cq[1].VendorErr != VendorRemoteNAK|uint32(c.code) || rg.qp.State() != StateErr {
			t.Fatalf("NAK code %d: %+v, state %v", c.code, cq[1], rg.qp.State())
		}
	}
}

// TestCompleterRetryBudget: each local ACK timeout uses a retry and sends again; progress
// (an ACK of something new) makes the budget whole again; a timeout with none left fails
// the QP with RETRY_EXC_ERR.
func TestCompleterRetryBudget(t *testing.T) {
	cfg := newRigConfig(Ordered)
	cfg.Attr.Timeout, cfg.Attr.RetryCnt = 10, 2
	rg := newQPRig(t, cfg)
	rto := wire.AckTimeout(10)
	rg.sends(0, 2, 0x100)
	rg.after(rto)
	wantSent(t, rg.sent(), 0x100, wire.OpSendOnly, wire.OpSendOnly)
	if rg.qp.comp.retryLeft != 1 {
		t.Fatalf("retries left %d after a timeout", rg.qp.comp.retryLeft)
	}
	rg.deliver(okAck(0x100))
	wantStatuses(t, polled(rg.scq), [2]uint64{0, 0})
	if rg.qp.comp.retryLeft != 2 {
		t.Fatalf("retries left %d after progress, want 2 again", rg.qp.comp.retryLeft)
	}
	for i := 0; i < 2; i++ {
		rg.after(rto)
		wantSent(t, rg.sent(), 0x101, wire.OpSendOnly)
	}
	rg.after(rto)
	c := polled(rg.scq)
	wantStatuses(t, c, [2]uint64{1, uint64(StatusRetryExcErr)})
	if c[0].VendorErr != VendorRetryTimer || rg.qp.State() != StateErr || rg.qp.Stats().Timeouts != 4 {
		t.Fatalf("retry exhausted: %+v, state %v, %+v", c, rg.qp.State(), rg.qp.Stats())
	}
}

// TestCompleterRNRWait: an RNR NAK acknowledges what is before its PSN, then the
// requester waits the timer the NAK asks for before sending again from there; each RNR
// NAK uses an RNR retry (7: forever), and with none left the QP fails with
// RNR_RETRY_EXC_ERR.
func TestCompleterRNRWait(t *testing.T) {
	cfg := newRigConfig(Ordered)
	cfg.Attr.RNRRetry = 1
	rg := newQPRig(t, cfg)
	rg.sends(0, 3, 0x100)
	const code = 14 // 0.96 ms
	rg.deliver(rnrNak(0x101, code))
	wantStatuses(t, polled(rg.scq), [2]uint64{0, 0})
	wait := wire.RNRTimer(code)
	rg.after(wait - 1)
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("sent during the RNR wait: %v", p)
	}
	rg.after(1)
	wantSent(t, rg.sent(), 0x101, wire.OpSendOnly, wire.OpSendOnly)
	if s := rg.qp.Stats(); s.RNRNAKsRecv != 1 || s.Timeouts != 0 || rg.qp.comp.rnrLeft != 0 || rg.qp.comp.retryLeft != 7 {
		t.Fatalf("after an RNR wait: %+v, RNR retries left %d, retries left %d", s, rg.qp.comp.rnrLeft, rg.qp.comp.retryLeft)
	}
	rg.deliver(rnrNak(0x101, code))
	c := polled(rg.scq)
	wantStatuses(t, c, [2]uint64{1, uint64(StatusRNRRetryExcErr)}, [2]uint64{2, uint64(StatusWRFlushErr)})
	if c[0].VendorErr != VendorRNRTimer {
		t.Fatalf("RNR retries exhausted: %+v", c[0])
	}

	// rnr_retry 7 retries forever.
	rg = newQPRig(t, newRigConfig(Ordered))
	rg.sends(0, 1, 0x100)
	for i := 0; i < 10; i++ {
		rg.deliver(rnrNak(0x100, code))
		rg.after(wait)
		wantSent(t, rg.sent(), 0x100, wire.OpSendOnly)
	}
	if rg.qp.comp.rnrLeft != 7 || rg.qp.State() != StateRTS {
		t.Fatalf("rnr_retry 7: %d left, state %v", rg.qp.comp.rnrLeft, rg.qp.State())
	}
}

// TestCompleterReadResponses: READ responses are placed in PSN order into the work
// request's scatter list and complete it at its last; one past a missing response sends
// the requester back to re-request from the missing PSN; an old one is a duplicate, one
// of the wrong length dropped.
func TestCompleterReadResponses(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	dst, md := rg.mem(4096)
	const raddr = 0x40000
	rg.post(SendWR{WRID: 9, Opcode: WRRead, Flags: FlagSignaled, RemoteAddr: raddr, RKey: 5, SG: []SGE{sge(md, 0, 1000), sge(md, 2000, 2000)}})
	wantSent(t, rg.sent(), 0x100, wire.OpReadRequest)
	data := testutil.Pattern(3000, 3)
	resp := func(op wire.Opcode, psn wire.PSN, from, to int) rigPkt {
		return rigPkt{Op: op, PSN: psn, AETH: wire.AETH{Syndrome: wire.AETHAck | wire.NoCredits}, Payload: data[from:to]}
	}
	rg.deliver(resp(wire.OpReadResponseFirst, 0x100, 0, 1024))
	rg.deliver(resp(wire.OpReadResponseLast, 0x102, 2048, 3000)) // the MIDDLE was lost
	p := rg.sent()
	if len(p) != 1 || p[0].BTH.Opcode != wire.OpReadRequest || p[0].BTH.PSN != 0x101 ||
		p[0].RETH.VA != raddr+1024 || p[0].RETH.DMALen != 3000-1024 {
		t.Fatalf("after a missing response: %v %+v, want the READ re-requested from PSN 0x101", p, p[0].RETH)
	}
	rg.deliver(resp(wire.OpReadResponseFirst, 0x100, 0, 1024))    // old
	rg.deliver(resp(wire.OpReadResponseFirst, 0x101, 1024, 2000)) // short
	if s := rg.qp.Stats(); s.OutOfSequence != 1 || s.Duplicates != 1 || s.Dropped != 1 || len(polled(rg.scq)) != 0 {
		t.Fatalf("counters %+v", s)
	}
	// The responder answers the re-request from 0x101 (FIRST there).
	rg.deliver(resp(wire.OpReadResponseFirst, 0x101, 1024, 2048), resp(wire.OpReadResponseLast, 0x102, 2048, 3000))
	c := wantCQE(t, polled(rg.scq), 9, StatusSuccess, WCRead)
	if c.ByteLen != 3000 || !bytes.Equal(dst[:1000], data[:1000]) || !bytes.Equal(dst[2000:4000], data[1000:]) {
		t.Fatalf("READ %+v: data not scattered as its SGEs say", c)
	}
	if rg.qp.req.rdOut != 0 {
		t.Fatalf("%d READs outstanding after the last response", rg.qp.req.rdOut)
	}
}

// TestCompleterAtomicAckAndLostResponses: an atomic ACK's original value lands in the
// work request's buffer; an ACK of a later request while a READ is still unanswered
// means its responses were lost: the requester goes back to ask again (and to send what
// follows) instead of moving past it.
func TestCompleterAtomicAckAndLostResponses(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Ordered))
	dst, md := rg.mem(64)
	rg.post(SendWR{WRID: 1, Opcode: WRAtomicFetch, Flags: FlagSignaled, RemoteAddr: 0x1000, RKey: 1, CompareAdd: 1, SG: []SGE{sge(md, 8, 8)}})
	wantSent(t, rg.sent(), 0x100, wire.OpFetchAdd)
	rg.deliver(rigPkt{Op: wire.OpAtomicAcknowledge, PSN: 0x100, AETH: wire.AETH{Syndrome: wire.AETHAck}, AtomicAck: 41})
	wantCQE(t, polled(rg.scq), 1, StatusSuccess, WCFetchAdd)
	if v := binary.NativeEndian.Uint64(dst[8:]); v != 41 {
		t.Fatalf("original value %d, want 41", v)
	}

	rg.post(SendWR{WRID: 2, Opcode: WRRead, Flags: FlagSignaled, RemoteAddr: 0x1000, RKey: 1, SG: []SGE{sge(md, 0, 8)}},
		SendWR{WRID: 3, Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{sge(md, 0, 8)}})
	wantSent(t, rg.sent(), 0x101, wire.OpReadRequest, wire.OpSendOnly)
	rg.deliver(okAck(0x102))
	wantSent(t, rg.sent(), 0x101, wire.OpReadRequest, wire.OpSendOnly)
	if c := polled(rg.scq); len(c) != 0 {
		t.Fatalf("completions past an unanswered READ: %+v", c)
	}
	rg.deliver(rigPkt{Op: wire.OpReadResponseOnly, PSN: 0x101, AETH: wire.AETH{Syndrome: wire.AETHAck}, Payload: []byte("response")}, okAck(0x102))
	wantStatuses(t, polled(rg.scq), [2]uint64{2, 0}, [2]uint64{3, 0})
	if string(dst[:8]) != "response" {
		t.Fatalf("READ data %q", dst[:8])
	}
}
