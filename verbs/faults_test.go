package verbs_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/verbs"
)

// retryLink recovers from lost packets reasonably quickly (33.6 ms ACK timeout) without
// giving up early: 7 retries without progress take 270 ms, well above the time a device
// can go without being scheduled on a loaded machine (its receive goroutine holds the
// receive path while it polls the socket, and can be descheduled there).
func retryLink() link {
	l := defaultLink()
	l.Timeout = 13
	return l
}

// anyPSN matches every PSN in a packetFilter.
const anyPSN = ^uint32(0)

// packetFilter returns a filter that applies act to the first datagram with BTH opcode op
// and PSN psn (or any PSN) and lets every other datagram through untouched. hits counts
// the datagrams it acted on.
func packetFilter(op wire.Opcode, psn uint32, act netio.Action, hits *atomic.Int32) netio.FilterFunc {
	return func(pkt []byte) netio.Verdict {
		if len(pkt) < wire.BTHLen || wire.Opcode(pkt[0]) != op {
			return netio.Verdict{Action: netio.Deliver}
		}
		p := uint32(pkt[9])<<16 | uint32(pkt[10])<<8 | uint32(pkt[11])
		if psn != anyPSN && p != psn {
			return netio.Verdict{Action: netio.Deliver}
		}
		if !hits.CompareAndSwap(0, 1) {
			return netio.Verdict{Action: netio.Deliver}
		}
		return netio.Verdict{Action: act, After: 3}
	}
}

// TestCounters checks the device and QP packet counters: a transfer moves TxPackets,
// TxBytes, RxPackets and RxBytes on both QPs and both devices; device counters keep the
// counts of destroyed QPs; packets for a QP that does not exist are counted as UnknownQP.
func TestCounters(t *testing.T) {
	a, b := defaultPair(t)
	devA0, devB0 := a.ctx.Counters(), b.ctx.Counters()
	qpA0, qpB0 := a.qp.Counters(), b.qp.Counters()
	const n = 100 << 10 // 100 packets at MTU 1024
	src := mustReg(t, a.pd, pattern(n, 100), 0)
	dst := mustReg(t, b.pd, make([]byte, n), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
		SGList: sge(src, 0, n), RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCRDMAWrite, a.qp)
	settle(b.ctx)
	checkBytes(t, "written", dst.Buf(), src.Buf())

	// The requester's counters are final once the completion is there; the responder
	// counted each request before acknowledging it.
	qpA, qpB := a.qp.Counters(), b.qp.Counters()
	devA, devB := a.ctx.Counters(), b.ctx.Counters()
	grew := []struct {
		name      string
		before    uint64
		after     uint64
		atLeastBy uint64
	}{
		{"requester QP TxPackets", qpA0.TxPackets, qpA.TxPackets, 100},
		{"requester QP TxBytes", qpA0.TxBytes, qpA.TxBytes, n},
		{"requester QP RxPackets", qpA0.RxPackets, qpA.RxPackets, 1},
		{"requester QP RxBytes", qpA0.RxBytes, qpA.RxBytes, 1},
		{"responder QP RxPackets", qpB0.RxPackets, qpB.RxPackets, 100},
		{"responder QP RxBytes", qpB0.RxBytes, qpB.RxBytes, n},
		{"responder QP TxPackets", qpB0.TxPackets, qpB.TxPackets, 1},
		{"requester device TxPackets", devA0.TxPackets, devA.TxPackets, 100},
		{"requester device RxPackets", devA0.RxPackets, devA.RxPackets, 1},
		{"responder device RxPackets", devB0.RxPackets, devB.RxPackets, 100},
		{"responder device TxPackets", devB0.TxPackets, devB.TxPackets, 1},
	}
	for _, g := range grew {
		if g.after < g.before+g.atLeastBy {
			t.Errorf("%s went from %d to %d, want at least +%d", g.name, g.before, g.after, g.atLeastBy)
		}
	}
	if devA.TxPackets < qpA.TxPackets || devB.RxPackets < qpB.RxPackets {
		t.Errorf("device counters below their QP's: device A Tx %d < QP %d or device B Rx %d < QP %d",
			devA.TxPackets, qpA.TxPackets, devB.RxPackets, qpB.RxPackets)
	}
	if devA.FaultsLost+devA.FaultsDuplicated+devA.FaultsReordered+devA.FaultsCorrupted != 0 {
		t.Errorf("fault counters move without fault injection: %+v", devA)
	}

	// Destroying the QP keeps its counts in the device's.
	if err := b.qp.DestroyQP(); err != nil {
		t.Fatal(err)
	}
	if k := b.ctx.Counters(); k.RxPackets < devB.RxPackets || k.TxPackets < devB.TxPackets {
		t.Errorf("device counters went down after DestroyQP: %+v, before %+v", k, devB)
	}
	// Requests for the destroyed QP are counted as for an unknown QP.
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SGList: sge(src, 0, 10)})
	waitUntil(t, "an UnknownQP count on the responder's device", func() bool { return b.ctx.Counters().UnknownQP > 0 })
}

