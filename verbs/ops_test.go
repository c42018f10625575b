package verbs_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime/debug"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/verbs"
)

// Every operation test here runs in both delivery modes, as subtests "ordered" and "weak"
// (forEachOrdering): what they check (data placed, completions, their fields and order,
// memory around the buffers untouched) is the same in both. In weak mode a test reads a
// buffer only after a completion says the message is there, which is all weak mode
// promises.

// fill returns n bytes of value b.

// TestSend checks IBV_WR_SEND: the message lands in the posted receive buffer, the
// receiver's completion is IBV_WC_RECV with the byte count, its own QP number and the
// sender's QP number as src_qp and no immediate flag; the sender gets IBV_WC_SEND; bytes
// beyond the message stay untouched.
func TestSend(t *testing.T) { forEachOrdering(t, testSend) }

func testSend(t *testing.T, mode verbs.Ordering) {
	a, b := modePair(t, mode)
	src := mustReg(t, a.pd, pattern(3000, 1), 0)
	dst := mustReg(t, b.pd, fill(4096, 0xEE), verbs.AccessLocalWrite)
	mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 7, SGList: sge(dst, 0, 4096)})
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 8, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 3000)})
	wc := pollOne(t, b.rcq)
	want := verbs.WorkCompletion{WRID: 7, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, ByteLen: 3000,
		QPNum: b.qp.QPNum(), SrcQP: a.qp.QPNum()}
	if wc != want {
		t.Errorf("receive completion\n got %+v\nwant %+v", wc, want)
	}
	wantSendWC(t, pollOne(t, a.scq), 8, verbs.WCSend, a.qp)
	checkBytes(t, "message", dst.Buf()[:3000], src.Buf())
	checkBytes(t, "bytes after the message", dst.Buf()[3000:], fill(1096, 0xEE))
	expectEmpty(t, a.rcq, "sender's receive CQ")
	expectEmpty(t, b.scq, "receiver's send CQ")
}

// TestSendWithImm checks IBV_WR_SEND_WITH_IMM: the receiver's completion carries the
// immediate data in host byte order with IBV_WC_WITH_IMM set, opcode IBV_WC_RECV, src_qp
// and qp_num.
func TestSendWithImm(t *testing.T) { forEachOrdering(t, testSendWithImm) }

func testSendWithImm(t *testing.T, mode verbs.Ordering) {
	a, b := modePair(t, mode)
	src := mustReg(t, a.pd, pattern(1500, 2), 0)
	dst := mustReg(t, b.pd, make([]byte, 2000), verbs.AccessLocalWrite)
	for i, imm := range []uint32{0xDEADBEEF, 0, 1, 0x01020304} {
		mustPostRecv(t, b.qp, verbs.RecvWR{WRID: uint64(100 + i), SGList: sge(dst, 0, 2000)})
		mustPostSend(t, a.qp, verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSendWithImm, ImmData: imm,
			SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 1500)})
		wc := pollOne(t, b.rcq)
		want := verbs.WorkCompletion{WRID: uint64(100 + i), Status: verbs.WCSuccess, Opcode: verbs.WCRecv, ByteLen: 1500,
			ImmData: imm, QPNum: b.qp.QPNum(), SrcQP: a.qp.QPNum(), WCFlags: verbs.WCWithImm}
		if wc != want {
			t.Errorf("imm %#x: receive completion\n got %+v\nwant %+v", imm, wc, want)
		}
		wantSendWC(t, pollOne(t, a.scq), uint64(i), verbs.WCSend, a.qp)
		checkBytes(t, "message", dst.Buf()[:1500], src.Buf())
	}
}

// TestRDMAWrite checks IBV_WR_RDMA_WRITE: the data lands at the remote address, nothing
// around it changes, the responder consumes no receive WR and gets no completion, and the
// requester gets IBV_WC_RDMA_WRITE.
func TestRDMAWrite(t *testing.T) { forEachOrdering(t, testRDMAWrite) }

func testRDMAWrite(t *testing.T, mode verbs.Ordering) {
	a, b := modePair(t, mode)
	src := mustReg(t, a.pd, pattern(5000, 3), 0)
	dst := mustReg(t, b.pd, fill(8192, 0x55), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	rbuf := mustReg(t, b.pd, fill(64, 0x77), verbs.AccessLocalWrite)
	mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: sge(rbuf, 0, 64)})
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 9, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
		SGList: sge(src, 0, 5000), RemoteAddr: dst.Addr() + 123, RKey: dst.RKey()})
	wantSendWC(t, pollOne(t, a.scq), 9, verbs.WCRDMAWrite, a.qp)
	settle(b.ctx)
	checkBytes(t, "written bytes", dst.Buf()[123:5123], src.Buf())
	checkBytes(t, "bytes before", dst.Buf()[:123], fill(123, 0x55))
	checkBytes(t, "bytes after", dst.Buf()[5123:], fill(8192-5123, 0x55))
	expectEmpty(t, b.rcq, "responder's receive CQ after an RDMA WRITE")
	checkBytes(t, "receive buffer", rbuf.Buf(), fill(64, 0x77))
}

