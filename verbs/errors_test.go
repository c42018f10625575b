package verbs_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// fastLink is a link whose retries end quickly: a 4.2 ms ACK timeout.
func fastLink(retry, rnrRetry uint8) link {
	l := defaultLink()
	l.Timeout, l.RetryCnt, l.RNRRetry = 10, retry, rnrRetry
	return l
}

// expectFlushed polls n completions from cq and checks they are flush errors for wrids
// in this order.
func expectFlushed(t *testing.T, cq *verbs.CQ, qp *verbs.QP, wrids ...uint64) {
	t.Helper()
	for i, wc := range pollN(t, cq, len(wrids)) {
		wantStatus(t, wc, wrids[i], verbs.WCWRFlushErr, qp)
	}
}

// expectState checks the QP's state.
func expectState(t *testing.T, qp *verbs.QP, want verbs.QPState) {
	t.Helper()
	if got := qp.State(); got != want {
		t.Errorf("QP %#x in %v, want %v", qp.QPNum(), got, want)
	}
	if a, _ := qp.QueryQP(); a.QPState != want {
		t.Errorf("QueryQP: QP %#x in %v, want %v", qp.QPNum(), a.QPState, want)
	}
}

// TestRemoteAccessErrors checks the responder's memory protection: an RDMA WRITE, READ or
// atomic with a wrong rkey, outside the region, to a region without the needed remote
// right, to a QP without the access flag, to a region of another PD or to a
// deregistered region fails with IBV_WC_REM_ACCESS_ERR at the requester (whose QP goes
// to ERR and flushes the rest of its work with IBV_WC_WR_FLUSH_ERR) and raises
// IBV_EVENT_QP_ACCESS_ERR at the responder (whose QP goes to ERR too); remote memory is
// not touched. A misaligned atomic fails with IBV_WC_REM_INV_REQ_ERR and
// IBV_EVENT_QP_REQ_ERR. The same in both delivery modes (weak mode NAKs in a SACK).
func TestRemoteAccessErrors(t *testing.T) { forEachOrdering(t, testRemoteAccessErrors) }