// TestPacketLoss checks the RC reliability rules with exact faults: whichever single
// request, response or acknowledgement is lost, duplicated, delayed or corrupted, the
// requester recovers (PSN sequence NAK and go-back-N, or local ACK timeout and
// retransmission), the data arrives intact and exactly once, atomics are executed once
// (a repeated request is answered from the responder's resources), every completion is
// successful and in order, and the counters show what happened.
func TestPacketLoss(t *testing.T) {
	const psnA = faultPSN
	cases := []faultCase{
		{"WRITE middle lost", faultWrite, false, wire.OpWriteMiddle, psnA + 4, netio.Drop, func(k pktCounters) error {
			if k.qpA.Retransmits == 0 || k.qpA.NAKsReceived == 0 || k.qpB.OutOfSequence == 0 || k.qpB.NAKsSent == 0 || k.devA.FaultsLost != 1 {
				return fmt.Errorf("want a sequence NAK, retransmissions and one lost packet")
			}
			return nil
		}},
		{"SEND first lost", faultSend, false, wire.OpSendFirst, psnA, netio.Drop, wantRetransmits},
		{"SEND last lost", faultSend, false, wire.OpSendLast, psnA + 19, netio.Drop, wantTimeout},
		{"SEND only lost", faultSendOnly, false, wire.OpSendOnly, psnA, netio.Drop, wantTimeout},
		{"WRITE first lost", faultWrite, false, wire.OpWriteFirst, psnA, netio.Drop, wantRetransmits},
		{"WRITE last lost", faultWrite, false, wire.OpWriteLast, psnA + 19, netio.Drop, wantTimeout},
		{"READ request lost", faultRead, false, wire.OpReadRequest, psnA, netio.Drop, wantTimeout},
		{"atomic request lost", faultFetchAdd, false, wire.OpFetchAdd, psnA, netio.Drop, wantTimeout},
		// Whether a timeout is needed depends on whether the responder acknowledges again.
		{"ACK lost", faultWrite, true, wire.OpAcknowledge, anyPSN, netio.Drop, nil},
		{"READ response first lost", faultRead, true, wire.OpReadResponseFirst, psnA, netio.Drop, wantRetransmits},
		{"READ response middle lost", faultRead, true, wire.OpReadResponseMiddle, psnA + 7, netio.Drop, wantRetransmits},
		{"READ response last lost", faultRead, true, wire.OpReadResponseLast, psnA + 19, netio.Drop, wantTimeout},
		{"atomic response lost", faultFetchAdd, true, wire.OpAtomicAcknowledge, psnA, netio.Drop, func(k pktCounters) error {
			if k.qpA.Timeouts == 0 || k.qpB.Duplicates == 0 {
				return fmt.Errorf("want a timeout and a duplicate atomic at the responder")
			}
			return nil
		}},
		{"SEND only duplicated", faultSendOnly, false, wire.OpSendOnly, psnA, netio.Duplicate, wantDuplicate},
		{"SEND middle duplicated", faultSend, false, wire.OpSendMiddle, psnA + 5, netio.Duplicate, wantDuplicate},
		{"WRITE last duplicated", faultWrite, false, wire.OpWriteLast, psnA + 19, netio.Duplicate, wantDuplicate},
		{"READ request duplicated", faultRead, false, wire.OpReadRequest, psnA, netio.Duplicate, wantDuplicate},
		{"atomic request duplicated", faultFetchAdd, false, wire.OpFetchAdd, psnA, netio.Duplicate, wantDuplicate},
		{"READ response duplicated", faultRead, true, wire.OpReadResponseMiddle, psnA + 3, netio.Duplicate, func(k pktCounters) error {
			if k.qpA.Duplicates == 0 {
				return fmt.Errorf("want a duplicate response at the requester")
			}
			return nil
		}},
		{"SEND middle delayed", faultSend, false, wire.OpSendMiddle, psnA + 2, netio.Delay, wantRetransmits},
		{"WRITE middle delayed", faultWrite, false, wire.OpWriteMiddle, psnA + 10, netio.Delay, wantRetransmits},
		{"READ response middle delayed", faultRead, true, wire.OpReadResponseMiddle, psnA + 10, netio.Delay, wantRetransmits},
		// The WRITE's MIDDLE and LAST packets are placed as their ICRC is checked, the
		// corrupted one too: the retransmission must overwrite what it left.
		{"WRITE middle corrupted", faultWrite, false, wire.OpWriteMiddle, psnA + 6, netio.Corrupt, func(k pktCounters) error {
			if k.devB.ICRCErrors == 0 || k.qpA.Retransmits == 0 {
				return fmt.Errorf("want an ICRC error at the responder's device and retransmissions")
			}
			if k.devB.DirectPlaced == 0 {
				return fmt.Errorf("no packet placed as its ICRC was checked")
			}
			return nil
		}},
		{"SEND only corrupted", faultSendOnly, false, wire.OpSendOnly, psnA, netio.Corrupt, func(k pktCounters) error {
			if k.devB.ICRCErrors == 0 || k.qpA.Timeouts == 0 {
				return fmt.Errorf("want an ICRC error at the responder's device and a timeout")
			}
			return nil
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { runFaultCase(t, retryLink(), c, 101, nil) })
	}
}

// faultPSN and faultLen are a fault case's first PSN and message length: its first work
// request takes PSNs faultPSN..faultPSN+0x13 at MTU 1024.
const faultPSN, faultLen = 0x100, 20 << 10

// faultKind is the operation a fault case runs.
type faultKind int

const (
	faultSend     faultKind = iota // a 20-packet SEND
	faultSendOnly                  // a one-packet SEND
	faultWrite                     // a 20-packet RDMA WRITE
	faultRead                      // a 20-packet RDMA READ
	faultFetchAdd                  // a fetch-and-add
)

// faultCase is one case of TestPacketLoss and TestWeakPacketLoss: an operation, the
// packet a filter acts on (the first with this opcode and PSN, or any PSN) and what it does
// to it, on the requester's device or, if onB, on the responder's (responses, ACKs), and
// what the counters must show after the repair.
type faultCase struct {
	name   string
	op     faultKind
	onB    bool
	opcode wire.Opcode
	psn    uint32
	act    netio.Action
	check  func(k pktCounters) error
}

// runFaultCase runs c on a fresh pair connected by l: the work request and a follow-up
// message complete, the data is right (seed: the pattern of the source, seed+1 of the
// responder's region), the responder's receive WRs are each consumed once, in order, both
// QPs stay in RTS, the filter matched once and c.check holds (the case is skipped when the
// check finds the machine too busy to judge). after, if set, checks the pair at the end.
func runFaultCase(t *testing.T, l link, c faultCase, seed uint64, after func(a, b *side)) {
	const n = faultLen
	var hits atomic.Int32
	f := packetFilter(c.opcode, c.psn, c.act, &hits)
	pc := pairConfig{Link: l, PSNA: faultPSN, PSNB: 0x900}
	if c.onB {
		pc.DevB = verbs.WithFilter(pc.DevB, f)
	} else {
		pc.DevA = verbs.WithFilter(pc.DevA, f)
	}
	a, b := newPair(t, pc)
	src := mustReg(t, a.pd, pattern(n, seed), verbs.AccessLocalWrite)
	back := mustReg(t, a.pd, make([]byte, n), verbs.AccessLocalWrite)
	remoteOrig := pattern(n, seed+1)
	dst := mustReg(t, b.pd, bytes.Clone(remoteOrig), allAccess)
	dst2 := mustReg(t, b.pd, make([]byte, n), verbs.AccessLocalWrite)
	ctr := atomicTarget(t, b, 41)
	mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: sge(dst2, 0, n)}, verbs.RecvWR{WRID: 2, SGList: sge(dst2, 0, n)})

	wr := verbs.SendWR{WRID: 10, SendFlags: verbs.SendSignaled, RemoteAddr: dst.Addr(), RKey: dst.RKey()}
	wantOp := verbs.WCSend
	switch c.op {
	case faultSend:
		wr.Opcode, wr.SGList = verbs.WRSend, sge(src, 0, n)
	case faultSendOnly:
		wr.Opcode, wr.SGList = verbs.WRSend, sge(src, 0, 100)
	case faultWrite:
		wr.Opcode, wr.SGList, wantOp = verbs.WRRDMAWrite, sge(src, 0, n), verbs.WCRDMAWrite
	case faultRead:
		wr.Opcode, wr.SGList, wantOp = verbs.WRRDMARead, sge(back, 0, n), verbs.WCRDMARead
	case faultFetchAdd:
		wr.Opcode, wr.SGList, wantOp = verbs.WRAtomicFetchAndAdd, sge(back, 0, 8), verbs.WCFetchAdd
		wr.RemoteAddr, wr.RKey, wr.CompareAdd = ctr.Addr()+16, ctr.RKey(), 1
	}
	mustPostSend(t, a.qp, wr)
	wantSendWC(t, pollOne(t, a.scq), 10, wantOp, a.qp)
	// A follow-up message (only now, so that its ACK does not cover for a lost one).
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 11, Opcode: verbs.WRSendWithImm, ImmData: 77, SendFlags: verbs.SendSignaled,
		SGList: sge(src, 0, 10)})
	wantSendWC(t, pollOne(t, a.scq), 11, verbs.WCSend, a.qp)

	// Every receive WR is consumed once, in order.
	settle(a.ctx, b.ctx)
	followUp := uint64(1)
	switch c.op {
	case faultSend, faultSendOnly:
		size := n
		if c.op == faultSendOnly {
			size = 100
		}
		if wc := pollOne(t, b.rcq); wc.WRID != 1 || wc.Status != verbs.WCSuccess || wc.ByteLen != uint32(size) {
			t.Errorf("receive completion %+v, want WRID 1 with %d bytes", wc, size)
		}
		checkBytes(t, "SEND", dst2.Buf()[:size], src.Buf()[:size])
		followUp = 2
	case faultWrite:
		checkBytes(t, "WRITE", dst.Buf(), src.Buf())
	case faultRead:
		checkBytes(t, "READ", back.Buf(), remoteOrig)
	case faultFetchAdd:
		if got := binary.NativeEndian.Uint64(back.Buf()); got != 41 {
			t.Errorf("fetch-and-add returned %d, want 41", got)
		}
		if got := binary.NativeEndian.Uint64(ctr.Buf()[16:]); got != 42 {
			t.Errorf("target %d after one fetch-and-add to 41: executed %d times", got, got-41)
		}
	}
	if wc := pollOne(t, b.rcq); wc.WRID != followUp || wc.Status != verbs.WCSuccess || wc.ImmData != 77 {
		t.Errorf("follow-up receive completion %+v, want WRID %d with immediate 77", wc, followUp)
	}
	expectEmpty(t, b.rcq, "responder's receive CQ")
	expectState(t, a.qp, verbs.StateRTS)
	expectState(t, b.qp, verbs.StateRTS)
	if after != nil {
		after(a, b)
	}
	if hits.Load() != 1 {
		t.Fatalf("the filter never matched a %v packet with PSN %#x", c.opcode, c.psn)
	}
	if c.check == nil {
		return
	}
	if err := c.check(pktCounters{a.qp.Counters(), b.qp.Counters(), a.ctx.Counters(), b.ctx.Counters()}); errors.Is(err, errBusyMachine) {
		t.Skipf("%v: the repair cannot be judged", err)
	} else if err != nil {
		t.Errorf("%v\nrequester QP %+v\nresponder QP %+v\nrequester device %+v\nresponder device %+v", err,
			a.qp.Counters(), b.qp.Counters(), a.ctx.Counters(), b.ctx.Counters())
	}
}