// TestRDMAWriteWithImm checks IBV_WR_RDMA_WRITE_WITH_IMM: the data lands at the remote
// address, and the immediate consumes one receive WR (in posting order) whose completion
// is IBV_WC_RECV_RDMA_WITH_IMM with the written length, the immediate and
// IBV_WC_WITH_IMM; the receive buffer itself is not written.
func TestRDMAWriteWithImm(t *testing.T) { forEachOrdering(t, testRDMAWriteWithImm) }

func testRDMAWriteWithImm(t *testing.T, mode verbs.Ordering) {
	for _, size := range []int{3000, 1} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			a, b := modePair(t, mode)
			src := mustReg(t, a.pd, pattern(size, 4), 0)
			dst := mustReg(t, b.pd, fill(size+20, 0x11), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			rbuf := mustReg(t, b.pd, fill(64, 0x77), verbs.AccessLocalWrite)
			mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: sge(rbuf, 0, 64)}, verbs.RecvWR{WRID: 2})
			for i := 0; i < 2; i++ {
				settle(b.ctx) // the test read what the responder writes again
				imm := 0xCAFE0000 + uint32(i)
				mustPostSend(t, a.qp, verbs.SendWR{WRID: uint64(10 + i), Opcode: verbs.WRRDMAWriteWithImm, ImmData: imm,
					SendFlags: verbs.SendSignaled, SGList: sge(src, 0, size), RemoteAddr: dst.Addr() + 10, RKey: dst.RKey()})
				wantSendWC(t, pollOne(t, a.scq), uint64(10+i), verbs.WCRDMAWrite, a.qp)
				wc := pollOne(t, b.rcq)
				want := verbs.WorkCompletion{WRID: uint64(1 + i), Status: verbs.WCSuccess, Opcode: verbs.WCRecvRDMAWithImm,
					ByteLen: uint32(size), ImmData: imm, QPNum: b.qp.QPNum(), SrcQP: a.qp.QPNum(), WCFlags: verbs.WCWithImm}
				if wc != want {
					t.Errorf("write %d: receive completion\n got %+v\nwant %+v", i, wc, want)
				}
				checkBytes(t, "written bytes", dst.Buf()[10:10+size], src.Buf())
				checkBytes(t, "bytes around", append(dst.Buf()[:10:10], dst.Buf()[10+size:]...), fill(20, 0x11))
			}
			checkBytes(t, "receive buffer", rbuf.Buf(), fill(64, 0x77))
		})
	}
}

// TestRDMARead checks IBV_WR_RDMA_READ: remote bytes land in the local buffer at the
// scatter address, the remote side is unchanged and consumes no receive WR, and the
// requester gets IBV_WC_RDMA_READ.
func TestRDMARead(t *testing.T) { forEachOrdering(t, testRDMARead) }

func testRDMARead(t *testing.T, mode verbs.Ordering) {
	a, b := modePair(t, mode)
	remote := mustReg(t, b.pd, pattern(20000, 5), verbs.AccessRemoteRead)
	orig := bytes.Clone(remote.Buf())
	local := mustReg(t, a.pd, fill(12000, 0x99), verbs.AccessLocalWrite)
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled,
		SGList: sge(local, 5, 10000), RemoteAddr: remote.Addr() + 77, RKey: remote.RKey()})
	wantSendWC(t, pollOne(t, a.scq), 3, verbs.WCRDMARead, a.qp)
	checkBytes(t, "read bytes", local.Buf()[5:10005], orig[77:10077])
	checkBytes(t, "local bytes before", local.Buf()[:5], fill(5, 0x99))
	checkBytes(t, "local bytes after", local.Buf()[10005:], fill(12000-10005, 0x99))
	checkBytes(t, "remote memory", remote.Buf(), orig)
	expectEmpty(t, b.rcq, "responder's receive CQ after an RDMA READ")
}

