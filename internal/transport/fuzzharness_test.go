package transport

import (
	"bytes"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// How the fuzz targets of this package drive the engine. Each fuzz input is a small
// program: a few header bytes that configure a fresh QP, then packet records, each turned
// into a RoCEv2 packet (with a correct ICRC unless the record asks otherwise) and fed to
// Device.input the way processBatch does. The targets are FuzzReceivePath,
// FuzzRequesterResponses, FuzzWeakReceivePath and FuzzWeakRequesterResponses (one file
// each), on the fixture they share, fuzzRig (fuzzrig_test.go), with its receive-path and
// requester variants (responderRig, requesterRig); the packet records are read by
// buildPacket and buildWeakPacket (fuzzpackets_test.go, fuzzweakpackets_test.go), the
// checks are in fuzzchecks_test.go.
// Seed corpora are in testdata/fuzz/<FuzzName>/; TestWriteFuzzSeeds (fuzzseeds_test.go,
// fuzzweakseeds_test.go) regenerates them when SOFTRNIC_WRITE_FUZZ_SEEDS=1.

// fuzzReader hands out the bytes of a fuzz input; past the end it returns zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) empty() bool { return len(r.b) == 0 }

func (r *fuzzReader) u8() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *fuzzReader) u16() uint16 { return uint16(r.u8())<<8 | uint16(r.u8()) }
func (r *fuzzReader) u24() uint32 { return uint32(r.u8())<<16 | uint32(r.u16()) }
func (r *fuzzReader) u32() uint32 { return uint32(r.u16())<<16 | uint32(r.u16()) }
func (r *fuzzReader) u64() uint64 { return uint64(r.u32())<<32 | uint64(r.u32()) }

func (r *fuzzReader) take(n int) []byte {
	n = min(n, len(r.b))
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// maxFuzzPackets bounds the packets of one input, so an execution stays short.
const maxFuzzPackets = 48

// feed runs processBatch's steps for one packet: input under rxMu, then (unless the
// record said otherwise) finishBatch. It reports whether the device or q refused the packet
// (bad ICRC, malformed, wrong P_Key or QP, wrong source, wrong state, duplicate, out of
// sequence, beyond the weak-mode span, dropped, NAKed): a refused packet must not change
// memory.
//
// A panic in the engine releases rxMu on its way out, so that it reaches the fuzzer as
// the panic it is (the target's deferred QP.Destroy would otherwise wait for rxMu forever
// and the watchdog report a hang).
func feed(d *Device, q *QP, pkt []byte, from netip.AddrPort, flush bool) (refused bool) {
	before, st := q.Stats(), q.State()
	func() {
		d.q0().rxMu.Lock()
		defer d.q0().rxMu.Unlock()
		rx := d.q0().rx
		d.q0().input(pkt, from)
		refused = d.q0().rx.icrc+d.q0().rx.malformed+d.q0().rx.pkey+d.q0().rx.unknownQP != rx.icrc+rx.malformed+rx.pkey+rx.unknownQP
		if flush {
			d.q0().finishBatch()
		}
	}()
	after := q.Stats()
	return refused || st == StateErr ||
		after.Duplicates+after.OutOfSequence+after.NAKsSent+after.RNRNAKsSent+after.WrongSource+after.Dropped+after.BeyondSpan !=
			before.Duplicates+before.OutOfSequence+before.NAKsSent+before.RNRNAKsSent+before.WrongSource+before.Dropped+before.BeyondSpan
}

// weakFeed is feed for a weakly-ordered responder. A packet is refused unless it is
// placed: unless its PSN, missing before, has arrived after it. (Counters cannot tell: a
// packet that closes a hole releases what waited on it, and a NAK that release causes
// is not about the packet.)
func weakFeed(d *Device, q *QP, pkt []byte, from netip.AddrPort, flush bool) (refused bool) {
	var p wire.Packet
	has := func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.weak != nil && q.weak.resp.arrived.Has(p.BTH.PSN)
	}
	ok := p.Decode(pkt) == nil && p.BTH.DestQP == q.QPN()
	had := ok && has()
	_ = feed(d, q, pkt, from, flush)
	return !ok || had || !has()
}

func finish(d *Device) {
	d.q0().rxMu.Lock()
	d.q0().finishBatch()
	d.q0().rxMu.Unlock()
}

// watchdog turns an execution that never ends (an infinite loop in the engine) into a
// crash the fuzzer records.
func watchdog(data []byte) *time.Timer {
	return time.AfterFunc(30*time.Second, func() {
		panic(fmt.Sprintf("fuzz execution still running after 30s (infinite loop?), input %x", data))
	})
}