// pktCounters are the counters TestPacketLoss checks: both QPs' and both devices'.
type pktCounters struct{ qpA, qpB, devA, devB verbs.Counters }

func wantRetransmits(k pktCounters) error {
	if k.qpA.Retransmits == 0 {
		return fmt.Errorf("want retransmissions")
	}
	return nil
}

func wantTimeout(k pktCounters) error {
	if k.qpA.Timeouts == 0 || k.qpA.Retransmits == 0 {
		return fmt.Errorf("want a local ACK timeout and a retransmission")
	}
	return nil
}

func wantDuplicate(k pktCounters) error {
	if k.qpB.Duplicates == 0 || k.devA.FaultsDuplicated != 1 {
		return fmt.Errorf("want a duplicate request at the responder")
	}
	return nil
}

// soakStream is one direction of TestSoak's traffic: work requests posted on a QP with
// a bounded number outstanding, whose completions must all succeed in posting order, and
// the receives they consume at the peer, which must too.
type soakStream struct {
	name     string
	qp       *verbs.QP
	peer     *verbs.QP // the responder's QP (for the failure report)
	scq      *verbs.CQ // the sender's send CQ
	peerRCQ  *verbs.CQ // the receiver's receive CQ
	wrs      []verbs.SendWR
	recvs    []verbs.WorkCompletion // the receive completions expected, in order
	posted   int
	complete int
	received int
}