// atomicTarget registers a 64-byte remote region for atomics with value v at offset 16.
func atomicTarget(t *testing.T, b *side, v uint64) *verbs.MR {
	buf := make([]byte, 64)
	binary.NativeEndian.PutUint64(buf[16:], v)
	return mustReg(t, b.pd, buf, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
}

// TestAtomicCmpAndSwp checks IBV_WR_ATOMIC_CMP_AND_SWP: the original value comes back in
// host byte order; the target is swapped when it equals the compare value and left alone
// when it does not; the neighbouring bytes never change.
func TestAtomicCmpAndSwp(t *testing.T) { forEachOrdering(t, testAtomicCmpAndSwp) }

func testAtomicCmpAndSwp(t *testing.T, mode verbs.Ordering) {
	a, b := modePair(t, mode)
	const orig, swap = uint64(0x1111222233334444), uint64(0xAAAABBBBCCCCDDDD)
	target := atomicTarget(t, b, orig)
	result := mustReg(t, a.pd, make([]byte, 16), verbs.AccessLocalWrite)
	cas := func(wrid, compare, swap uint64) uint64 {
		t.Helper()
		settle(b.ctx)
		mustPostSend(t, a.qp, verbs.SendWR{WRID: wrid, Opcode: verbs.WRAtomicCmpAndSwp, SendFlags: verbs.SendSignaled,
			SGList: sge(result, 8, 8), RemoteAddr: target.Addr() + 16, RKey: target.RKey(), CompareAdd: compare, Swap: swap})
		wc := pollOne(t, a.scq)
		wantSendWC(t, wc, wrid, verbs.WCCompSwap, a.qp)
		return binary.NativeEndian.Uint64(result.Buf()[8:])
	}
	targetValue := func() uint64 {
		settle(b.ctx)
		return binary.NativeEndian.Uint64(target.Buf()[16:])
	}

	if got := cas(1, orig, swap); got != orig {
		t.Errorf("successful CAS returned %#x, want the original %#x", got, orig)
	}
	if targetValue() != swap {
		t.Errorf("after a matching CAS the target is %#x, want %#x", targetValue(), swap)
	}
	if got := cas(2, orig, 0x5555); got != swap {
		t.Errorf("mismatching CAS returned %#x, want the current %#x", got, swap)
	}
	if targetValue() != swap {
		t.Errorf("after a mismatching CAS the target is %#x, want it unchanged %#x", targetValue(), swap)
	}
	checkBytes(t, "bytes around the target", append(target.Buf()[:16:16], target.Buf()[24:]...), make([]byte, 56))
	checkBytes(t, "result buffer outside the SGE", result.Buf()[:8], make([]byte, 8))
}

// TestAtomicFetchAndAdd checks IBV_WR_ATOMIC_FETCH_AND_ADD: the original value comes back
// in host byte order and the target holds the sum (modulo 2^64).
func TestAtomicFetchAndAdd(t *testing.T) { forEachOrdering(t, testAtomicFetchAndAdd) }

func testAtomicFetchAndAdd(t *testing.T, mode verbs.Ordering) {
	a, b := modePair(t, mode)
	target := atomicTarget(t, b, 0x00000000FFFFFFFF)
	result := mustReg(t, a.pd, make([]byte, 8), verbs.AccessLocalWrite)
	steps := []struct{ add, wantOrig, wantAfter uint64 }{
		{1, 0x00000000FFFFFFFF, 0x0000000100000000},
		{0x0102030405060708, 0x0000000100000000, 0x0102030505060708},
		{^uint64(0), 0x0102030505060708, 0x0102030505060707}, // adding -1
		{0, 0x0102030505060707, 0x0102030505060707},
	}
	for i, s := range steps {
		settle(b.ctx)
		mustPostSend(t, a.qp, verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRAtomicFetchAndAdd, SendFlags: verbs.SendSignaled,
			SGList: sge(result, 0, 8), RemoteAddr: target.Addr() + 16, RKey: target.RKey(), CompareAdd: s.add})
		wantSendWC(t, pollOne(t, a.scq), uint64(i), verbs.WCFetchAdd, a.qp)
		if got := binary.NativeEndian.Uint64(result.Buf()); got != s.wantOrig {
			t.Errorf("step %d: fetched %#x, want %#x", i, got, s.wantOrig)
		}
		settle(b.ctx)
		if got := binary.NativeEndian.Uint64(target.Buf()[16:]); got != s.wantAfter {
			t.Errorf("step %d: target %#x, want %#x", i, got, s.wantAfter)
		}
	}
}

// TestZeroLength checks zero-byte messages: a SEND and a SEND_WITH_IMM without SGEs (or
// with an empty SGE) complete a receive with byte_len 0 and leave its buffer untouched,
// and zero-byte RDMA WRITE, WRITE_WITH_IMM and READ complete successfully without
// touching memory.
func TestZeroLength(t *testing.T) { forEachOrdering(t, testZeroLength) }