func testRemoteAccessErrors(t *testing.T, mode verbs.Ordering) {
	const size = 4096
	cases := []struct {
		name     string
		op       verbs.WROpcode
		mrAccess verbs.AccessFlags // of the target region
		qpAccess verbs.AccessFlags // of the responder QP
		otherPD  bool              // register the target in another PD
		aim      func(mr *verbs.MR) (addr uint64, rkey uint32)
		before   func(t *testing.T, b *side, mr *verbs.MR)
		status   verbs.WCStatus
		event    verbs.EventType
	}{
		{name: "WRITE wrong rkey", op: verbs.WRRDMAWrite, aim: wrongKey},
		{name: "WRITE_WITH_IMM wrong rkey", op: verbs.WRRDMAWriteWithImm, aim: wrongKey},
		{name: "READ wrong rkey", op: verbs.WRRDMARead, aim: wrongKey},
		{name: "atomic wrong rkey", op: verbs.WRAtomicFetchAndAdd, aim: wrongKey},
		{name: "WRITE past the end", op: verbs.WRRDMAWrite, aim: at(size - 10)},
		{name: "WRITE before the start", op: verbs.WRRDMAWrite, aim: at(-1)},
		{name: "READ past the end", op: verbs.WRRDMARead, aim: at(size - 99)},
		{name: "atomic past the end", op: verbs.WRAtomicCmpAndSwp, aim: at(size)},
		{name: "WRITE to a region without remote write", op: verbs.WRRDMAWrite, mrAccess: verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic},
		{name: "READ from a region without remote read", op: verbs.WRRDMARead, mrAccess: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic},
		{name: "atomic on a region without remote atomic", op: verbs.WRAtomicFetchAndAdd, mrAccess: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead},
		{name: "WRITE to a QP without remote write", op: verbs.WRRDMAWrite, qpAccess: verbs.AccessRemoteRead | verbs.AccessRemoteAtomic},
		{name: "READ from a QP without remote read", op: verbs.WRRDMARead, qpAccess: verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic},
		{name: "atomic on a QP without remote atomic", op: verbs.WRAtomicCmpAndSwp, qpAccess: verbs.AccessRemoteWrite | verbs.AccessRemoteRead},
		{name: "WRITE to a region of another PD", op: verbs.WRRDMAWrite, otherPD: true},
		{name: "READ from a region of another PD", op: verbs.WRRDMARead, otherPD: true},
		{name: "atomic on a region of another PD", op: verbs.WRAtomicFetchAndAdd, otherPD: true},
		{name: "WRITE to a deregistered region", op: verbs.WRRDMAWrite, before: func(t *testing.T, b *side, mr *verbs.MR) {
			if err := mr.DeregMR(); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "WRITE after remote write was revoked (RTS->RTS)", op: verbs.WRRDMAWrite, before: func(t *testing.T, b *side, mr *verbs.MR) {
			mustModify(t, b.qp, step{Attr: verbs.QPAttr{QPState: verbs.StateRTS, QPAccessFlags: verbs.AccessRemoteRead}, Mask: verbs.QPAttrState | verbs.QPAttrAccessFlags})
		}},
		{name: "misaligned atomic", op: verbs.WRAtomicFetchAndAdd, aim: at(20), status: verbs.WCRemInvReqErr, event: verbs.EventQPReqErr},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := defaultLink().InMode(mode)
			if c.qpAccess != 0 {
				l.Access = c.qpAccess
			}
			a, b := newPair(t, pairConfig{Link: l})
			if c.mrAccess == 0 {
				c.mrAccess = allAccess
			}
			pd := b.pd
			if c.otherPD {
				var err error
				if pd, err = b.ctx.AllocPD(); err != nil {
					t.Fatal(err)
				}
			}
			orig := pattern(size, 20)
			mr := mustReg(t, pd, append([]byte{}, orig...), c.mrAccess)
			if c.status == 0 {
				c.status, c.event = verbs.WCRemAccessErr, verbs.EventQPAccessErr
			}
			addr, rkey := mr.Addr()+64, mr.RKey()
			if c.aim != nil {
				addr, rkey = c.aim(mr)
			}
			if c.before != nil {
				c.before(t, b, mr)
			}
			local := mustReg(t, a.pd, pattern(size, 21), verbs.AccessLocalWrite)
			rbuf := mustReg(t, b.pd, make([]byte, 64), verbs.AccessLocalWrite)
			mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 50, SGList: sge(rbuf, 0, 64)}, verbs.RecvWR{WRID: 51})

			bad := verbs.SendWR{WRID: 1, Opcode: c.op, SendFlags: verbs.SendSignaled, RemoteAddr: addr, RKey: rkey,
				SGList: sge(local, 0, 100), CompareAdd: 1, Swap: 2, ImmData: 3}
			if c.op == verbs.WRAtomicCmpAndSwp || c.op == verbs.WRAtomicFetchAndAdd {
				bad.SGList = sge(local, 0, 8)
			}
			mustPostSend(t, a.qp, bad,
				verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SGList: sge(local, 0, 10)}, // unsignaled: flushed all the same
				verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled, SGList: sge(local, 0, 10),
					RemoteAddr: rbuf.Addr(), RKey: rbuf.RKey()})
			wantStatus(t, pollOne(t, a.scq), 1, c.status, a.qp)
			expectFlushed(t, a.scq, a.qp, 2, 3)
			expectState(t, a.qp, verbs.StateErr)

			ev := waitAsync(t, b.ctx, c.event)
			if ev.QP != b.qp {
				t.Errorf("%v event for QP %v, want the responder's", c.event, ev.QP)
			}
			expectState(t, b.qp, verbs.StateErr)
			expectFlushed(t, b.rcq, b.qp, 50, 51)
			settle(b.ctx)
			checkBytes(t, "target region", mr.Buf(), orig)
			checkBytes(t, "requester's buffer", local.Buf(), pattern(size, 21))
		})
	}
}

func wrongKey(mr *verbs.MR) (uint64, uint32) { return mr.Addr() + 64, mr.RKey() ^ 0x5A }

func at(off int) func(mr *verbs.MR) (uint64, uint32) {
	return func(mr *verbs.MR) (uint64, uint32) { return mr.Addr() + uint64(off), mr.RKey() }
}