const soakDepth = 16 // WRs outstanding per stream

// expectRecv notes that wr consumes the peer's next receive, posted with WRID id.
func (s *soakStream) expectRecv(wr verbs.SendWR, id uint64) {
	w := verbs.WorkCompletion{WRID: id, Opcode: verbs.WCRecv}
	for _, e := range wr.SGList {
		w.ByteLen += e.Length
	}
	switch wr.Opcode {
	case verbs.WRRDMAWriteWithImm:
		w.Opcode = verbs.WCRecvRDMAWithImm
		fallthrough
	case verbs.WRSendWithImm:
		w.ImmData, w.WCFlags = wr.ImmData, verbs.WCWithImm
	}
	s.recvs = append(s.recvs, w)
}

// step posts what the window allows and checks the completions that arrived. It
// returns an error for a failed or out-of-order completion.
func (s *soakStream) step(wc []verbs.WorkCompletion) error {
	for s.posted < len(s.wrs) && s.posted-s.complete < soakDepth {
		if err := s.qp.PostSend(s.wrs[s.posted : s.posted+1]); err != nil {
			return fmt.Errorf("%s: PostSend: %v", s.name, err)
		}
		s.posted++
	}
	k := s.scq.PollCQ(wc)
	for _, w := range wc[:k] {
		if w.Status != verbs.WCSuccess || w.WRID != s.wrs[s.complete].WRID {
			var peer verbs.Counters
			var holes [2]any
			holes[0] = s.qp.Holes()
			if s.peer != nil {
				peer, holes[1] = s.peer.Counters(), s.peer.Holes()
			}
			return fmt.Errorf("%s: completion %+v (%v), want WRID %d success; requester %+v\nresponder %+v\nholes requester %+v responder %+v",
				s.name, w, w.Status, s.wrs[s.complete].WRID, s.qp.Counters(), peer, holes[0], holes[1])
		}
		s.complete++
	}
	k = s.peerRCQ.PollCQ(wc)
	for _, w := range wc[:k] {
		want := s.recvs[s.received]
		want.Status, want.QPNum, want.SrcQP = verbs.WCSuccess, w.QPNum, s.qp.QPNum()
		if w != want {
			return fmt.Errorf("%s: receive completion %+v (%v), want %+v", s.name, w, w.Status, want)
		}
		s.received++
	}
	return nil
}