func testZeroLength(t *testing.T, mode verbs.Ordering) {
	a, b := modePair(t, mode)
	src := mustReg(t, a.pd, pattern(64, 6), verbs.AccessLocalWrite)
	dst := mustReg(t, b.pd, fill(64, 0x33), verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	for i := 0; i < 4; i++ {
		mustPostRecv(t, b.qp, verbs.RecvWR{WRID: uint64(i), SGList: sge(dst, 0, 64)})
	}
	wrs := []verbs.SendWR{
		{WRID: 10, Opcode: verbs.WRSend},
		{WRID: 11, Opcode: verbs.WRSend, SGList: sge(src, 0, 0)},
		{WRID: 12, Opcode: verbs.WRSendWithImm, ImmData: 5},
		{WRID: 13, Opcode: verbs.WRRDMAWrite, RemoteAddr: dst.Addr(), RKey: dst.RKey()},
		{WRID: 14, Opcode: verbs.WRRDMAWriteWithImm, ImmData: 6, RemoteAddr: dst.Addr(), RKey: dst.RKey()},
		{WRID: 15, Opcode: verbs.WRRDMARead, RemoteAddr: dst.Addr(), RKey: dst.RKey()},
		{WRID: 16, Opcode: verbs.WRRDMAWrite, SGList: sge(src, 3, 0), RemoteAddr: dst.Addr() + 5, RKey: dst.RKey()},
	}
	wantOps := []verbs.WCOpcode{verbs.WCSend, verbs.WCSend, verbs.WCSend, verbs.WCRDMAWrite, verbs.WCRDMAWrite, verbs.WCRDMARead, verbs.WCRDMAWrite}
	for i := range wrs {
		wrs[i].SendFlags = verbs.SendSignaled
	}
	mustPostSend(t, a.qp, wrs...)
	for i, wc := range pollN(t, a.scq, len(wrs)) {
		wantSendWC(t, wc, wrs[i].WRID, wantOps[i], a.qp)
	}
	wantRecv := []verbs.WorkCompletion{
		{WRID: 0, Opcode: verbs.WCRecv},
		{WRID: 1, Opcode: verbs.WCRecv},
		{WRID: 2, Opcode: verbs.WCRecv, ImmData: 5, WCFlags: verbs.WCWithImm},
		{WRID: 3, Opcode: verbs.WCRecvRDMAWithImm, ImmData: 6, WCFlags: verbs.WCWithImm},
	}
	for i, wc := range pollN(t, b.rcq, len(wantRecv)) {
		w := wantRecv[i]
		w.QPNum, w.SrcQP = b.qp.QPNum(), a.qp.QPNum()
		if wc != w {
			t.Errorf("receive completion %d\n got %+v\nwant %+v", i, wc, w)
		}
	}
	checkBytes(t, "receive buffer", dst.Buf(), fill(64, 0x33))
	checkBytes(t, "local buffer", src.Buf(), pattern(64, 6))
}

// TestMessageSizes checks SEND, RDMA WRITE and RDMA READ of sizes around every path MTU
// (1, MTU-1, MTU, MTU+1, 255..257, 3 pages + 1, 1 MiB) for every MTU from 256 to 4096,
// byte by byte.
func TestMessageSizes(t *testing.T) { forEachOrdering(t, testMessageSizes) }

func testMessageSizes(t *testing.T, mode verbs.Ordering) {
	for mtu := verbs.MTU256; mtu <= verbs.MTU4096; mtu++ {
		t.Run(fmt.Sprint(mtu.Bytes()), func(t *testing.T) {
			l := defaultLink().InMode(mode)
			l.MTU = mtu
			a, b := newPair(t, pairConfig{Link: l})
			m := mtu.Bytes()
			sizes := []int{1, 255, 256, 257, m - 1, m, m + 1, 2*m + 3, 4096*3 + 1, 1 << 20}
			const maxSize = 1 << 20
			src := mustReg(t, a.pd, make([]byte, maxSize), verbs.AccessLocalWrite)
			dst := mustReg(t, b.pd, make([]byte, maxSize+1), verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
			for i, n := range sizes {
				// SEND into a receive buffer one byte larger than the message.
				want := pattern(n, uint64(i*3))
				settle(a.ctx, b.ctx)
				copy(src.Buf(), want)
				clear(dst.Buf())
				settle(a.ctx, b.ctx)
				mustPostRecv(t, b.qp, verbs.RecvWR{WRID: uint64(i), SGList: sge(dst, 0, n+1)})
				mustPostSend(t, a.qp, verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, n)})
				wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCSend, a.qp)
				if wc := pollOne(t, b.rcq); wc.Status != verbs.WCSuccess || wc.ByteLen != uint32(n) || wc.WRID != uint64(i) {
					t.Errorf("SEND %d: receive completion %+v", n, wc)
				}
				checkBytes(t, fmt.Sprintf("SEND %d", n), dst.Buf()[:n+1], append(want, 0))

				// RDMA WRITE at an odd offset.
				want = pattern(n, uint64(i*3+1))
				copy(src.Buf(), want)
				clear(dst.Buf())
				settle(a.ctx, b.ctx)
				mustPostSend(t, a.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
					SGList: sge(src, 0, n), RemoteAddr: dst.Addr() + 1, RKey: dst.RKey()})
				wantSendWC(t, pollOne(t, a.scq), 2, verbs.WCRDMAWrite, a.qp)
				settle(a.ctx, b.ctx)
				checkBytes(t, fmt.Sprintf("WRITE %d", n), dst.Buf()[:n+1], append([]byte{0}, want...))

				// RDMA READ from an odd offset.
				want = pattern(n, uint64(i*3+2))
				copy(dst.Buf()[1:], want)
				clear(src.Buf())
				settle(a.ctx, b.ctx)
				mustPostSend(t, a.qp, verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled,
					SGList: sge(src, 0, n), RemoteAddr: dst.Addr() + 1, RKey: dst.RKey()})
				wantSendWC(t, pollOne(t, a.scq), 3, verbs.WCRDMARead, a.qp)
				checkBytes(t, fmt.Sprintf("READ %d", n), src.Buf()[:n], want)
				if n < maxSize && src.Buf()[n] != 0 {
					t.Errorf("READ %d wrote past its SGE", n)
				}
			}
		})
	}
}