// TestLocalProtectionErrors checks the requester's own memory protection: a send WR
// whose SGE has an unknown lkey, an lkey of another PD, or (for READ and atomics, which
// write locally) a region without local write completes
// with IBV_WC_LOC_PROT_ERR after the WRs before it, the QP goes to ERR and the rest is
// flushed; nothing reaches the peer. A receive WR with a bad lkey completes with
// IBV_WC_LOC_PROT_ERR at the responder when a SEND uses it, and the requester gets
// IBV_WC_REM_OP_ERR. (An SGE outside its region is refused by the post itself:
// TestSGEOutsideRegion.)
func TestLocalProtectionErrors(t *testing.T) {
	cases := []struct {
		name string
		wr   func(a *side, good, ro, otherPD *verbs.MR, remote *verbs.MR) verbs.SendWR
	}{
		{"SEND with an unknown lkey", func(a *side, good, ro, otherPD, remote *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.WRSend, SGList: []verbs.SGE{{Addr: good.Addr(), Length: 10, LKey: good.LKey() ^ 0x3C}}}
		}},
		{"SEND with a valid and an unknown lkey", func(a *side, good, ro, otherPD, remote *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.WRSend, SGList: []verbs.SGE{good.SGE(0, 5), {Addr: good.Addr(), Length: 10, LKey: 0}}}
		}},
		{"WRITE from another PD's region", func(a *side, good, ro, otherPD, remote *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.WRRDMAWrite, SGList: sge(otherPD, 0, 10), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
		}},
		{"READ into a region without local write", func(a *side, good, ro, otherPD, remote *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.WRRDMARead, SGList: sge(ro, 0, 10), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
		}},
		{"atomic into a region without local write", func(a *side, good, ro, otherPD, remote *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.WRAtomicFetchAndAdd, SGList: sge(ro, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := defaultPair(t)
			good := mustReg(t, a.pd, pattern(4096, 30), verbs.AccessLocalWrite)
			ro := mustReg(t, a.pd, make([]byte, 64), 0)
			pd2, err := a.ctx.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			otherPD := mustReg(t, pd2, make([]byte, 64), verbs.AccessLocalWrite)
			remote := mustReg(t, b.pd, make([]byte, 4096), allAccess)
			mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 70, SGList: sge(remote, 0, 4096)}, verbs.RecvWR{WRID: 71, SGList: sge(remote, 0, 4096)})
			bad := c.wr(a, good, ro, otherPD, remote)
			bad.WRID, bad.SendFlags = 2, verbs.SendSignaled
			mustPostSend(t, a.qp,
				verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled, SGList: sge(good, 0, 100),
					RemoteAddr: remote.Addr() + 1000, RKey: remote.RKey()},
				bad,
				verbs.SendWR{WRID: 3, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(good, 0, 10)})
			wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCRDMAWrite, a.qp)
			wantStatus(t, pollOne(t, a.scq), 2, verbs.WCLocProtErr, a.qp)
			expectFlushed(t, a.scq, a.qp, 3)
			expectState(t, a.qp, verbs.StateErr)
			settle(b.ctx)
			checkBytes(t, "remote memory", remote.Buf()[1000:1100], good.Buf()[:100])
			expectEmpty(t, b.rcq, "responder's receive CQ")
			checkBytes(t, "remote memory outside the first WRITE", remote.Buf()[:1000], make([]byte, 1000))
		})
	}

	t.Run("receive WR with an unknown lkey", func(t *testing.T) {
		a, b := defaultPair(t)
		src := mustReg(t, a.pd, pattern(100, 31), 0)
		dst := mustReg(t, b.pd, make([]byte, 100), verbs.AccessLocalWrite)
		// A bad lkey does not fail ibv_post_recv; it fails when the WR is used.
		mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 80, SGList: []verbs.SGE{{Addr: dst.Addr(), Length: 100, LKey: dst.LKey() ^ 0x11}}},
			verbs.RecvWR{WRID: 81, SGList: sge(dst, 0, 100)})
		mustPostSend(t, a.qp, verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 100)},
			verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 100)})
		wantStatus(t, pollOne(t, b.rcq), 80, verbs.WCLocProtErr, b.qp)
		expectFlushed(t, b.rcq, b.qp, 81)
		wantStatus(t, pollOne(t, a.scq), 1, verbs.WCRemOpErr, a.qp)
		expectFlushed(t, a.scq, a.qp, 2)
		expectState(t, a.qp, verbs.StateErr)
		expectState(t, b.qp, verbs.StateErr)
		checkBytes(t, "receive buffer", dst.Buf(), make([]byte, 100))
	})
}