func (s *soakStream) done() bool { return s.complete == len(s.wrs) && s.received == len(s.recvs) }

// soakFaults is the fault injection of TestSoak and TestSoakWeak, on both devices.
var soakFaults = verbs.Faults{Loss: 0.02, Reorder: 0.02, Dup: 0.01}

// TestSoak moves 64 MiB from A to B as a random mix of RDMA WRITE, SEND and RDMA READ
// chunks (plus fetch-and-adds), and at the same time 16 MiB from B to A as RDMA WRITE,
// WRITE with immediate and SEND with immediate chunks, through two devices that both
// lose, reorder and duplicate packets, starting just below the PSN wrap: every
// completion must be successful and in posting order, every byte must arrive, and every
// atomic must be executed exactly once.
func TestSoak(t *testing.T) { soak(t, verbs.OrderingOrdered, soakFaults) }

// TestSoakCorrupt is TestSoak with 1% of the datagrams corrupted as well: ordered mode
// copies the payload of a WRITE's MIDDLE and LAST packets into place as it checks their
// ICRC, so a corrupted one's bytes land before it is dropped and must be overwritten by
// its retransmission before the WRITE completes.
func TestSoakCorrupt(t *testing.T) {
	f := soakFaults
	f.Corrupt = 0.01
	soak(t, verbs.OrderingOrdered, f)
}