// TestLargeTransfer checks a 64 MiB RDMA WRITE and a 64 MiB RDMA READ (many READ requests
// and the full PSN window), every byte.
func TestLargeTransfer(t *testing.T) { forEachOrdering(t, testLargeTransfer) }

func testLargeTransfer(t *testing.T, mode verbs.Ordering) {
	const size = 64 << 20
	l := defaultLink().InMode(mode)
	l.MTU = verbs.MTU4096
	a, b := newPair(t, pairConfig{Link: l})
	src := mustReg(t, a.pd, pattern(size, 7), verbs.AccessLocalWrite)
	dst := mustReg(t, b.pd, make([]byte, size), verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
		SGList: sge(src, 0, size), RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCRDMAWrite, a.qp)
	settle(b.ctx)
	checkBytes(t, "64 MiB written", dst.Buf(), src.Buf())

	back := mustReg(t, a.pd, make([]byte, size), verbs.AccessLocalWrite)
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled,
		SGList: sge(back, 0, size), RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	wantSendWC(t, pollOne(t, a.scq), 2, verbs.WCRDMARead, a.qp)
	checkBytes(t, "64 MiB read back", back.Buf(), src.Buf())
}

// TestGiBMessages checks that a single work request may move 1 GiB: an RDMA WRITE of
// 1 GiB, an RDMA READ of it back and a 1 GiB SEND into one receive, every byte compared
// (libibverbs allows messages up to max_msg_sz, 2 GiB here). It holds two 1 GiB buffers
// (the READ lands in the cleared source, the SEND in the cleared target) and takes a few
// seconds; it has no time limit of its own beyond the suite's wait guard.
func TestGiBMessages(t *testing.T) {
	if testing.Short() || testutil.Race {
		t.Skip("moves 3 GiB; skipped in -short mode and under the race detector")
	}
	const size = 1 << 30
	// The suite's peak memory is this test's: return what earlier tests left to the OS
	// first, and this test's 2 GiB when it ends.
	debug.FreeOSMemory()
	t.Cleanup(debug.FreeOSMemory)
	l := defaultLink()
	l.MTU = verbs.MTU4096
	a, b := newPair(t, pairConfig{Link: l})
	src := mustReg(t, a.pd, pattern(size, 70), verbs.AccessLocalWrite)
	dst := mustReg(t, b.pd, make([]byte, size), verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
		SGList: sge(src, 0, size), RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCRDMAWrite, a.qp)
	settle(b.ctx)
	if !bytes.Equal(dst.Buf(), src.Buf()) {
		t.Fatal("1 GiB written: the target differs from the source")
	}

	// READ it back into the cleared source: what arrives must be what was written.
	clear(src.Buf())
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled,
		SGList: sge(src, 0, size), RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	wantSendWC(t, pollOne(t, a.scq), 2, verbs.WCRDMARead, a.qp)
	if !bytes.Equal(src.Buf(), dst.Buf()) {
		t.Fatal("1 GiB read back: differs from what was written")
	}

	settle(b.ctx)
	clear(dst.Buf())
	mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 3, SGList: sge(dst, 0, size)})
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 4, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, size)})
	wantSendWC(t, pollOne(t, a.scq), 4, verbs.WCSend, a.qp)
	if wc := pollOne(t, b.rcq); wc.Status != verbs.WCSuccess || wc.ByteLen != size {
		t.Fatalf("1 GiB receive: %+v", wc)
	}
	settle(b.ctx)
	if !bytes.Equal(dst.Buf(), src.Buf()) {
		t.Fatal("1 GiB sent: the receive buffer differs from the source")
	}
}

// TestPSNWrap checks that transfers crossing the 24-bit PSN wrap (sq_psn and rq_psn just
// below 0xFFFFFF) work in both directions for SEND, WRITE, READ and atomics.
func TestPSNWrap(t *testing.T) { forEachOrdering(t, testPSNWrap) }