// TestRNR checks receiver-not-ready handling: a SEND (or WRITE_WITH_IMM) arriving with no
// receive posted is RNR-NAKed; with rnr_retry 7 the requester retries forever and the
// message completes once a receive is posted; with rnr_retry 0 or 1 and no receive it
// fails with IBV_WC_RNR_RETRY_EXC_ERR after exactly rnr_retry retries. In both delivery
// modes (in weak mode each refused packet draws its own RNR NAK: see below).
func TestRNR(t *testing.T) { forEachOrdering(t, testRNR) }

func testRNR(t *testing.T, mode verbs.Ordering) {
	for _, op := range []verbs.WROpcode{verbs.WRSend, verbs.WRRDMAWriteWithImm} {
		t.Run(fmt.Sprintf("infinite/opcode %d", op), func(t *testing.T) {
			a, b := modePair(t, mode)
			src := mustReg(t, a.pd, pattern(5000, 40), 0)
			dst := mustReg(t, b.pd, make([]byte, 5000), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			mustPostSend(t, a.qp, verbs.SendWR{WRID: 1, Opcode: op, SendFlags: verbs.SendSignaled, ImmData: 9,
				SGList: sge(src, 0, 5000), RemoteAddr: dst.Addr(), RKey: dst.RKey()})
			waitUntil(t, "an RNR NAK", func() bool { return a.qp.Counters().RNRNAKsReceived > 0 })
			expectEmpty(t, a.scq, "send CQ while the receiver is not ready")
			rbuf := dst
			if op == verbs.WRRDMAWriteWithImm {
				rbuf = mustReg(t, b.pd, make([]byte, 8), verbs.AccessLocalWrite)
			}
			mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 2, SGList: sge(rbuf, 0, len(rbuf.Buf()))})
			wantOp := verbs.WCSend
			if op == verbs.WRRDMAWriteWithImm {
				wantOp = verbs.WCRDMAWrite
			}
			wantSendWC(t, pollOne(t, a.scq), 1, wantOp, a.qp)
			wc := pollOne(t, b.rcq)
			if wc.WRID != 2 || wc.Status != verbs.WCSuccess || wc.ByteLen != 5000 {
				t.Errorf("receive completion %+v", wc)
			}
			checkBytes(t, "message after RNR", dst.Buf(), src.Buf())
			if k := b.qp.Counters(); k.RNRNAKsSent == 0 {
				t.Errorf("responder counters %+v: no RNR NAK sent", k)
			}
			expectState(t, a.qp, verbs.StateRTS)
		})
	}
	for _, retry := range []uint8{0, 1, 3} {
		t.Run(fmt.Sprintf("rnr_retry %d", retry), func(t *testing.T) {
			// A long ACK timeout, so that no spurious retransmission draws an extra RNR NAK.
			l := defaultLink().InMode(mode)
			l.Timeout, l.RNRRetry = 16, retry
			a, b := newPair(t, pairConfig{Link: l})
			src := mustReg(t, a.pd, pattern(100, 41), 0)
			mustPostRecv(t, a.qp, verbs.RecvWR{WRID: 9})
			mustPostSend(t, a.qp,
				verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 100)},
				verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SGList: sge(src, 0, 100)})
			wantStatus(t, pollOne(t, a.scq), 1, verbs.WCRNRRetryExcErr, a.qp)
			expectFlushed(t, a.scq, a.qp, 2)
			expectFlushed(t, a.rcq, a.qp, 9)
			expectState(t, a.qp, verbs.StateErr)
			got := a.qp.Counters().RNRNAKsReceived
			switch {
			case mode == verbs.OrderingOrdered && got != uint64(retry)+1:
				t.Errorf("%d RNR NAKs received, want rnr_retry+1 = %d", got, retry+1)
			case mode == verbs.OrderingWeak && got < uint64(retry)+1:
				// Weak mode differs: the responder refuses every packet that finds no
				// receive WQE with an RNR NAK of its own (here both SENDs of every
				// attempt), so the requester counts more than one per attempt.
				// TestRNRRetryRounds checks that it still retries exactly rnr_retry times.
				t.Errorf("%d RNR NAKs received, want at least rnr_retry+1 = %d", got, retry+1)
			}
			expectState(t, b.qp, verbs.StateRTS) // an RNR NAK does not hurt the responder
		})
	}
}