// TestSoakWeak is TestSoak with both QPs in weak mode: packets are placed out of order and
// only lost ones are sent again, but completions still come in posting order, every byte
// arrives and every atomic is executed once; when it is over no hole is left open.
func TestSoakWeak(t *testing.T) { soak(t, verbs.OrderingWeak, soakFaults) }

// TestSoakWeakHeavy is TestSoakWeak through much worse links: 5% of the datagrams lost,
// 10% reordered, 2% duplicated and 1% corrupted, on both devices.
func TestSoakWeakHeavy(t *testing.T) {
	soak(t, verbs.OrderingWeak, verbs.Faults{Loss: 0.05, Reorder: 0.10, Dup: 0.02, Corrupt: 0.01})
}

// soak runs the soak test with both QPs in delivery mode mode and faults (seeded 11 on A
// and 12 on B) on both devices.
func soak(t *testing.T, mode verbs.Ordering, faults verbs.Faults) {
	if testing.Short() {
		t.Skip("soak test skipped in -short mode")
	}
	start := time.Now()
	// A 67 ms ACK timeout: ordered mode recovers tail losses with it, and on a machine
	// busy with other work a shorter one can run out of its 7 retries while the
	// responder waits for the CPU (33.6 ms did, under load, in 3 of 6 runs).
	l := retryLink().InMode(mode)
	l.Timeout = 14
	if mode == verbs.OrderingWeak {
		// Weak mode finds losses by SACK and its 4 ms loss probe; the ACK timeout is the
		// last resort: 268 ms leaves room.
		l.Timeout = 16
	}
	l.MTU = verbs.MTU4096
	totalAB, totalBA := 64<<20, 16<<20
	if testutil.Race {
		// About ten times slower: a quarter of the data, and a 67 ms ACK timeout.
		totalAB, totalBA, l.Timeout = 16<<20, 4<<20, 14
	}
	fa, fb := faults, faults
	fa.Seed, fb.Seed = 11, 12
	pc := pairConfig{Link: l, PSNA: 0xFFFF00, PSNB: 0xFFFFF0,
		DevA: verbs.DeviceConfig{Faults: &fa},
		DevB: verbs.DeviceConfig{Faults: &fb},
	}
	a, b := newPair(t, pc)
	srcA := mustReg(t, a.pd, pattern(totalAB, 200), verbs.AccessLocalWrite)
	back := mustReg(t, a.pd, make([]byte, totalAB), verbs.AccessLocalWrite)
	results := mustReg(t, a.pd, make([]byte, 8*1024), verbs.AccessLocalWrite)
	dstA := mustReg(t, a.pd, make([]byte, totalBA), allAccess)
	remoteOrig := pattern(totalAB, 201)
	dstB := mustReg(t, b.pd, append([]byte{}, remoteOrig...), allAccess)
	srcB := mustReg(t, b.pd, pattern(totalBA, 202), verbs.AccessLocalWrite)
	ctr := atomicTarget(t, b, 0)
	rng := rand.New(rand.NewPCG(1, 2))

	// A to B.
	type chunk struct {
		op       verbs.WROpcode
		off, len int
	}
	var chunks []chunk
	ab := &soakStream{name: "A to B", qp: a.qp, peer: b.qp, scq: a.scq, peerRCQ: b.rcq}
	nAtomics := 0
	for off := 0; off < totalAB; {
		n := min(1+rng.IntN(1<<20), totalAB-off)
		op := []verbs.WROpcode{verbs.WRRDMAWrite, verbs.WRSend, verbs.WRRDMARead}[rng.IntN(3)]
		chunks = append(chunks, chunk{op, off, n})
		wr := verbs.SendWR{WRID: uint64(len(ab.wrs)), Opcode: op, SendFlags: verbs.SendSignaled,
			SGList: sge(srcA, off, n), RemoteAddr: dstB.Addr() + uint64(off), RKey: dstB.RKey()}
		switch op {
		case verbs.WRSend:
			mustPostRecv(t, b.qp, verbs.RecvWR{WRID: wr.WRID, SGList: sge(dstB, off, n)})
			ab.expectRecv(wr, wr.WRID)
		case verbs.WRRDMARead:
			wr.SGList = sge(back, off, n)
		}
		ab.wrs = append(ab.wrs, wr)
		if len(chunks)%4 == 0 {
			ab.wrs = append(ab.wrs, verbs.SendWR{WRID: uint64(len(ab.wrs)), Opcode: verbs.WRAtomicFetchAndAdd,
				SendFlags: verbs.SendSignaled, SGList: sge(results, 8*nAtomics, 8), RemoteAddr: ctr.Addr() + 16,
				RKey: ctr.RKey(), CompareAdd: 1})
			nAtomics++
		}
		off += n
	}

	// B to A.
	ba := &soakStream{name: "B to A", qp: b.qp, peer: a.qp, scq: b.scq, peerRCQ: a.rcq}
	for off := 0; off < totalBA; {
		n := min(1+rng.IntN(1<<20), totalBA-off)
		wr := verbs.SendWR{WRID: uint64(1000 + len(ba.wrs)), SendFlags: verbs.SendSignaled, SGList: sge(srcB, off, n),
			RemoteAddr: dstA.Addr() + uint64(off), RKey: dstA.RKey(), ImmData: uint32(off)}
		switch rng.IntN(3) {
		case 0:
			wr.Opcode = verbs.WRRDMAWrite
		case 1:
			wr.Opcode = verbs.WRRDMAWriteWithImm
			mustPostRecv(t, a.qp, verbs.RecvWR{WRID: wr.WRID})
			ba.expectRecv(wr, wr.WRID)
		case 2:
			wr.Opcode = verbs.WRSendWithImm
			mustPostRecv(t, a.qp, verbs.RecvWR{WRID: wr.WRID, SGList: sge(dstA, off, n)})
			ba.expectRecv(wr, wr.WRID)
		}
		ba.wrs = append(ba.wrs, wr)
		off += n
	}

	// Both streams from one goroutine: its polls also drive both devices' receive paths.
	wc := make([]verbs.WorkCompletion, soakDepth)
	deadline := time.Now().Add(3 * waitLimit)
	for !ab.done() || !ba.done() {
		for _, s := range []*soakStream{ab, ba} {
			if err := s.step(wc); err != nil {
				t.Fatal(err)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out: A to B %d of %d WRs and %d of %d receives complete, B to A %d of %d and %d of %d",
				ab.complete, len(ab.wrs), ab.received, len(ab.recvs), ba.complete, len(ba.wrs), ba.received, len(ba.recvs))
		}
	}

	settle(a.ctx, b.ctx)
	for _, c := range chunks {
		span := fmt.Sprintf("A to B opcode %d at [%d, %d)", c.op, c.off, c.off+c.len)
		if c.op == verbs.WRRDMARead {
			checkBytes(t, span, back.Buf()[c.off:c.off+c.len], remoteOrig[c.off:c.off+c.len])
			checkBytes(t, span+" (remote side)", dstB.Buf()[c.off:c.off+c.len], remoteOrig[c.off:c.off+c.len])
		} else {
			checkBytes(t, span, dstB.Buf()[c.off:c.off+c.len], srcA.Buf()[c.off:c.off+c.len])
		}
	}
	checkBytes(t, "B to A", dstA.Buf(), srcB.Buf())
	for i := 0; i < nAtomics; i++ {
		if got := binary.NativeEndian.Uint64(results.Buf()[8*i:]); got != uint64(i) {
			t.Errorf("fetch-and-add %d returned %d", i, got)
		}
	}
	if got := binary.NativeEndian.Uint64(ctr.Buf()[16:]); got != uint64(nAtomics) {
		t.Errorf("counter %d after %d fetch-and-adds", got, nAtomics)
	}
	ka, kb := a.ctx.Counters(), b.ctx.Counters()
	if ka.FaultsLost == 0 || ka.FaultsReordered == 0 || ka.FaultsDuplicated == 0 || kb.FaultsLost == 0 {
		t.Errorf("fault injection did not happen: %+v / %+v", ka, kb)
	}
	if faults.Corrupt > 0 && (ka.FaultsCorrupted == 0 || kb.ICRCErrors == 0) {
		t.Errorf("no corrupted datagram was caught by its ICRC: %+v / %+v", ka, kb)
	}
	if mode == verbs.OrderingOrdered && kb.DirectPlaced == 0 {
		t.Errorf("no WRITE packet placed as its ICRC was checked: %+v", kb)
	}
	if mode == verbs.OrderingWeak {
		// Weak mode did its work: packets placed out of order, selective acknowledgements
		// and retransmissions, and every hole closed once everything completed.
		qa, qb := a.qp.Counters(), b.qp.Counters()
		if qb.PlacedOutOfOrder == 0 || qa.SACKsReceived == 0 || qa.SelectiveRetransmits == 0 || qb.HolesClosed == 0 {
			t.Errorf("weak-mode counters did not move: A %+v / B %+v", qa, qb)
		}
		for _, s := range []*side{a, b} {
			if h := s.qp.Holes(); len(h.Responder) != 0 || len(h.Requester) != 0 {
				t.Errorf("QP %#x: holes still open after every completion: %+v", s.qp.QPNum(), h)
			}
		}
	}
	t.Logf("%v mode: %d + %d WRs in %v; A sent %d packets (%d again, %d timeouts), B %d (%d again, %d timeouts); "+
		"faults lost/reordered/duplicated/corrupted A %d/%d/%d/%d, B %d/%d/%d/%d",
		mode, len(ab.wrs), len(ba.wrs), time.Since(start).Round(time.Millisecond), ka.TxPackets, ka.Retransmits, ka.Timeouts,
		kb.TxPackets, kb.Retransmits, kb.Timeouts,
		ka.FaultsLost, ka.FaultsReordered, ka.FaultsDuplicated, ka.FaultsCorrupted,
		kb.FaultsLost, kb.FaultsReordered, kb.FaultsDuplicated, kb.FaultsCorrupted)
}