// liveWriteMode checks that the devices still work: a fresh QP pair from -> to in
// delivery mode mode, an RDMA WRITE and its completion. The local ACK timeout is generous
// (67 ms, 7 retries) so that a loaded machine (fuzz workers use every core) does not fail
// the check.
func liveWriteMode(t testing.TB, from, to *Device, src, dst []byte, msrc, mdst *tpt.Region, seq int, mode Ordering) {
	t.Helper()
	mk := func(d *Device) *side {
		cq := d.NewCQ(64)
		qp, err := d.CreateQP(QPConfig{PD: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1})
		must(t, err)
		return &side{d: d, cq: cq, qp: qp}
	}
	sa, sb := mk(from), mk(to)
	defer sa.qp.Destroy()
	defer sb.qp.Destroy()
	for _, s := range []struct{ me, peer *side }{{sa, sb}, {sb, sa}} {
		q := s.me.qp
		must(t, q.Modify(&Attr{State: StateInit, Port: 1, Access: tpt.RemoteWrite | tpt.LocalWrite}, MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags, lim))
		must(t, q.Modify(&Attr{State: StateRTR, PathMTU: wire.MTU1024, DestQPN: s.peer.qp.QPN(), RQPSN: 0x100, MaxDestRdAtomic: 4, MinRNRTimer: 1,
			Peer: s.peer.d.LocalAddr(), Ordering: mode}, MaskState|MaskAV|MaskPathMTU|MaskDestQPN|MaskRQPSN|MaskMaxDestRdAtomic|MaskMinRNRTimer|MaskOrdering, lim))
		must(t, q.Modify(&Attr{State: StateRTS, SQPSN: 0x100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4},
			MaskState|MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskSQPSN|MaskMaxQPRdAtomic, lim))
	}
	for i := range src {
		src[i] = byte(i*13 + seq)
	}
	to.q0().rxMu.Lock() // see below
	clear(dst)
	to.q0().rxMu.Unlock()
	_, err := sa.qp.PostSend([]SendWR{{WRID: 77, Opcode: WRWrite, Flags: FlagSignaled, RemoteAddr: mdst.IOVA(), RKey: mdst.Key(),
		SG: []SGE{{Addr: msrc.IOVA(), Length: uint32(len(src)), LKey: msrc.Key()}}}})
	must(t, err)
	c := waitCQE(t, sa.cq, 1)[0]
	// The responder placed the data under its rxMu; taking it orders that write before the
	// comparison (for the race detector, which cannot see the ordering the ACK gives).
	to.q0().rxMu.Lock()
	equal := bytes.Equal(src, dst)
	to.q0().rxMu.Unlock()
	if c.Status != StatusSuccess || !equal {
		t.Fatalf("device no longer works: RDMA WRITE on a fresh QP pair: %+v, data equal %v\nrequester QP %+v\nresponder QP %+v\nrequester device %+v\nresponder device %+v",
			c, equal, sa.qp.Stats(), sb.qp.Stats(), from.Stats(), to.Stats())
	}
}

// liveness checks that the devices of a fuzz target still work: a real RDMA WRITE from ->
// to over their sockets (in delivery mode mode), every liveEvery executions and once when
// the target ends. The txMonitor lets the check's packets through unchecked.
type liveness struct {
	mon        *txMonitor
	from, to   *Device
	src, dst   []byte
	msrc, mdst *tpt.Region
	mode       Ordering
	execs      atomic.Int64
}

func newLiveness(f *testing.F, mon *txMonitor, from, to *Device, mode Ordering) *liveness {
	l := &liveness{mon: mon, from: from, to: to, src: make([]byte, 3000), dst: make([]byte, 3000), mode: mode}
	l.msrc, l.mdst = reg(f, from, l.src), reg(f, to, l.dst)
	f.Cleanup(func() {
		if !f.Failed() {
			l.check(f, 0)
		}
	})
	return l
}

func (l *liveness) check(t testing.TB, seq int) {
	l.mon.pass.Store(true)
	defer l.mon.pass.Store(false)
	liveWriteMode(t, l.from, l.to, l.src, l.dst, l.msrc, l.mdst, seq, l.mode)
}

// tick counts an execution and checks every liveEvery of them.
func (l *liveness) tick(t testing.TB) {
	if n := l.execs.Add(1); n%liveEvery == 1 {
		l.check(t, int(n))
	}
}

func iova(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// liveEvery is how often (in executions per process) the fuzz targets check, with a real
// RDMA WRITE over the sockets, that the device still works.
const liveEvery = 500