// TestRetryExceeded checks transport retries: when the peer is gone, the requester
// retransmits on every local ACK timeout and after retry_cnt retries completes the oldest
// WR with IBV_WC_RETRY_EXC_ERR; the QP goes to ERR and every other outstanding send WR
// and every posted receive completes with IBV_WC_WR_FLUSH_ERR in posting order. In ERR,
// ibv_post_send and ibv_post_recv still accept work and complete it at once with flush
// errors. The same in weak mode: its loss probe resends without using retries, so the
// local ACK timeouts are counted the same way.
func TestRetryExceeded(t *testing.T) { forEachOrdering(t, testRetryExceeded) }

func testRetryExceeded(t *testing.T, mode verbs.Ordering) {
	for _, retry := range []uint8{0, 2} {
		t.Run(fmt.Sprintf("retry_cnt %d", retry), func(t *testing.T) {
			a, b := newPair(t, pairConfig{Link: fastLink(retry, 7).InMode(mode)})
			local := mustReg(t, a.pd, pattern(8192, 50), verbs.AccessLocalWrite)
			remote := mustReg(t, b.pd, make([]byte, 8192), allAccess)
			mustPostRecv(t, a.qp, verbs.RecvWR{WRID: 100, SGList: sge(local, 0, 10)}, verbs.RecvWR{WRID: 101})
			if err := b.ctx.Close(); err != nil {
				t.Fatal(err)
			}
			// A socket that never answers takes b's port: with the port closed, Linux's
			// ICMP port unreachable would fail the QP before its retries
			// (TestPeerPortClosed).
			silent, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(b.ctx.Addr()))
			if err != nil {
				t.Fatal(err)
			}
			defer silent.Close()
			mustPostSend(t, a.qp,
				verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(local, 0, 3000)},
				verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMAWrite, SGList: sge(local, 0, 5000), RemoteAddr: remote.Addr(), RKey: remote.RKey()},
				verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled, SGList: sge(local, 0, 100),
					RemoteAddr: remote.Addr(), RKey: remote.RKey()},
				verbs.SendWR{WRID: 4, Opcode: verbs.WRAtomicCmpAndSwp, SendFlags: verbs.SendSignaled, SGList: sge(local, 8000, 8),
					RemoteAddr: remote.Addr(), RKey: remote.RKey()},
				verbs.SendWR{WRID: 5, Opcode: verbs.WRSendWithImm, SGList: sge(local, 0, 1)},
			)
			wantStatus(t, pollOne(t, a.scq), 1, verbs.WCRetryExcErr, a.qp)
			expectFlushed(t, a.scq, a.qp, 2, 3, 4, 5)
			expectFlushed(t, a.rcq, a.qp, 100, 101)
			expectState(t, a.qp, verbs.StateErr)
			k := a.qp.Counters()
			if k.Timeouts != uint64(retry)+1 {
				t.Errorf("%d local ACK timeouts, want retry_cnt+1 = %d", k.Timeouts, retry+1)
			}
			if retry > 0 && k.Retransmits == 0 {
				t.Errorf("no retransmissions counted: %+v", k)
			}

			// Posting in ERR: accepted, flushed right away, in order, signaled or not.
			mustPostSend(t, a.qp,
				verbs.SendWR{WRID: 6, Opcode: verbs.WRSend, SGList: sge(local, 0, 10)},
				verbs.SendWR{WRID: 7, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled, SGList: sge(local, 0, 10),
					RemoteAddr: remote.Addr(), RKey: remote.RKey()})
			expectFlushed(t, a.scq, a.qp, 6, 7)
			mustPostRecv(t, a.qp, verbs.RecvWR{WRID: 102}, verbs.RecvWR{WRID: 103, SGList: sge(local, 0, 10)})
			expectFlushed(t, a.rcq, a.qp, 102, 103)
			expectEmpty(t, a.scq, "send CQ")
			checkBytes(t, "local buffer", local.Buf(), pattern(8192, 50))
		})
	}
}