// TestLongReadRecovery checks an RDMA READ longer than one READ request (the requester
// splits it into requests of 64 response packets): when its second request is lost and a
// response of its first request too, the PSN sequence NAK the responder sends for the
// following SEND (PSN just past the first request) must not count as acknowledging the
// first request's missing responses: the READ must complete only with every byte read,
// as IBTA requires (an ACK or NAK does not complete an RDMA READ whose responses did not
// all arrive; they are re-requested).
func TestLongReadRecovery(t *testing.T) {
	// 100 responses at MTU 1024, requested at PSN 0x100 (64) and 0x140 (36); the SEND
	// after it (PSN 0x164) fits the window and goes out at once.
	const psnA, n = 0x100, 100 << 10
	var reqHits, respHits atomic.Int32
	pc := pairConfig{Link: retryLink(), PSNA: psnA, PSNB: 0x900}
	pc.DevA = verbs.WithFilter(pc.DevA, packetFilter(wire.OpReadRequest, psnA+64, netio.Drop, &reqHits))
	pc.DevB = verbs.WithFilter(pc.DevB, packetFilter(wire.OpReadResponseMiddle, psnA+5, netio.Drop, &respHits))
	a, b := newPair(t, pc)
	back := mustReg(t, a.pd, make([]byte, n), verbs.AccessLocalWrite)
	src := mustReg(t, a.pd, pattern(100, 110), 0)
	remote := mustReg(t, b.pd, pattern(n, 111), allAccess)
	rbuf := mustReg(t, b.pd, make([]byte, 100), verbs.AccessLocalWrite)
	mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: sge(rbuf, 0, 100)})
	mustPostSend(t, a.qp,
		verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled, SGList: sge(back, 0, n),
			RemoteAddr: remote.Addr(), RKey: remote.RKey()},
		verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 100)})
	wcs := pollN(t, a.scq, 2)
	wantSendWC(t, wcs[0], 1, verbs.WCRDMARead, a.qp)
	wantSendWC(t, wcs[1], 2, verbs.WCSend, a.qp)
	if reqHits.Load() != 1 || respHits.Load() != 1 {
		t.Fatalf("filters matched %d READ requests and %d responses, want 1 and 1", reqHits.Load(), respHits.Load())
	}
	settle(b.ctx)
	checkBytes(t, "100 KiB READ", back.Buf(), remote.Buf())
	if wc := pollOne(t, b.rcq); wc.WRID != 1 || wc.Status != verbs.WCSuccess {
		t.Errorf("receive completion %+v", wc)
	}
}
