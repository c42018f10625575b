package transport

import (
	"bytes"
	"net/netip"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

type side struct {
	d  *Device
	cq *CQ
	qp *QP
}

func openSide(t testing.TB, ip string, cfg Config) *side {
	t.Helper()
	cfg.Local = netip.AddrPortFrom(netip.MustParseAddr(ip), 0)
	if cfg.Queues == 0 {
		cfg.Queues = 1 // tests that hold the receive path or inject packets use q0
	}
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	cq := d.NewCQ(4096)
	qp, err := d.CreateQP(QPConfig{PD: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1024, MaxRecvWR: 1024, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInline: 64})
	if err != nil {
		t.Fatal(err)
	}
	return &side{d: d, cq: cq, qp: qp}
}

var lim = DeviceCaps{MaxRdAtomic: 16, MaxDestRdAtomic: 16}

// connectMode connects a and b in mode. The ACK timeout (67 ms, 7 retries) leaves a
// QP half a second without progress before it fails: on a machine busy with other work
// the peer's receive path may not run for a hundred milliseconds.
func connectMode(t testing.TB, a, b *side, mtu uint8, psnA, psnB uint32, mode Ordering) {
	t.Helper()
	connectTimeout(t, a, b, mtu, psnA, psnB, mode, 14)
}

// connectTimeout is connectMode with the local ACK timeout code timeout (4.096 µs ×
// 2^timeout, 7 retries).
func connectTimeout(t testing.TB, a, b *side, mtu uint8, psnA, psnB uint32, mode Ordering, timeout uint8) {
	t.Helper()
	for _, s := range []struct {
		me, peer *side
		sq, rq   uint32
	}{{a, b, psnA, psnB}, {b, a, psnB, psnA}} {
		q := s.me.qp
		must(t, q.Modify(&Attr{State: StateInit, Port: 1, Access: tpt.RemoteRead | tpt.RemoteWrite | tpt.RemoteAtomic | tpt.LocalWrite},
			MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags, lim))
		must(t, q.Modify(&Attr{State: StateRTR, PathMTU: mtu, DestQPN: s.peer.qp.QPN(), RQPSN: wire.PSN(s.rq), MaxDestRdAtomic: 16, MinRNRTimer: 1,
			Peer: s.peer.d.LocalAddr(), Ordering: mode}, MaskState|MaskAV|MaskPathMTU|MaskDestQPN|MaskRQPSN|MaskMaxDestRdAtomic|MaskMinRNRTimer|MaskOrdering, lim))
		must(t, q.Modify(&Attr{State: StateRTS, SQPSN: wire.PSN(s.sq), Timeout: timeout, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
			MaskState|MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskSQPSN|MaskMaxQPRdAtomic, lim))
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func waitCQE(t testing.TB, cq *CQ, n int) []CQE {
	t.Helper()
	out := make([]CQE, 0, n)
	buf := make([]CQE, 64)
	deadline := time.Now().Add(testutil.WaitLimit)
	for len(out) < n {
		k := cq.Poll(buf[:min(64, n-len(out))])
		if k == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("timed out with %d of %d completions", len(out), n)
			}
			cq.Progress()
			continue
		}
		out = append(out, buf[:k]...)
	}
	return out
}

// q0 is the device's first receive queue: its only one in the tests that hold the
// receive path or inject packets (openSide opens one unless told otherwise).
func (d *Device) q0() *queue { return d.queues[0] }

// placed runs fn while d's receive path is stopped: every placement into d's memory
// happens under a queue's rxMu, so this orders fn after them (for the race detector too).
func placed(d *Device, fn func() bool) bool {
	// All queues at once: the first locked, the others tried (a goroutine holding one
	// queue's rxMu only ever tries another's), all released and tried again if one is busy.
	for locked := false; !locked; {
		d.queues[0].rxMu.Lock()
		locked = true
		for i, u := range d.queues[1:] {
			if !u.rxMu.TryLock() {
				for _, v := range d.queues[:i+1] {
					v.rxMu.Unlock()
				}
				locked = false
				runtime.Gosched()
				break
			}
		}
	}
	defer func() {
		for _, u := range d.queues {
			u.rxMu.Unlock()
		}
	}()
	return fn()
}

func reg(t testing.TB, d *Device, b []byte) *tpt.Region {
	t.Helper()
	r, err := d.MRs().Register(1, b, uint64(uintptr(unsafe.Pointer(&b[0]))), tpt.LocalWrite|tpt.RemoteWrite|tpt.RemoteRead|tpt.RemoteAtomic)
	must(t, err)
	return r
}

func TestEngineOps(t *testing.T) {
	for _, mode := range []Ordering{Ordered, Weak} {
		for _, faults := range []string{"", "loss=0.05,reorder=0.05,dup=0.02,corrupt=0.01,seed=3"} {
			t.Run(mode.String()+"/faults="+faults, func(t *testing.T) { engineOps(t, mode, faults, 1) })
		}
		// The same on devices with three receive queues (the QPs on any of them).
		t.Run(mode.String()+"/queues=3", func(t *testing.T) { engineOps(t, mode, "loss=0.05,reorder=0.05,dup=0.02,corrupt=0.01,seed=3", 3) })
	}
}

func engineOps(t *testing.T, mode Ordering, faults string, queues int) {
	{
		{
			cfg := Config{Queues: queues}
			if faults != "" {
				cfg.Faults.Loss, cfg.Faults.Reorder, cfg.Faults.Dup, cfg.Faults.Corrupt, cfg.Faults.Seed = 0.05, 0.05, 0.02, 0.01, 3
			}
			a := openSide(t, "127.0.0.1", cfg)
			b := openSide(t, "127.0.0.2", cfg)
			connectMode(t, a, b, wire.MTU1024, 0xFFFFF0, 0xFFFFF8, mode) // crosses the PSN wrap
			const size = 300000
			src := make([]byte, size)
			for i := range src {
				src[i] = byte(i * 7)
			}
			dst := make([]byte, size)
			ma, mb := reg(t, a.d, src), reg(t, b.d, dst)
			// SEND / RECV
			_, err := b.qp.PostRecv([]RecvWR{{WRID: 1, SG: []SGE{{Addr: mb.IOVA(), Length: size, LKey: mb.Key()}}}})
			must(t, err)
			_, err = a.qp.PostSend([]SendWR{{WRID: 10, Opcode: WRSendImm, Imm: 0xabcd, Flags: FlagSignaled, SG: []SGE{{Addr: ma.IOVA(), Length: size, LKey: ma.Key()}}}})
			must(t, err)
			ca, cb := waitCQE(t, a.cq, 1)[0], waitCQE(t, b.cq, 1)[0]
			if ca.Status != 0 || cb.Status != 0 || cb.ByteLen != size || cb.Imm != 0xabcd || cb.Flags != WCFlagWithImm || !bytes.Equal(src, dst) {
				t.Fatalf("send: %+v %+v equal=%v", ca, cb, bytes.Equal(src, dst))
			}
			// WRITE
			placed(b.d, func() bool { clear(dst); return true })
			_, err = a.qp.PostSend([]SendWR{{WRID: 11, Opcode: WRWrite, Flags: FlagSignaled, RemoteAddr: mb.IOVA(), RKey: mb.Key(), SG: []SGE{{Addr: ma.IOVA(), Length: size, LKey: ma.Key()}}}})
			must(t, err)
			if c := waitCQE(t, a.cq, 1)[0]; c.Status != 0 || !placed(b.d, func() bool { return bytes.Equal(src, dst) }) {
				t.Fatalf("write: %+v", c)
			}
			// READ
			rd := make([]byte, size)
			mr := reg(t, a.d, rd)
			_, err = a.qp.PostSend([]SendWR{{WRID: 12, Opcode: WRRead, Flags: FlagSignaled, RemoteAddr: mb.IOVA(), RKey: mb.Key(), SG: []SGE{{Addr: mr.IOVA(), Length: size, LKey: mr.Key()}}}})
			must(t, err)
			if c := waitCQE(t, a.cq, 1)[0]; c.Status != 0 || c.Opcode != WCRead || !placed(b.d, func() bool { return bytes.Equal(rd, dst) }) {
				placed(b.d, func() bool {
					for i := 0; i < size; i += 1024 {
						e := min(i+1024, size)
						if !bytes.Equal(rd[i:e], dst[i:e]) {
							// find what rd holds
							where := bytes.Index(dst, rd[i:e])
							t.Logf("pkt %d (off %d) differs; rd content found in dst at %d; rd zero=%v; src eq=%v", i/1024, i, where, bytes.Equal(rd[i:e], make([]byte, e-i)), bytes.Equal(dst[i:e], src[i:e]))
						}
					}
					return true
				})
				t.Fatalf("read: %+v", c)
			}
			// Atomics
			tgt := make([]byte, 64)
			mt := reg(t, b.d, tgt)
			res := make([]byte, 8)
			mres := reg(t, a.d, res)
			for i := 0; i < 10; i++ {
				_, err = a.qp.PostSend([]SendWR{{WRID: 13, Opcode: WRAtomicFetch, Flags: FlagSignaled, RemoteAddr: mt.IOVA() + 8, RKey: mt.Key(), CompareAdd: 5, SG: []SGE{{Addr: mres.IOVA(), Length: 8, LKey: mres.Key()}}}})
				must(t, err)
				if c := waitCQE(t, a.cq, 1)[0]; c.Status != 0 {
					t.Fatalf("fetch-add: %+v", c)
				}
			}
			var v uint64
			placed(b.d, func() bool { v = *(*uint64)(unsafe.Pointer(&tgt[8])); return true })
			if v != 50 {
				t.Fatalf("fetch-add result %d", v)
			}
			t.Logf("A %+v", a.d.Stats())
			t.Logf("B %+v", b.d.Stats())
		}
	}
}