// TestReceiveTooSmall checks a SEND larger than the posted receive buffer: the receive
// completes with IBV_WC_LOC_LEN_ERR, the requester gets IBV_WC_REM_INV_REQ_ERR, and both
// QPs go to ERR.
func TestReceiveTooSmall(t *testing.T) {
	for _, c := range []struct{ recv, send int }{{100, 101}, {2000, 3000}, {0, 1}} {
		t.Run(fmt.Sprintf("%d into %d", c.send, c.recv), func(t *testing.T) {
			a, b := defaultPair(t)
			src := mustReg(t, a.pd, pattern(c.send, 60), 0)
			dst := mustReg(t, b.pd, make([]byte, c.recv+1), verbs.AccessLocalWrite)
			mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: sge(dst, 0, c.recv)}, verbs.RecvWR{WRID: 2, SGList: sge(dst, 0, c.recv)})
			mustPostSend(t, a.qp, verbs.SendWR{WRID: 3, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, c.send)},
				verbs.SendWR{WRID: 4, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 1)})
			wantStatus(t, pollOne(t, b.rcq), 1, verbs.WCLocLenErr, b.qp)
			expectFlushed(t, b.rcq, b.qp, 2)
			wantStatus(t, pollOne(t, a.scq), 3, verbs.WCRemInvReqErr, a.qp)
			expectFlushed(t, a.scq, a.qp, 4)
			expectState(t, a.qp, verbs.StateErr)
			expectState(t, b.qp, verbs.StateErr)
			if dst.Buf()[c.recv] != 0 {
				t.Errorf("the SEND wrote past the receive buffer")
			}
		})
	}
}

// TestCQOverflow checks that more completions than a CQ holds raise IBV_EVENT_CQ_ERR for
// that CQ.
func TestCQOverflow(t *testing.T) {
	a, b := newPair(t, pairConfig{CQE: 4})
	src := mustReg(t, a.pd, pattern(10, 70), 0)
	dst := mustReg(t, b.pd, make([]byte, 10), verbs.AccessLocalWrite)
	if n := b.rcq.CQE(); n < 4 {
		t.Fatalf("CQ of 4 entries holds %d", n)
	}
	n := b.rcq.CQE() + 2
	for i := 0; i < n; i++ {
		mustPostRecv(t, b.qp, verbs.RecvWR{WRID: uint64(i), SGList: sge(dst, 0, 10)})
	}
	for i := 0; i < n; i++ {
		mustPostSend(t, a.qp, verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 10)})
		pollOne(t, a.scq) // keep the sender's CQ from overflowing
	}
	ev := waitAsync(t, b.ctx, verbs.EventCQErr)
	if ev.CQ != b.rcq || ev.QP != nil {
		t.Errorf("CQ error event for CQ %p (QP %v), want %p", ev.CQ, ev.QP, b.rcq)
	}
}

// TestCommEst checks IBV_EVENT_COMM_EST: the first packet arriving at a QP in RTR raises
// it for that QP (and the QP receives the message); it is raised once.
func TestCommEst(t *testing.T) {
	a, b := newSides(t, pairConfig{CQE: 64})
	connect(t, a.qp, 0x10, b.qp.Endpoint(0x20), defaultLink())
	toRTR(t, b.qp, a.qp.Endpoint(0x10), defaultLink()) // B stays in RTR
	src := mustReg(t, a.pd, pattern(2000, 80), 0)
	dst := mustReg(t, b.pd, make([]byte, 2000), verbs.AccessLocalWrite)
	mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: sge(dst, 0, 2000)}, verbs.RecvWR{WRID: 2, SGList: sge(dst, 0, 2000)})
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 2000)})
	ev := waitAsync(t, b.ctx, verbs.EventCommEst)
	if ev.QP != b.qp {
		t.Errorf("COMM_EST for QP %v, want the RTR QP", ev.QP)
	}
	if wc := pollOne(t, b.rcq); wc.WRID != 1 || wc.Status != verbs.WCSuccess || wc.ByteLen != 2000 {
		t.Errorf("receive in RTR: %+v", wc)
	}
	wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCSend, a.qp)
	checkBytes(t, "message received in RTR", dst.Buf(), src.Buf())

	mustModify(t, b.qp, rtsStep(0x20, defaultLink()))
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 2000)})
	wantSendWC(t, pollOne(t, a.scq), 2, verbs.WCSend, a.qp)
	pollOne(t, b.rcq)
	if ev, ok := b.ctx.TryGetAsyncEvent(); ok {
		b.ctx.AckAsyncEvent(ev)
		t.Errorf("unexpected second event %v (%s)", ev.Type, ev.Detail)
	}
	if ev, ok := a.ctx.TryGetAsyncEvent(); ok {
		a.ctx.AckAsyncEvent(ev)
		t.Errorf("unexpected event on the requester's device: %v (%s)", ev.Type, ev.Detail)
	}
}