func testPSNWrap(t *testing.T, mode verbs.Ordering) {
	for _, psn := range []struct{ a, b uint32 }{{0xFFFFF0, 0xFFFFFA}, {0xFFFFFF, 0xFFFFFE}} {
		t.Run(fmt.Sprintf("%#x,%#x", psn.a, psn.b), func(t *testing.T) {
			a, b := newPair(t, pairConfig{Link: defaultLink().InMode(mode), PSNA: psn.a, PSNB: psn.b})
			const n = 100 << 10 // 100 packets at MTU 1024
			srcA := mustReg(t, a.pd, pattern(n, 8), verbs.AccessLocalWrite)
			dstA := mustReg(t, a.pd, make([]byte, n), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			srcB := mustReg(t, b.pd, pattern(n, 9), verbs.AccessLocalWrite|verbs.AccessRemoteRead)
			dstB := mustReg(t, b.pd, make([]byte, n), verbs.AccessLocalWrite)
			ctr := atomicTarget(t, b, 0)
			res := mustReg(t, a.pd, make([]byte, 8), verbs.AccessLocalWrite)
			for round := 0; round < 3; round++ {
				mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: sge(dstB, 0, n)})
				mustPostSend(t, a.qp, verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(srcA, 0, n)})
				wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCSend, a.qp)
				if wc := pollOne(t, b.rcq); wc.Status != verbs.WCSuccess || wc.ByteLen != n {
					t.Fatalf("round %d: receive %+v", round, wc)
				}
				checkBytes(t, "SEND across the wrap", dstB.Buf(), srcA.Buf())

				clear(dstA.Buf())
				settle(a.ctx)
				mustPostSend(t, b.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
					SGList: sge(srcB, 0, n), RemoteAddr: dstA.Addr(), RKey: dstA.RKey()})
				wantSendWC(t, pollOne(t, b.scq), 2, verbs.WCRDMAWrite, b.qp)
				settle(a.ctx)
				checkBytes(t, "WRITE across the wrap", dstA.Buf(), srcB.Buf())

				clear(dstA.Buf())
				mustPostSend(t, a.qp, verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled,
					SGList: sge(dstA, 0, n), RemoteAddr: srcB.Addr(), RKey: srcB.RKey()})
				wantSendWC(t, pollOne(t, a.scq), 3, verbs.WCRDMARead, a.qp)
				checkBytes(t, "READ across the wrap", dstA.Buf(), srcB.Buf())

				for i := 0; i < 20; i++ {
					mustPostSend(t, a.qp, verbs.SendWR{WRID: 4, Opcode: verbs.WRAtomicFetchAndAdd, SendFlags: verbs.SendSignaled,
						SGList: sge(res, 0, 8), RemoteAddr: ctr.Addr() + 16, RKey: ctr.RKey(), CompareAdd: 1})
					wantSendWC(t, pollOne(t, a.scq), 4, verbs.WCFetchAdd, a.qp)
					if got, want := binary.NativeEndian.Uint64(res.Buf()), uint64(round*20+i); got != want {
						t.Fatalf("fetch-and-add %d returned %d, want %d", round*20+i, got, want)
					}
				}
			}
		})
	}
}

// TestScatterGather checks multi-element scatter/gather lists with odd sizes: a SEND
// gathered from five SGEs of two regions is scattered over four receive SGEs (one of them
// empty) in order; an RDMA WRITE gathers from several SGEs and an RDMA READ scatters into
// several.
func TestScatterGather(t *testing.T) { forEachOrdering(t, testScatterGather) }

func testScatterGather(t *testing.T, mode verbs.Ordering) {
	a, b := modePair(t, mode)
	p1 := mustReg(t, a.pd, pattern(4096, 10), verbs.AccessLocalWrite)
	p2 := mustReg(t, a.pd, pattern(4096, 11), verbs.AccessLocalWrite)
	gather := []verbs.SGE{p1.SGE(0, 1), p2.SGE(5, 3), p1.SGE(100, 1023), p2.SGE(1000, 7), p1.SGE(2000, 2049)}
	var want []byte
	for _, s := range gather {
		mr := p1
		if s.LKey == p2.LKey() {
			mr = p2
		}
		off := int(s.Addr - mr.Addr())
		want = append(want, mr.Buf()[off:off+int(s.Length)]...)
	}
	r1 := mustReg(t, b.pd, fill(4096, 0xAB), verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	r2 := mustReg(t, b.pd, fill(4096, 0xAB), verbs.AccessLocalWrite)
	scatter := []verbs.SGE{r1.SGE(3, 13), r2.SGE(1, 1500), r1.SGE(50, 0), r2.SGE(2000, 2000), r1.SGE(100, 1)}
	mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: scatter})
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: gather})
	wantSendWC(t, pollOne(t, a.scq), 2, verbs.WCSend, a.qp)
	if wc := pollOne(t, b.rcq); wc.Status != verbs.WCSuccess || wc.ByteLen != uint32(len(want)) {
		t.Fatalf("receive completion %+v, want %d bytes", wc, len(want))
	}
	got := append([]byte{}, r1.Buf()[3:16]...)
	got = append(got, r2.Buf()[1:1501]...)
	got = append(got, r2.Buf()[2000:2000+len(want)-13-1500]...)
	checkBytes(t, "scattered message", got, want)
	rest := 2000 + len(want) - 13 - 1500
	checkBytes(t, "r2 after the message", r2.Buf()[rest:], fill(4096-rest, 0xAB))
	checkBytes(t, "r2 between elements", r2.Buf()[1501:2000], fill(499, 0xAB))
	checkBytes(t, "r1 outside its first element", r1.Buf()[16:], fill(4096-16, 0xAB))

	// RDMA WRITE gathered from the same five elements.
	settle(b.ctx)
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled, SGList: gather,
		RemoteAddr: r1.Addr() + 1, RKey: r1.RKey()})
	wantSendWC(t, pollOne(t, a.scq), 3, verbs.WCRDMAWrite, a.qp)
	settle(b.ctx)
	checkBytes(t, "gathered WRITE", r1.Buf()[1:1+len(want)], want)

	// RDMA READ of those bytes scattered into three local elements.
	l1 := mustReg(t, a.pd, make([]byte, 4096), verbs.AccessLocalWrite)
	readSG := []verbs.SGE{l1.SGE(7, 999), l1.SGE(1500, 1), l1.SGE(2000, len(want)-1000)}
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 4, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled, SGList: readSG,
		RemoteAddr: r1.Addr() + 1, RKey: r1.RKey()})
	wantSendWC(t, pollOne(t, a.scq), 4, verbs.WCRDMARead, a.qp)
	got = append(append(append([]byte{}, l1.Buf()[7:1006]...), l1.Buf()[1500]), l1.Buf()[2000:2000+len(want)-1000]...)
	checkBytes(t, "scattered READ", got, want)
}