// TestPostErrors checks ibv_post_send and ibv_post_recv argument errors: a WR with more
// SGEs than the QP allows, an atomic without exactly one 8-byte SGE, INLINE on READ or
// atomics, an unknown opcode, and a full send or receive queue are refused with a
// *PostError naming the WR; the WRs before it are posted (and complete), the ones after
// are not.
func TestPostErrors(t *testing.T) {
	cp := verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}
	a, b := newPair(t, pairConfig{Cap: cp})
	local := mustReg(t, a.pd, pattern(4096, 90), verbs.AccessLocalWrite)
	remote := mustReg(t, b.pd, make([]byte, 4096), allAccess)
	write := func(id uint64) verbs.SendWR {
		return verbs.SendWR{WRID: id, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled, SGList: sge(local, 0, 16),
			RemoteAddr: remote.Addr(), RKey: remote.RKey()}
	}
	atomic := verbs.SendWR{WRID: 2, Opcode: verbs.WRAtomicFetchAndAdd, SendFlags: verbs.SendSignaled, RemoteAddr: remote.Addr(), RKey: remote.RKey()}
	with := func(w verbs.SendWR, f func(*verbs.SendWR)) verbs.SendWR { f(&w); return w }
	cases := []struct {
		name    string
		bad     verbs.SendWR
		invalid bool // the error wraps ErrInvalid
	}{
		{"too many SGEs", with(write(2), func(w *verbs.SendWR) { w.SGList = []verbs.SGE{local.SGE(0, 1), local.SGE(1, 1), local.SGE(2, 1)} }), false},
		{"atomic with a 4-byte SGE", with(atomic, func(w *verbs.SendWR) { w.SGList = sge(local, 0, 4) }), false},
		{"atomic with two SGEs", with(atomic, func(w *verbs.SendWR) { w.SGList = []verbs.SGE{local.SGE(0, 4), local.SGE(4, 4)} }), false},
		{"atomic without SGE", atomic, false},
		{"inline READ", with(write(2), func(w *verbs.SendWR) { w.Opcode, w.SendFlags = verbs.WRRDMARead, verbs.SendInline }), false},
		{"inline atomic", with(atomic, func(w *verbs.SendWR) { w.SGList, w.SendFlags = sge(local, 0, 8), verbs.SendInline }), false},
		{"unknown opcode 7", with(write(2), func(w *verbs.SendWR) { w.Opcode = 7 }), true},
		{"unknown opcode -1", with(write(2), func(w *verbs.SendWR) { w.Opcode = -1 }), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := a.qp.PostSend([]verbs.SendWR{write(1), c.bad, write(3)})
			if idx := postIndex(err); idx != 1 {
				t.Fatalf("PostSend: %v, want a *PostError for index 1", err)
			}
			if c.invalid && !errors.Is(err, verbs.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCRDMAWrite, a.qp)
			expectEmpty(t, a.scq, "send CQ after the refused WR")
			expectState(t, a.qp, verbs.StateRTS)
		})
	}

	t.Run("send queue full", func(t *testing.T) {
		wrs := make([]verbs.SendWR, cp.MaxSendWR+1)
		for i := range wrs {
			wrs[i] = write(uint64(10 + i))
		}
		err := a.qp.PostSend(wrs)
		if idx := postIndex(err); idx != cp.MaxSendWR {
			t.Fatalf("PostSend of max_send_wr+1 WRs: %v, want a *PostError for index %d", err, cp.MaxSendWR)
		}
		for i, wc := range pollN(t, a.scq, cp.MaxSendWR) {
			wantSendWC(t, wc, uint64(10+i), verbs.WCRDMAWrite, a.qp)
		}
		expectEmpty(t, a.scq, "send CQ")
	})

	t.Run("receive errors", func(t *testing.T) {
		err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 1}, {WRID: 2, SGList: []verbs.SGE{remote.SGE(0, 1), remote.SGE(1, 1), remote.SGE(2, 1)}}})
		if idx := postIndex(err); idx != 1 {
			t.Errorf("PostRecv with too many SGEs: %v, want a *PostError for index 1", err)
		}
		wrs := make([]verbs.RecvWR, cp.MaxRecvWR)
		for i := range wrs {
			wrs[i] = verbs.RecvWR{WRID: uint64(10 + i), SGList: sge(remote, 0, 16)}
		}
		// One receive is already posted, so the last of these does not fit.
		err = b.qp.PostRecv(wrs)
		if idx := postIndex(err); idx != cp.MaxRecvWR-1 {
			t.Errorf("PostRecv beyond max_recv_wr: %v, want a *PostError for index %d", err, cp.MaxRecvWR-1)
		}
		// The receives that were posted are consumed in order.
		for i := 0; i < cp.MaxRecvWR; i++ {
			mustPostSend(t, a.qp, verbs.SendWR{WRID: 50, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(local, 0, 0)})
			pollOne(t, a.scq)
			want := uint64(1)
			if i > 0 {
				want = uint64(10 + i - 1)
			}
			if wc := pollOne(t, b.rcq); wc.WRID != want || wc.Status != verbs.WCSuccess {
				t.Errorf("receive %d: %+v, want WRID %d", i, wc, want)
			}
		}
	})
}