// TestInline checks IBV_SEND_INLINE: the data is copied when PostSend returns, so the
// source may be overwritten right away (here while the WR still waits behind a large
// WRITE); inline works for SEND and RDMA WRITE, with several SGEs and up to the QP's
// max_inline_data.
func TestInline(t *testing.T) { forEachOrdering(t, testInline) }

func testInline(t *testing.T, mode verbs.Ordering) {
	a, b := modePair(t, mode) // max_inline_data 256
	big := mustReg(t, a.pd, make([]byte, 4<<20), 0)
	sink := mustReg(t, b.pd, make([]byte, 4<<20), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	src := mustReg(t, a.pd, pattern(300, 12), 0)
	want := bytes.Clone(src.Buf())
	dst := mustReg(t, b.pd, make([]byte, 700), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: sge(dst, 0, 300)})
	mustPostSend(t, a.qp,
		// A 4 MiB WRITE ahead of the inline WRs keeps them queued for a while.
		verbs.SendWR{WRID: 10, Opcode: verbs.WRRDMAWrite, SGList: sge(big, 0, len(big.Buf())), RemoteAddr: sink.Addr(), RKey: sink.RKey()},
		verbs.SendWR{WRID: 11, Opcode: verbs.WRSend, SendFlags: verbs.SendInline | verbs.SendSignaled, SGList: sge(src, 0, 200)},
		verbs.SendWR{WRID: 12, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendInline | verbs.SendSignaled,
			SGList: []verbs.SGE{src.SGE(200, 50), src.SGE(0, 6)}, RemoteAddr: dst.Addr() + 300, RKey: dst.RKey()},
		verbs.SendWR{WRID: 13, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendInline | verbs.SendSignaled,
			SGList: []verbs.SGE{src.SGE(0, 128), src.SGE(128, 128)}, RemoteAddr: dst.Addr() + 400, RKey: dst.RKey()},
	)
	copy(src.Buf(), fill(300, 0xFF)) // overwrite right after PostSend
	for i, wc := range pollN(t, a.scq, 3) {
		wantSendWC(t, wc, uint64(11+i), []verbs.WCOpcode{verbs.WCSend, verbs.WCRDMAWrite, verbs.WCRDMAWrite}[i], a.qp)
	}
	if wc := pollOne(t, b.rcq); wc.Status != verbs.WCSuccess || wc.ByteLen != 200 {
		t.Errorf("receive completion %+v", wc)
	}
	settle(b.ctx)
	checkBytes(t, "inline SEND", dst.Buf()[:200], want[:200])
	checkBytes(t, "inline WRITE with two SGEs", dst.Buf()[300:356], append(bytes.Clone(want[200:250]), want[:6]...))
	checkBytes(t, "inline WRITE of max_inline_data bytes", dst.Buf()[400:656], want[:256])
}

// TestInlineTooLarge checks that an inline WR larger than the QP's max_inline_data is
// refused by ibv_post_send with a *PostError naming it: the WRs before it are posted and
// complete, it and the ones after are not.
func TestInlineTooLarge(t *testing.T) { forEachOrdering(t, testInlineTooLarge) }

func testInlineTooLarge(t *testing.T, mode verbs.Ordering) {
	cp := defaultCap
	cp.MaxInlineData = 64
	a, b := newPair(t, pairConfig{Link: defaultLink().InMode(mode), Cap: cp})
	src := mustReg(t, a.pd, pattern(128, 13), 0)
	dst := mustReg(t, b.pd, make([]byte, 128), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	wr := func(id uint64, n int) verbs.SendWR {
		return verbs.SendWR{WRID: id, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendInline | verbs.SendSignaled,
			SGList: []verbs.SGE{src.SGE(0, n/2), src.SGE(n/2, n-n/2)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}
	}
	err := a.qp.PostSend([]verbs.SendWR{wr(1, 64), wr(2, 65), wr(3, 10)})
	if idx := postIndex(err); idx != 1 {
		t.Fatalf("PostSend: %v, want a *PostError for index 1", err)
	}
	wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCRDMAWrite, a.qp)
	settle(b.ctx)
	checkBytes(t, "first WRITE", dst.Buf()[:64], src.Buf()[:64])
	checkBytes(t, "nothing beyond it", dst.Buf()[64:], make([]byte, 64))
	// The QP is still usable and the refused WRs left no trace.
	settle(b.ctx)
	mustPostSend(t, a.qp, wr(4, 64))
	wantSendWC(t, pollOne(t, a.scq), 4, verbs.WCRDMAWrite, a.qp)
	expectEmpty(t, a.scq, "send CQ")
}

// TestUnsignaled checks selective signaling: without SQSigAll only WRs with
// IBV_SEND_SIGNALED produce a completion; with SQSigAll every WR does; completions come
// in posting order whatever the opcodes.
func TestUnsignaled(t *testing.T) { forEachOrdering(t, testUnsignaled) }

func testUnsignaled(t *testing.T, mode verbs.Ordering) {
	for _, sigAll := range []bool{false, true} {
		t.Run(fmt.Sprintf("SQSigAll=%v", sigAll), func(t *testing.T) {
			a, b := newPair(t, pairConfig{Link: defaultLink().InMode(mode), SigAll: sigAll})
			src := mustReg(t, a.pd, pattern(8192, 14), verbs.AccessLocalWrite)
			dst := mustReg(t, b.pd, make([]byte, 8192), allAccess)
			for i := 0; i < 40; i++ {
				mustPostRecv(t, b.qp, verbs.RecvWR{WRID: uint64(1000 + i), SGList: sge(dst, 4096, 4096)})
			}
			var wrs []verbs.SendWR
			var signaled []uint64
			var ops []verbs.WCOpcode
			for i := 0; i < 60; i++ {
				wr := verbs.SendWR{WRID: uint64(i)}
				switch i % 5 {
				case 0:
					wr.Opcode, wr.SGList = verbs.WRSend, sge(src, i, 100+i)
				case 1:
					wr.Opcode, wr.SGList, wr.RemoteAddr, wr.RKey = verbs.WRRDMAWrite, sge(src, 0, 3000), dst.Addr()+16, dst.RKey()
				case 2:
					wr.Opcode, wr.SGList, wr.RemoteAddr, wr.RKey = verbs.WRRDMARead, sge(src, 4096, 2000), dst.Addr(), dst.RKey()
				case 3:
					wr.Opcode, wr.SGList, wr.RemoteAddr, wr.RKey = verbs.WRAtomicFetchAndAdd, sge(src, 8000, 8), dst.Addr()+8, dst.RKey()
					wr.CompareAdd = 1
				case 4:
					wr.Opcode, wr.SGList, wr.ImmData = verbs.WRSendWithImm, sge(src, 0, 10), uint32(i)
				}
				if i%7 == 3 || i == 59 {
					wr.SendFlags = verbs.SendSignaled
				}
				if sigAll || wr.SendFlags&verbs.SendSignaled != 0 {
					signaled = append(signaled, wr.WRID)
					ops = append(ops, []verbs.WCOpcode{verbs.WCSend, verbs.WCRDMAWrite, verbs.WCRDMARead, verbs.WCFetchAdd, verbs.WCSend}[i%5])
				}
				wrs = append(wrs, wr)
			}
			mustPostSend(t, a.qp, wrs...)
			wcs := pollN(t, a.scq, len(signaled))
			for i, wc := range wcs {
				wantSendWC(t, wc, signaled[i], ops[i], a.qp)
			}
			// The last WR is signaled, so every completion there is to be is there.
			expectEmpty(t, a.scq, "send CQ after the last signaled WR")
			recvs := pollN(t, b.rcq, 24)
			for i, wc := range recvs {
				if wc.WRID != uint64(1000+i) || wc.Status != verbs.WCSuccess {
					t.Errorf("receive completion %d: %+v", i, wc)
				}
			}
			settle(b.ctx)
			if got := binary.NativeEndian.Uint64(dst.Buf()[8:]); got != 12 {
				t.Errorf("12 fetch-and-adds left the counter at %d", got)
			}
		})
	}
}