// TestAtomicConcurrent checks IBV_ATOMIC_HCA: fetch-and-adds from two requesters on two
// devices, arriving at two QPs of one device, are atomic with respect to each other: the
// final value is the sum and no value is fetched twice.
func TestAtomicConcurrent(t *testing.T) {
	ctxT := openDevice(t, ipB, verbs.DeviceConfig{})
	target := newSide(t, ctxT, defaultCap, 64, false)
	target2, err := target.pd.CreateQP(&verbs.QPInitAttr{SendCQ: target.scq, RecvCQ: target.rcq, Cap: defaultCap})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	mr := mustReg(t, target.pd, buf, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	const perQP = 500
	type client struct {
		*side
		res *verbs.MR
	}
	var clients []client
	for i, tq := range []*verbs.QP{target.qp, target2} {
		c := newSide(t, openDevice(t, ipA, verbs.DeviceConfig{}), defaultCap, 1024, false)
		connect(t, c.qp, uint32(i*1000), tq.Endpoint(uint32(i*1000+500)), defaultLink())
		connect(t, tq, uint32(i*1000+500), c.qp.Endpoint(uint32(i*1000)), defaultLink())
		clients = append(clients, client{c, mustReg(t, c.pd, make([]byte, 8*perQP), verbs.AccessLocalWrite)})
	}
	errs := make(chan error, len(clients))
	deadline := time.Now().Add(waitLimit)
	for _, c := range clients {
		go func() {
			wc := make([]verbs.WorkCompletion, 1)
			for i := 0; i < perQP; i++ {
				if err := c.qp.PostSend([]verbs.SendWR{{WRID: uint64(i), Opcode: verbs.WRAtomicFetchAndAdd, SendFlags: verbs.SendSignaled,
					SGList: sge(c.res, 8*i, 8), RemoteAddr: mr.Addr(), RKey: mr.RKey(), CompareAdd: 1}}); err != nil {
					errs <- err
					return
				}
				for c.scq.PollCQ(wc) == 0 {
					if time.Now().After(deadline) {
						errs <- fmt.Errorf("timed out waiting for fetch-and-add %d", i)
						return
					}
					driveProgress()
				}
				if wc[0].Status != verbs.WCSuccess || wc[0].WRID != uint64(i) {
					errs <- fmt.Errorf("completion %+v", wc[0])
					return
				}
			}
			errs <- nil
		}()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	settle(ctxT)
	seen := map[uint64]bool{}
	for _, c := range clients {
		for i := 0; i < perQP; i++ {
			v := binary.NativeEndian.Uint64(c.res.Buf()[8*i:])
			if seen[v] {
				t.Errorf("value %d fetched twice", v)
			}
			seen[v] = true
		}
	}
	if got := binary.NativeEndian.Uint64(buf); got != 2*perQP {
		t.Errorf("target %d after %d fetch-and-adds of 1", got, 2*perQP)
	}
}
