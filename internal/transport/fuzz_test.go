package transport

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// Fuzz targets for the receive path. Each fuzz input is a small program: a few header bytes
// that configure a fresh QP, then packet records, each turned into a RoCEv2 packet (with a
// correct ICRC unless the record asks otherwise) and fed to Device.input the way
// processBatch does. Seed corpora are in testdata/fuzz/<FuzzName>/; TestWriteFuzzSeeds
// regenerates them when SOFTRNIC_WRITE_FUZZ_SEEDS=1.

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

// Opcode tables the packet records index into.
var (
	fuzzAllOps = []wire.Opcode{
		wire.OpSendFirst, wire.OpSendMiddle, wire.OpSendLast, wire.OpSendLastImm, wire.OpSendOnly,
		wire.OpSendOnlyImm, wire.OpWriteFirst, wire.OpWriteMiddle, wire.OpWriteLast, wire.OpWriteLastImm,
		wire.OpWriteOnly, wire.OpWriteOnlyImm, wire.OpReadRequest, wire.OpReadResponseFirst,
		wire.OpReadResponseMiddle, wire.OpReadResponseLast, wire.OpReadResponseOnly, wire.OpAcknowledge,
		wire.OpAtomicAcknowledge, wire.OpCompareSwap, wire.OpFetchAdd, wire.OpSendLastInvalidate,
		wire.OpSendOnlyInvalidate,
	}
	fuzzRespOps = []wire.Opcode{
		wire.OpAcknowledge, wire.OpAtomicAcknowledge, wire.OpReadResponseFirst,
		wire.OpReadResponseMiddle, wire.OpReadResponseLast, wire.OpReadResponseOnly,
	}
)

// fuzzRegion is a registered region as packet records can aim at it.
type fuzzRegion struct {
	key        uint32
	base, size uint64
}

func regionOf(r *tpt.Region) fuzzRegion {
	return fuzzRegion{key: r.Key(), base: r.IOVA(), size: uint64(r.Len())}
}

// pktEnv is what a packet record is built against.
type pktEnv struct {
	ops     []wire.Opcode
	psnBase uint32 // the QP's expected PSN (responder) or oldest unacknowledged PSN (requester)
	destQP  uint32
	mtu     int
	regions [4]fuzzRegion
	good    wire.Flow // from the QP's peer to the device
	bad     wire.Flow // from another address
}

// Packet record layout (every field one byte unless noted; see buildPacket):
//
//	ctl   bits 0-2 kind: 0-5 built packet, 6 raw bytes + ICRC, 7 raw bytes as they are
//	      bit 3 do not run finishBatch after this packet
//	      bit 4 corrupt the ICRC
//	      bit 5 DestQP from the record (3 bytes) instead of the QP's number
//	      bit 6 P_Key from the record (2 bytes) instead of the default
//	      bit 7 send from an address other than the QP's peer (ICRC computed for it)
//	raw:  n, n bytes
//	built:
//	op    < 0xF0: env.ops[op % len]; else the next byte is the opcode
//	fl    bit 0 SE, bit 1 no AckReq, bit 2 MigReq, bit 3 PadCnt from bits 4-5,
//	      bit 6 pad bytes non-zero, bit 7 TVer 1
//	psnd  < 0x80: PSN = base; else PSN = base + ((int8(psnd<<1)) >> 1), -64..63
//	[DestQP u24] [P_Key u16]
//	pm    bits 6-7: 0 payload pm&0x3F bytes, 1 one MTU, 2 MTU + pm&0x3F - 32, 3 u16 % 4200
//	[u16] fill  payload byte i is fill+i
//	then the extended headers the opcode has, in wire order:
//	RETH      va/key (see vaKey), lm: bits 6-7 0 DMALen = payload length, 1 u16,
//	          2 MTU*(1+lm&3) + (lm>>2)&15, 3 u32
//	AETH      s: < 0x80 ACK with no credits, else the next byte is the syndrome; msn
//	AtomicETH va/key, swap (bit 7: u64 follows, else swap&0x7F), compare (likewise)
//	AtomicAck v (0xFF: u64 follows)
//	ImmDt     v
//	IETH      k: < 0x80 key of region k&3, else u32 follows
func buildPacket(r *fuzzReader, env *pktEnv) (pkt []byte, fromBad, flush bool) {
	ctl := r.u8()
	flush = ctl&0x08 == 0
	fromBad = ctl&0x80 != 0
	flow := &env.good
	if fromBad {
		flow = &env.bad
	}
	defer func() {
		if ctl&0x10 != 0 && len(pkt) > 0 {
			pkt[len(pkt)-1] ^= 0x01
		}
	}()
	if kind := ctl & 7; kind >= 6 {
		pkt = append([]byte(nil), r.take(int(r.u8()))...)
		if kind == 6 && len(pkt) >= wire.BTHLen {
			if ctl&0x20 == 0 {
				pkt[5], pkt[6], pkt[7] = byte(env.destQP>>16), byte(env.destQP>>8), byte(env.destQP)
			}
			if ctl&0x40 == 0 {
				pkt[2], pkt[3] = 0xFF, 0xFF
			}
			var icrc [wire.ICRCLen]byte
			wire.PutICRC(icrc[:], flow.ICRC(pkt))
			pkt = append(pkt, icrc[:]...)
		}
		return pkt, fromBad, flush
	}
	var op wire.Opcode
	if o := r.u8(); o < 0xF0 {
		op = env.ops[int(o)%len(env.ops)]
	} else {
		op = wire.Opcode(r.u8())
	}
	fl := r.u8()
	psnd := r.u8()
	delta := int32(0)
	if psnd >= 0x80 {
		delta = int32(int8(psnd<<1)) >> 1
	}
	bth := wire.BTH{
		Opcode: op, SE: fl&1 != 0, AckReq: fl&2 == 0, MigReq: fl&4 != 0,
		PKey: wire.DefaultPKey, DestQP: env.destQP, PSN: wire.PSNAdd(env.psnBase, uint32(delta)&wire.PSNMask),
	}
	if fl&0x80 != 0 {
		bth.TVer = 1
	}
	if ctl&0x20 != 0 {
		bth.DestQP = r.u24()
	}
	if ctl&0x40 != 0 {
		bth.PKey = r.u16()
	}
	pl := payloadLen(r, env.mtu)
	fill := r.u8()

	info := op.Info()
	hl := wire.BTHLen
	if info.Valid {
		hl = info.HdrLen
	}
	pad := wire.PadFor(pl)
	pkt = make([]byte, hl, hl+pl+pad+wire.ICRCLen)
	putExtHeaders(r, env, pkt, info.Flags, pl)
	bth.PadCnt = uint8(pad)
	if fl&0x08 != 0 {
		bth.PadCnt = fl >> 4 & 3
	}
	bth.Put(pkt)
	for i := 0; i < pl; i++ {
		pkt = append(pkt, fill+byte(i))
	}
	for i := 0; i < pad; i++ {
		if fl&0x40 != 0 {
			pkt = append(pkt, 0xAA)
		} else {
			pkt = append(pkt, 0)
		}
	}
	var icrc [wire.ICRCLen]byte
	wire.PutICRC(icrc[:], flow.ICRC(pkt))
	return append(pkt, icrc[:]...), fromBad, flush
}

// payloadLen reads a payload length field (pm, see buildPacket).
func payloadLen(r *fuzzReader, mtu int) int {
	switch pm := r.u8(); pm >> 6 {
	case 0:
		return int(pm & 0x3F)
	case 1:
		return mtu
	case 2:
		return max(0, mtu+int(pm&0x3F)-32)
	}
	return int(r.u16()) % 4200
}

// putExtHeaders reads the fields of the standard extended headers that flags f select
// (see buildPacket) and writes them, in wire order, after the BTH of pkt; pl is the
// payload length. It returns the offset where they end.
func putExtHeaders(r *fuzzReader, env *pktEnv, pkt []byte, f uint32, pl int) int {
	o := wire.BTHLen
	if f&wire.HasRETH != 0 {
		va, key := vaKey(r, env)
		reth := wire.RETH{VA: va, RKey: key}
		switch lm := r.u8(); lm >> 6 {
		case 0:
			reth.DMALen = uint32(pl)
		case 1:
			reth.DMALen = uint32(r.u16())
		case 2:
			reth.DMALen = uint32(env.mtu)*uint32(1+lm&3) + uint32(lm>>2&15)
		case 3:
			reth.DMALen = r.u32()
		}
		reth.Put(pkt[o:])
		o += wire.RETHLen
	}
	if f&wire.HasAETH != 0 {
		a := wire.AETH{Syndrome: wire.AETHAck | wire.NoCredits}
		if r.u8() >= 0x80 {
			a.Syndrome = r.u8()
		}
		a.MSN = uint32(r.u8())
		a.Put(pkt[o:])
		o += wire.AETHLen
	}
	if f&wire.HasAtomicETH != 0 {
		va, key := vaKey(r, env)
		at := wire.AtomicETH{VA: va, RKey: key}
		if v := r.u8(); v&0x80 != 0 {
			at.SwapAdd = r.u64()
		} else {
			at.SwapAdd = uint64(v)
		}
		if v := r.u8(); v&0x80 != 0 {
			at.Compare = r.u64()
		} else {
			at.Compare = uint64(v)
		}
		at.Put(pkt[o:])
		o += wire.AtomicETHLen
	}
	if f&wire.HasAtomicAckETH != 0 {
		v := uint64(r.u8())
		if v == 0xFF {
			v = r.u64()
		}
		putBE64(pkt[o:], v)
		o += wire.AtomicAckETHLen
	}
	if f&wire.HasImmDt != 0 {
		putBE32(pkt[o:], uint32(r.u8()))
		o += wire.ImmDtLen
	}
	if f&wire.HasIETH != 0 {
		k := r.u8()
		key := env.regions[k&3].key
		if k >= 0x80 {
			key = r.u32()
		}
		putBE32(pkt[o:], key)
		o += wire.IETHLen
	}
	return o
}

// vaKey reads an address and key: m bits 0-1 pick a region; bits 2-3: 0 base+int16,
// 1 end-u16, 2 base+8*u8, 3 u64; bits 4-5: 0-1 the region's key, 2 the next region's key,
// 3 u32; bit 6 adds 4 to the address (misaligned); bit 7 flips the key's low bit (a stale
// key of the same table slot).
func vaKey(r *fuzzReader, env *pktEnv) (va uint64, key uint32) {
	m := r.u8()
	reg := env.regions[m&3]
	switch m >> 2 & 3 {
	case 0:
		va = reg.base + uint64(int64(int16(r.u16())))
	case 1:
		va = reg.base + reg.size - uint64(r.u16())
	case 2:
		va = reg.base + 8*uint64(r.u8())
	case 3:
		va = r.u64()
	}
	if m&0x40 != 0 {
		va += 4
	}
	switch m >> 4 & 3 {
	case 0, 1:
		key = reg.key
	case 2:
		key = env.regions[(m+1)&3].key
	case 3:
		key = r.u32()
	}
	if m&0x80 != 0 {
		key ^= 1
	}
	return va, key
}

func putBE32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
}
func putBE64(b []byte, v uint64) { putBE32(b, uint32(v>>32)); putBE32(b[4:], uint32(v)) }

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
		d.rxMu.Lock()
		defer d.rxMu.Unlock()
		rx := d.rx
		d.input(pkt, from)
		refused = d.rx.icrc+d.rx.malformed+d.rx.pkey+d.rx.unknownQP != rx.icrc+rx.malformed+rx.pkey+rx.unknownQP
		if flush {
			d.finishBatch()
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
		return q.weak != nil && q.weak.arrived.Has(p.BTH.PSN)
	}
	ok := p.Decode(pkt) == nil && p.BTH.DestQP == q.QPN()
	had := ok && has()
	_ = feed(d, q, pkt, from, flush)
	return !ok || had || !has()
}

func finish(d *Device) {
	d.rxMu.Lock()
	d.finishBatch()
	d.rxMu.Unlock()
}

// span is a byte range [off, off+n) of a guarded buffer that an input may change.
type span struct{ off, n int }

// guarded is a buffer whose bytes outside some spans must never change.
type guarded struct {
	buf, pristine, snap []byte
}

func newGuarded(n int) *guarded {
	g := &guarded{buf: make([]byte, n), pristine: make([]byte, n), snap: make([]byte, n)}
	for i := range g.pristine {
		g.pristine[i] = "CANARY!-"[i%8] ^ byte(i/8)
	}
	copy(g.buf, g.pristine)
	return g
}

// fill gives [off, off+n) the initial content pattern (also in the pristine copy).
func (g *guarded) fill(off, n int, pattern func(i int) byte) []byte {
	for i := 0; i < n; i++ {
		g.pristine[off+i] = pattern(i)
	}
	copy(g.buf[off:off+n], g.pristine[off:off+n])
	return g.buf[off : off+n : off+n]
}

func (g *guarded) reset() { copy(g.buf, g.pristine) }

// snapshot remembers the buffer's content; changedSince reports the first byte that
// differs from it.
func (g *guarded) snapshot() { copy(g.snap, g.buf) }

func (g *guarded) changedSince() error {
	if i := firstDiff(g.buf, g.snap); i >= 0 {
		return fmt.Errorf("byte %d changed from %#02x to %#02x", i, g.snap[i], g.buf[i])
	}
	return nil
}

// check reports the first changed byte outside the allowed spans.
func (g *guarded) check(allowed []span) error {
	pos := 0
	for _, s := range append(allowed, span{len(g.buf), 0}) {
		if s.off > pos {
			if i := firstDiff(g.buf[pos:s.off], g.pristine[pos:s.off]); i >= 0 {
				return fmt.Errorf("byte %d changed from %#02x to %#02x, outside every span the input may write (%v)",
					pos+i, g.pristine[pos+i], g.buf[pos+i], allowed)
			}
		}
		pos = max(pos, s.off+s.n)
	}
	return nil
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
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
	to.rxMu.Lock() // see below
	clear(dst)
	to.rxMu.Unlock()
	_, err := sa.qp.PostSend([]SendWR{{WRID: 77, Opcode: WRWrite, Flags: FlagSignaled, RemoteAddr: mdst.IOVA(), RKey: mdst.Key(),
		SG: []SGE{{Addr: msrc.IOVA(), Length: uint32(len(src)), LKey: msrc.Key()}}}})
	must(t, err)
	c := waitCQE(t, sa.cq, 1)[0]
	// The responder placed the data under its rxMu; taking it orders that write before the
	// comparison (for the race detector, which cannot see the ordering the ACK gives).
	to.rxMu.Lock()
	equal := bytes.Equal(src, dst)
	to.rxMu.Unlock()
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

// txMonitor is the FaultFilter of a fuzzed device: it checks every packet the device sends
// (valid ICRC for the device's flow to its peer, decodes, default P_Key, plus the target's
// own checks) and drops it, so that the peer never answers; while pass is set (the
// liveness check) it lets everything through unchecked.
type txMonitor struct {
	pass  atomic.Bool
	flow  atomic.Pointer[wire.Flow]
	check func(p *wire.Packet) string
	mu    sync.Mutex
	err   string
}

func (m *txMonitor) filter(pkt []byte) netio.Verdict {
	if m.pass.Load() {
		return netio.Verdict{Action: netio.Pass}
	}
	var p wire.Packet
	msg := ""
	if fl := m.flow.Load(); fl != nil && !fl.VerifyICRC(pkt) {
		msg = "bad ICRC"
	} else if err := p.Decode(pkt); err != nil {
		msg = err.Error()
	} else if p.BTH.PKey != wire.DefaultPKey {
		msg = fmt.Sprintf("P_Key %#x", p.BTH.PKey)
	} else if m.check != nil {
		msg = m.check(&p)
	}
	if msg != "" {
		m.mu.Lock()
		if m.err == "" {
			m.err = fmt.Sprintf("sent packet %x: %s", pkt[:min(len(pkt), 64)], msg)
		}
		m.mu.Unlock()
	}
	return netio.Verdict{Action: netio.Drop}
}

// take returns and clears the first problem seen.
func (m *txMonitor) take() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.err
	m.err = ""
	return e
}

// Responder-side buffer layout: canaries around and between four regions.
const (
	rxGap   = 256
	rxRWOff = rxGap
	rxRWLen = 2048
	rxROOff = rxRWOff + rxRWLen + rxGap
	rxROLen = 512
	rxPDOff = rxROOff + rxROLen + rxGap
	rxPDLen = 512
	rxRQOff = rxPDOff + rxPDLen + rxGap
	rxRQLen = 2048
	rxTotal = rxRQOff + rxRQLen + rxGap
)

// FuzzReceivePath feeds built and raw packets to a responder QP and checks that nothing
// outside the registered region the QP may write changes, that READ responses only carry
// bytes of regions the QP may read, and that the device keeps working.
//
// Input header (then packet records, see buildPacket; PSN base = the responder's ePSN):
//
//	h0  bits 0-1 MTU (256, 512, 1024, 256); bit 2 no remote write, bit 3 no remote read,
//	    bit 4 no remote atomic on the QP; bit 5 stay in RTR; bits 6-7: 3 - number of
//	    receive WQEs
//	h1  bits 0-4: 16 - max_dest_rd_atomic (clamped); bit 5 the first receive WQE points at
//	    the read-only region (local protection error); bit 6 two SGEs per receive WQE;
//	    bit 7 use an SRQ
//	RQ PSN (u24)
func FuzzReceivePath(f *testing.F) {
	g := newGuarded(rxTotal)
	rw := g.fill(rxRWOff, rxRWLen, func(int) byte { return 0 })
	ro := g.fill(rxROOff, rxROLen, func(i int) byte { return 0x40 + byte(i%61) })
	other := g.fill(rxPDOff, rxPDLen, func(i int) byte { return 0xC0 ^ byte(i%59) })
	rq := g.fill(rxRQOff, rxRQLen, func(i int) byte { return 0x80 | byte(i%37) })

	// READ responses must carry bytes of the regions the QP can read; everything goes to
	// the peer QP.
	var peerQPN atomic.Uint32
	mon := &txMonitor{check: func(p *wire.Packet) string {
		if p.BTH.DestQP != peerQPN.Load() {
			return fmt.Sprintf("to QP %#x, not the peer QP %#x", p.BTH.DestQP, peerQPN.Load())
		}
		if p.Info.Has(wire.IsResponse|wire.IsRead) && len(p.Payload) > 0 && !bytes.Contains(rw, p.Payload) && !bytes.Contains(ro, p.Payload) {
			return fmt.Sprintf("%v PSN %#x carries %d bytes found in no readable region: %x",
				p.BTH.Opcode, p.BTH.PSN, len(p.Payload), p.Payload[:min(64, len(p.Payload))])
		}
		return ""
	}}
	a := openSide(f, "127.0.0.1", Config{})
	b := openSide(f, "127.0.0.2", Config{FaultFilter: mon.filter})
	peerQPN.Store(a.qp.QPN())
	mon.flow.Store(&wire.Flow{Src: b.d.LocalAddr().Addr(), Dst: a.d.LocalAddr().Addr(), SrcPort: b.d.LocalAddr().Port(), DstPort: a.d.LocalAddr().Port(), DF: true})
	mrw := reg(f, b.d, rw)
	mro, err := b.d.MRs().Register(1, ro, iova(ro), tpt.RemoteRead)
	must(f, err)
	mpd, err := b.d.MRs().Register(2, other, iova(other), tpt.LocalWrite|tpt.RemoteWrite|tpt.RemoteRead|tpt.RemoteAtomic)
	must(f, err)
	mrq, err := b.d.MRs().Register(1, rq, iova(rq), tpt.LocalWrite)
	must(f, err)
	live := newLiveness(f, mon, a.d, b.d, Ordered)
	aAddr, bAddr := a.d.LocalAddr(), b.d.LocalAddr()
	badAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), aAddr.Port())

	f.Fuzz(func(t *testing.T, data []byte) {
		defer watchdog(data).Stop()
		live.tick(t)
		g.reset()
		_ = mon.take()

		r := &fuzzReader{b: data}
		h0, h1 := r.u8(), r.u8()
		rqpsn := r.u24()
		mtu := [4]uint8{wire.MTU256, wire.MTU512, wire.MTU1024, wire.MTU256}[h0&3]
		access := tpt.LocalWrite | tpt.RemoteWrite | tpt.RemoteRead | tpt.RemoteAtomic
		if h0&0x04 != 0 {
			access &^= tpt.RemoteWrite
		}
		if h0&0x08 != 0 {
			access &^= tpt.RemoteRead
		}
		if h0&0x10 != 0 {
			access &^= tpt.RemoteAtomic
		}
		nrecv := 3 - int(h0>>6)
		maxDest := 16 - min(int(h1&0x1F), 16)

		cq := b.d.NewCQ(128)
		cfg := QPConfig{PD: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2}
		if h1&0x80 != 0 {
			cfg.SRQ = b.d.NewRecvQueue(1, 8, 2, true)
		}
		qp, err := b.d.CreateQP(cfg)
		must(t, err)
		defer qp.Destroy()
		must(t, qp.Modify(&Attr{State: StateInit, Port: 1, Access: access}, MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags, lim))
		must(t, qp.Modify(&Attr{State: StateRTR, PathMTU: mtu, DestQPN: a.qp.QPN(), RQPSN: rqpsn, MaxDestRdAtomic: uint8(maxDest),
			MinRNRTimer: 1, Peer: aAddr}, MaskState|MaskAV|MaskPathMTU|MaskDestQPN|MaskRQPSN|MaskMaxDestRdAtomic|MaskMinRNRTimer, lim))
		if h0&0x20 == 0 {
			must(t, qp.Modify(&Attr{State: StateRTS, SQPSN: 0, Timeout: 0, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
				MaskState|MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskSQPSN|MaskMaxQPRdAtomic, lim))
		}
		// Receive WQEs: 512-byte slots of the receive region, one or two SGEs each.
		allowed := []span{{rxRWOff, rxRWLen}}
		for i := 0; i < nrecv; i++ {
			base := mrq.IOVA() + uint64(i*512)
			sg := []SGE{{Addr: base, Length: 400, LKey: mrq.Key()}}
			if h1&0x40 != 0 {
				sg = []SGE{{Addr: base, Length: 200, LKey: mrq.Key()}, {Addr: base + 256, Length: 200, LKey: mrq.Key()}}
			}
			if i == 0 && h1&0x20 != 0 {
				sg[0] = SGE{Addr: mro.IOVA(), Length: 100, LKey: mro.Key()} // no local write: protection error
			}
			for _, s := range sg {
				if s.LKey == mrq.Key() {
					allowed = append(allowed, span{rxRQOff + int(s.Addr-mrq.IOVA()), int(s.Length)})
				}
			}
			wr := []RecvWR{{WRID: uint64(i), SG: sg}}
			if cfg.SRQ != nil {
				must(t, cfg.SRQ.post(&wr[0]))
			} else {
				_, err := qp.PostRecv(wr)
				must(t, err)
			}
		}

		env := &pktEnv{
			ops:     fuzzAllOps,
			destQP:  qp.QPN(),
			mtu:     wire.MTUBytes(mtu),
			regions: [4]fuzzRegion{regionOf(mrw), regionOf(mro), regionOf(mpd), regionOf(mrq)},
			good:    wire.Flow{Src: aAddr.Addr(), Dst: bAddr.Addr(), SrcPort: aAddr.Port(), DstPort: bAddr.Port(), DF: true},
			bad:     wire.Flow{Src: badAddr.Addr(), Dst: bAddr.Addr(), SrcPort: badAddr.Port(), DstPort: bAddr.Port(), DF: true},
		}
		for n := 0; n < maxFuzzPackets && !r.empty(); n++ {
			qp.mu.Lock()
			env.psnBase = qp.resp.epsn
			qp.mu.Unlock()
			pkt, fromBad, flush := buildPacket(r, env)
			from := aAddr
			if fromBad {
				from = badAddr
			}
			g.snapshot()
			if feed(b.d, qp, pkt, from, flush) {
				if err := g.changedSince(); err != nil {
					t.Fatalf("packet %d (%x) was refused but changed memory: %v", n, pkt, err)
				}
			}
		}
		finish(b.d)
		if testing.Verbose() {
			logOutcome(t, qp, cq)
		}

		if err := g.check(allowed); err != nil {
			t.Fatalf("responder memory: %v", err)
		}
		if e := mon.take(); e != "" {
			t.Fatalf("responder: %s", e)
		}
	})
}

// Requester-side buffer layout: a source region (SEND/WRITE data) and a destination region
// (READ and atomic results), with canaries around both.
const (
	txGap    = 256
	txSrcOff = txGap
	txSrcLen = 2048
	txDstOff = txSrcOff + txSrcLen + txGap
	txDstLen = 4096
	txTotal  = txDstOff + txDstLen + txGap
)

// Work request i of requesterWRs addresses remote memory [requesterRemoteBase+i*0x1000,
// +requesterRemoteLen[i]).
const requesterRemoteBase = 0x10000

var requesterRemoteLen = [...]uint64{0, 600, 8, 300, 8, 1000, 0, 0}

// requesterWRs returns the work requests FuzzRequesterResponses posts, selected by mask,
// and the destination spans they may write.
func requesterWRs(src, dst *tpt.Region, mask uint8, fence bool) ([]SendWR, []span) {
	if mask == 0 {
		mask = 0xFF
	}
	s := func(off, n int) SGE { return SGE{Addr: src.IOVA() + uint64(off), Length: uint32(n), LKey: src.Key()} }
	d := func(off, n int) SGE { return SGE{Addr: dst.IOVA() + uint64(off), Length: uint32(n), LKey: dst.Key()} }
	var ff uint8
	if fence {
		ff = FlagFence
	}
	all := []struct {
		wr    SendWR
		spans []span
	}{
		{SendWR{Opcode: WRSend, SG: []SGE{s(0, 100)}}, nil},
		{SendWR{Opcode: WRRead, SG: []SGE{d(64, 300), d(512, 300)}}, []span{{64, 300}, {512, 300}}},
		{SendWR{Opcode: WRAtomicFetch, CompareAdd: 3, SG: []SGE{d(1024, 8)}}, []span{{1024, 8}}},
		{SendWR{Opcode: WRWrite, SG: []SGE{s(100, 300)}}, nil},
		{SendWR{Opcode: WRAtomicCmpSwap, Flags: ff, CompareAdd: 0, Swap: 9, SG: []SGE{d(1040, 8)}}, []span{{1040, 8}}},
		{SendWR{Opcode: WRRead, Flags: ff, SG: []SGE{d(1100, 1000)}}, []span{{1100, 1000}}},
		{SendWR{Opcode: WRRead}, nil}, // zero-length READ
		{SendWR{Opcode: WRWriteImm, Imm: 5}, nil},
	}
	var wrs []SendWR
	var spans []span
	for i, w := range all {
		if mask&(1<<i) == 0 {
			continue
		}
		w.wr.WRID = uint64(i)
		w.wr.Flags |= FlagSignaled
		w.wr.RemoteAddr, w.wr.RKey = requesterRemoteBase+uint64(i)*0x1000, 0x123456
		wrs = append(wrs, w.wr)
		for _, sp := range w.spans {
			spans = append(spans, span{txDstOff + sp.off, sp.n})
		}
	}
	return wrs, spans
}

// FuzzRequesterResponses feeds ACKs, NAKs, READ responses and atomic ACKs (and anything
// else) to a requester QP with outstanding work requests, and checks that local memory
// outside the READ and atomic destination buffers never changes, that the send queue's
// indices and the outstanding READ/atomic count stay consistent, and that the device keeps
// working.
//
// Input header (then packet records, see buildPacket; PSN base = the oldest unacknowledged
// PSN; opcode table = response opcodes):
//
//	h0  bits 0-1 MTU (256, 512, 1024, 256); bits 2-4: 7 - retry_cnt; bits 5-7: 7 - rnr_retry
//	h1  which work requests to post (bit i: requesterWRs entry i; 0 = all)
//	h2  bits 0-4: 16 - max_rd_atomic (clamped); bit 5 fence the CmpSwap and second READ
//	SQ PSN (u24)
func FuzzRequesterResponses(f *testing.F) {
	g := newGuarded(txTotal)
	src := g.fill(txSrcOff, txSrcLen, func(i int) byte { return byte(i*7 + 1) })
	dst := g.fill(txDstOff, txDstLen, func(i int) byte { return 0xD0 ^ byte(i%53) })

	// Requests go to the peer QP, carry data of the source region and address the remote
	// range of their work request.
	var peerQPN atomic.Uint32
	mon := &txMonitor{check: func(p *wire.Packet) string {
		if p.BTH.DestQP != peerQPN.Load() {
			return fmt.Sprintf("to QP %#x, not the peer QP %#x", p.BTH.DestQP, peerQPN.Load())
		}
		if len(p.Payload) > 0 && !bytes.Contains(src, p.Payload) {
			return fmt.Sprintf("%v payload of %d bytes is not from the source buffer", p.BTH.Opcode, len(p.Payload))
		}
		va, n := p.RETH.VA, uint64(p.RETH.DMALen)
		if p.Info.Has(wire.IsAtomic) {
			va, n = p.Atomic.VA, 8
		} else if !p.Info.Has(wire.HasRETH) {
			return ""
		}
		i := (va - requesterRemoteBase) / 0x1000
		if va < requesterRemoteBase || i >= uint64(len(requesterRemoteLen)) {
			return fmt.Sprintf("%v to remote address %#x, no work request's", p.BTH.Opcode, va)
		}
		base := requesterRemoteBase + i*0x1000
		if va+n > base+requesterRemoteLen[i] || !p.Info.Has(wire.IsRead) && va != base {
			return fmt.Sprintf("%v [%#x, +%d) outside work request %d's remote range [%#x, +%d)", p.BTH.Opcode, va, n, i, base, requesterRemoteLen[i])
		}
		return ""
	}}
	a := openSide(f, "127.0.0.1", Config{FaultFilter: mon.filter, ReadChunk: 2})
	b := openSide(f, "127.0.0.2", Config{})
	peerQPN.Store(b.qp.QPN())
	mon.flow.Store(&wire.Flow{Src: a.d.LocalAddr().Addr(), Dst: b.d.LocalAddr().Addr(), SrcPort: a.d.LocalAddr().Port(), DstPort: b.d.LocalAddr().Port(), DF: true})
	msrc, err := a.d.MRs().Register(1, src, iova(src), 0) // local read only
	must(f, err)
	mdst, err := a.d.MRs().Register(1, dst, iova(dst), tpt.LocalWrite)
	must(f, err)
	live := newLiveness(f, mon, a.d, b.d, Ordered)
	aAddr, bAddr := a.d.LocalAddr(), b.d.LocalAddr()
	badAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), bAddr.Port())

	f.Fuzz(func(t *testing.T, data []byte) {
		defer watchdog(data).Stop()
		live.tick(t)
		g.reset()
		_ = mon.take()

		r := &fuzzReader{b: data}
		h0, h1, h2 := r.u8(), r.u8(), r.u8()
		sqpsn := r.u24()
		mtu := [4]uint8{wire.MTU256, wire.MTU512, wire.MTU1024, wire.MTU256}[h0&3]
		maxRd := 16 - min(int(h2&0x1F), 16)

		cq := a.d.NewCQ(128)
		qp, err := a.d.CreateQP(QPConfig{PD: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 4, MaxSendSGE: 2, MaxRecvSGE: 2})
		must(t, err)
		defer qp.Destroy()
		must(t, qp.Modify(&Attr{State: StateInit, Port: 1, Access: tpt.LocalWrite | tpt.RemoteWrite | tpt.RemoteRead | tpt.RemoteAtomic},
			MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags, lim))
		must(t, qp.Modify(&Attr{State: StateRTR, PathMTU: mtu, DestQPN: b.qp.QPN(), RQPSN: 0, MaxDestRdAtomic: 4, MinRNRTimer: 1,
			Peer: bAddr}, MaskState|MaskAV|MaskPathMTU|MaskDestQPN|MaskRQPSN|MaskMaxDestRdAtomic|MaskMinRNRTimer, lim))
		// Timeout 0: no local ACK timer, so nothing is retransmitted behind the fuzzer's back.
		must(t, qp.Modify(&Attr{State: StateRTS, SQPSN: sqpsn, Timeout: 0, RetryCnt: 7 - h0>>2&7, RNRRetry: 7 - h0>>5, MaxRdAtomic: uint8(maxRd)},
			MaskState|MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskSQPSN|MaskMaxQPRdAtomic, lim))
		wrs, allowed := requesterWRs(msrc, mdst, h1, h2&0x20 != 0)
		if _, err := qp.PostSend(wrs); err != nil {
			t.Fatal(err)
		}

		env := &pktEnv{
			ops:     fuzzRespOps,
			destQP:  qp.QPN(),
			mtu:     wire.MTUBytes(mtu),
			regions: [4]fuzzRegion{regionOf(mdst), regionOf(msrc), regionOf(mdst), regionOf(msrc)},
			good:    wire.Flow{Src: bAddr.Addr(), Dst: aAddr.Addr(), SrcPort: bAddr.Port(), DstPort: aAddr.Port(), DF: true},
			bad:     wire.Flow{Src: badAddr.Addr(), Dst: aAddr.Addr(), SrcPort: badAddr.Port(), DstPort: aAddr.Port(), DF: true},
		}
		for n := 0; n < maxFuzzPackets && !r.empty(); n++ {
			qp.mu.Lock()
			env.psnBase = qp.req.una
			qp.mu.Unlock()
			pkt, fromBad, flush := buildPacket(r, env)
			from := bAddr
			if fromBad {
				from = badAddr
			}
			g.snapshot()
			if feed(a.d, qp, pkt, from, flush) {
				if err := g.changedSince(); err != nil {
					t.Fatalf("packet %d (%x) was refused but changed memory: %v", n, pkt, err)
				}
			}
			if err := requesterConsistent(qp); err != nil {
				t.Fatalf("after packet %d (%x): %v", n, pkt, err)
			}
		}
		finish(a.d)
		if testing.Verbose() {
			logOutcome(t, qp, cq)
		}

		if err := g.check(allowed); err != nil {
			t.Fatalf("requester memory: %v", err)
		}
		if e := mon.take(); e != "" {
			t.Fatalf("requester: %s", e)
		}
	})
}

// logOutcome logs what an input did to the QP (with -v: to check that seeds do what their
// names say).
func logOutcome(t *testing.T, q *QP, cq *CQ) {
	var cqes [128]CQE
	n := cq.Poll(cqes[:])
	s := q.Stats()
	t.Logf("QP %v: rx %d, duplicates %d, out of sequence %d, NAKs sent %d, RNR NAKs sent %d, NAKs received %d, RNR NAKs received %d, dropped %d, wrong source %d; %d CQEs",
		q.State(), s.RxPackets, s.Duplicates, s.OutOfSequence, s.NAKsSent, s.RNRNAKsSent, s.NAKsRecv, s.RNRNAKsRecv, s.Dropped, s.WrongSource, n)
	for _, c := range cqes[:n] {
		t.Logf("  CQE wr %d status %d opcode %d len %d imm %#x vendor %#x", c.WRID, c.Status, c.Opcode, c.ByteLen, c.Imm, c.VendorErr)
	}
}

// requesterConsistent checks invariants of the send queue and the requester.
func requesterConsistent(q *QP) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !(q.sqTail <= q.sqCur && q.sqCur <= q.sqStarted && q.sqStarted <= q.sqHead) {
		return fmt.Errorf("send queue indices out of order: tail %d cur %d started %d head %d", q.sqTail, q.sqCur, q.sqStarted, q.sqHead)
	}
	if q.req.rdOut < 0 || q.req.rdOut > int(q.attr.MaxRdAtomic) {
		return fmt.Errorf("%d READ/atomic requests outstanding, max_rd_atomic %d", q.req.rdOut, q.attr.MaxRdAtomic)
	}
	return nil
}

// ---- weakly-ordered mode ----

// Opcode tables the weak-mode packet records index into: the weak-mode requests (for a
// responder) and what a weak responder sends back (for a requester; SACKs twice as often).
var (
	fuzzWeakReqOps = []wire.Opcode{
		wire.OpWeakSend, wire.OpWeakSendImm, wire.OpWeakWrite, wire.OpWeakWriteImm, wire.OpWeakReadReq,
		wire.OpWeakCmpSwap, wire.OpWeakFetchAdd,
	}
	fuzzWeakRespOps = []wire.Opcode{
		wire.OpWeakAck, wire.OpReadResponseFirst, wire.OpReadResponseMiddle, wire.OpReadResponseLast,
		wire.OpReadResponseOnly, wire.OpAtomicAcknowledge, wire.OpWeakAck,
	}
)

// weakEnv is what a weak-mode packet record is built against.
type weakEnv struct {
	pktEnv
	txSeq uint32 // the requester's transmissions so far (a SACK's echo is relative to it)
}

// Weak-mode packet record layout (see buildWeakPacket; fields one byte unless noted):
//
//	ctl   bits 0-2 kind: 0-5 built packet, 6 raw bytes + ICRC, 7 raw bytes as they are
//	      bit 3 do not run finishBatch after this packet
//	      bit 4 corrupt the ICRC
//	      bit 5 the opcode is the next byte (any opcode), not an index into env.ops
//	      bit 6 no AckReq
//	      bit 7 send from an address other than the QP's peer (ICRC computed for it)
//	raw:  n, n bytes
//	built:
//	op    env.ops[op % len] (with ctl bit 5: the opcode)
//	psnd  0x80: PSN = the u24 that follows; else PSN = base + int8(psnd)
//	pm [u16] fill   if the opcode carries a payload other than SACK ranges (as buildPacket)
//	then the standard extended headers the opcode has, as buildPacket reads them, then:
//	OOH   sq: < 0x80 Seq = sq, else the u24 that follows
//	      om: bits 0-2 k; bits 3-4 Offset: 0 k*MTU, 1 k*MTU+4, 2 the u32 that follows,
//	          3 2^32-1-k; bits 5-6 Length: 0 Offset+payload (the message's last packet),
//	          1 Offset+payload+1+u8 (more packets follow), 2 the u32 that follows, 3 k*MTU;
//	          bit 7 Flags is the byte that follows (else OOHRecv for SENDs and WRITEs with
//	          immediate, as softrnic sends them)
//	      tx: TxSeq = tx (0xFF: the u32 that follows)
//	SACK  sn: bits 0-4 number of ranges (more than 16 is malformed); bit 5 the count word
//	          is the u32 that follows; bit 6 the payload is one byte short; bit 7 the echo
//	          is the u32 that follows, else the byte e that follows: env.txSeq + int8(e)
//	      per range: a: start = base + int8(a) (0x80: the u24 that follows); l: end = start + l
func buildWeakPacket(r *fuzzReader, env *weakEnv) (pkt []byte, fromBad, flush bool) {
	ctl := r.u8()
	flush = ctl&0x08 == 0
	fromBad = ctl&0x80 != 0
	flow := &env.good
	if fromBad {
		flow = &env.bad
	}
	defer func() {
		if ctl&0x10 != 0 && len(pkt) > 0 {
			pkt[len(pkt)-1] ^= 0x01
		}
	}()
	if kind := ctl & 7; kind >= 6 {
		pkt = append([]byte(nil), r.take(int(r.u8()))...)
		if kind == 6 && len(pkt) >= wire.BTHLen {
			pkt[2], pkt[3] = 0xFF, 0xFF
			pkt[5], pkt[6], pkt[7] = byte(env.destQP>>16), byte(env.destQP>>8), byte(env.destQP)
			var icrc [wire.ICRCLen]byte
			wire.PutICRC(icrc[:], flow.ICRC(pkt))
			pkt = append(pkt, icrc[:]...)
		}
		return pkt, fromBad, flush
	}
	var op wire.Opcode
	if ctl&0x20 != 0 {
		op = wire.Opcode(r.u8())
	} else {
		op = env.ops[int(r.u8())%len(env.ops)]
	}
	var psn uint32
	if d := r.u8(); d != 0x80 {
		psn = wire.PSNAdd(env.psnBase, uint32(int32(int8(d)))&wire.PSNMask)
	} else {
		psn = r.u24()
	}
	info := op.Info()
	f := info.Flags
	sack := op == wire.OpWeakAck
	var pl int
	var fill byte
	if f&wire.HasPayload != 0 && !sack {
		pl = payloadLen(r, env.mtu)
		fill = r.u8()
	}
	hl := wire.BTHLen
	if info.Valid {
		hl = info.HdrLen
	}
	hdr := make([]byte, hl)
	o := putExtHeaders(r, &env.pktEnv, hdr, f, pl)
	var pay []byte
	switch {
	case sack && hl-o == wire.SACKHeaderLen:
		pay = weakSACKFields(r, env, hdr[o:])
	case f&wire.IsWeak != 0 && hl-o == wire.OOHLen:
		weakOOHFields(r, env, hdr[o:], op, pl)
	}
	for i := 0; i < pl; i++ {
		pay = append(pay, fill+byte(i))
	}
	pad := wire.PadFor(len(pay))
	bth := wire.BTH{Opcode: op, AckReq: ctl&0x40 == 0, PKey: wire.DefaultPKey, DestQP: env.destQP, PSN: psn, PadCnt: uint8(pad)}
	bth.Put(hdr)
	pkt = append(append(hdr, pay...), make([]byte, pad)...)
	var icrc [wire.ICRCLen]byte
	wire.PutICRC(icrc[:], flow.ICRC(pkt))
	return append(pkt, icrc[:]...), fromBad, flush
}

// weakOOHFields reads an OOH record (see buildWeakPacket) into b.
func weakOOHFields(r *fuzzReader, env *weakEnv, b []byte, op wire.Opcode, pl int) {
	var o wire.OOH
	if sq := r.u8(); sq < 0x80 {
		o.Seq = uint32(sq)
	} else {
		o.Seq = r.u24()
	}
	om := r.u8()
	k := uint32(om & 7)
	mtu := uint32(env.mtu)
	switch om >> 3 & 3 {
	case 0:
		o.Offset = k * mtu
	case 1:
		o.Offset = k*mtu + 4
	case 2:
		o.Offset = r.u32()
	case 3:
		o.Offset = ^uint32(0) - k
	}
	switch om >> 5 & 3 {
	case 0:
		o.Length = o.Offset + uint32(pl)
	case 1:
		o.Length = o.Offset + uint32(pl) + 1 + uint32(r.u8())
	case 2:
		o.Length = r.u32()
	case 3:
		o.Length = k * mtu
	}
	if om&0x80 != 0 {
		o.Flags = r.u8()
	} else if op == wire.OpWeakSend || op == wire.OpWeakSendImm || op == wire.OpWeakWriteImm {
		o.Flags = wire.OOHRecv
	}
	if tx := r.u8(); tx != 0xFF {
		o.TxSeq = uint32(tx)
	} else {
		o.TxSeq = r.u32()
	}
	o.Put(b)
}

// weakSACKFields reads a SACK record (see buildWeakPacket): it writes the SACK header into
// hdr and returns the ranges' bytes.
func weakSACKFields(r *fuzzReader, env *weakEnv, hdr []byte) []byte {
	sn := r.u8()
	n := int(sn & 0x1F)
	count := uint32(n)
	if sn&0x20 != 0 {
		count = r.u32()
	}
	var echo uint32
	if sn&0x80 != 0 {
		echo = r.u32()
	} else {
		echo = env.txSeq + uint32(int32(int8(r.u8())))
	}
	wire.PutSACKHeader(hdr, 0, echo)
	putBE32(hdr, count)
	pay := make([]byte, 0, n*wire.SACKRangeLen)
	for i := 0; i < n; i++ {
		var a uint32
		if d := r.u8(); d != 0x80 {
			a = wire.PSNAdd(env.psnBase, uint32(int32(int8(d)))&wire.PSNMask)
		} else {
			a = r.u24()
		}
		e := wire.PSNAdd(a, uint32(r.u8()))
		pay = append(pay, 0, 0, 0, 0, 0, 0, 0, 0)
		putBE32(pay[len(pay)-8:], a)
		putBE32(pay[len(pay)-4:], e)
	}
	if sn&0x40 != 0 && len(pay) > 0 {
		pay = pay[:len(pay)-1]
	}
	return pay
}

// weakConsistent checks a weakly-ordered QP's bookkeeping: both hole trackers' invariants
// (holes.Tracker.Check), and on the requester side that the oldest unacknowledged PSN is
// the done tracker's base, that nothing beyond what was sent is done, that the count of
// PSNs in flight is the number sent and not yet done, and the requester's
// READ/atomic count and send queue indices (requesterConsistent).
func weakConsistent(q *QP) error {
	if err := requesterConsistent(q); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	ws, r := q.weak, &q.req
	if ws == nil {
		if q.state == StateRTR || q.state == StateRTS || q.state == StateSQD {
			return fmt.Errorf("QP in %v has no weak-mode state", q.state)
		}
		return nil
	}
	if err := ws.arrived.Check(); err != nil {
		return fmt.Errorf("responder's arrival tracker: %v (holes %+v)", err, ws.arrived.Holes(nil))
	}
	if err := ws.done.Check(); err != nil {
		return fmt.Errorf("requester's done tracker: %v (holes %+v)", err, ws.done.Holes(nil))
	}
	if q.state != StateRTS && q.state != StateSQD {
		return nil
	}
	if r.una != ws.done.Base() {
		return fmt.Errorf("una %#x, done tracker's base %#x", r.una, ws.done.Base())
	}
	if wire.PSNBefore(r.highPSN, ws.done.High()) {
		return fmt.Errorf("PSNs up to %#x done, only up to %#x sent", ws.done.High(), r.highPSN)
	}
	n := uint32(0)
	for p := r.una; wire.PSNBefore(p, r.highPSN); p = wire.PSNAdd(p, 1) {
		if !ws.done.Has(p) {
			n++
		}
	}
	if n != ws.inflight {
		return fmt.Errorf("%d PSNs in flight counted, %d sent and not done in [%#x, %#x)", ws.inflight, n, r.una, r.highPSN)
	}
	return nil
}

// checkSACK checks a SACK a weak responder sent: well formed, its ranges beyond the
// cumulative PSN, in order and disjoint.
func checkSACK(p *wire.Packet) string {
	rs, err := wire.DecodeSACK(p.Ext, p.Payload, nil)
	if err != nil {
		return fmt.Sprintf("malformed SACK: %v", err)
	}
	prev := wire.PSNAdd(p.BTH.PSN, 1) // the first missing PSN
	for i, rg := range rs {
		if wire.PSNDiff(rg[0], prev) <= 0 {
			return fmt.Sprintf("SACK for PSN %#x: range %d [%#x, %#x) does not start after %#x", p.BTH.PSN, i, rg[0], rg[1], prev)
		}
		prev = rg[1]
	}
	return ""
}

// cqInOrder polls cq and checks that each work request completed once and, if inOrder,
// that their WRIDs strictly increase: in posting order (the fuzz targets post WRIDs in
// order). With -v it logs them.
func cqInOrder(t *testing.T, cq *CQ, inOrder bool) error {
	var cqes [64]CQE
	last := int64(-1)
	seen := map[uint64]bool{}
	for {
		n := cq.Poll(cqes[:])
		if n == 0 {
			return nil
		}
		for _, c := range cqes[:n] {
			if testing.Verbose() {
				t.Logf("  CQE wr %d status %d opcode %d len %d imm %#x vendor %#x", c.WRID, c.Status, c.Opcode, c.ByteLen, c.Imm, c.VendorErr)
			}
			if seen[c.WRID] {
				return fmt.Errorf("WRID %d (status %d) completed twice", c.WRID, c.Status)
			}
			seen[c.WRID] = true
			if inOrder && int64(c.WRID) <= last {
				return fmt.Errorf("completion of WRID %d (status %d) after WRID %d", c.WRID, c.Status, last)
			}
			last = int64(c.WRID)
		}
	}
}

// weakMaxHole maps two header bits to a max hole (0: the default).
func weakMaxHole(b byte) uint32 { return [4]uint32{64, 128, 256, 0}[b&3] }

// FuzzWeakReceivePath feeds weak-mode requests (and anything else) to a weakly-ordered
// responder QP and checks, after every packet, both hole trackers' invariants and that a
// refused packet changed no memory; after every input, that nothing outside the
// registered region the QP may write and its receive buffers changed, that receive
// completions came once each in posting order, and that every packet the device sent
// decodes with a valid ICRC (SACKs well formed, READ responses carrying bytes of regions
// the QP may read); and that the device keeps working (a weak-mode RDMA WRITE every
// liveEvery inputs and at the end).
//
// Input header (then weak packet records, see buildWeakPacket; PSN base = the responder's
// expected PSN, the first one missing):
//
//	h0  bits 0-1 MTU (256, 512, 1024, 256); bit 2 no remote write, bit 3 no remote read,
//	    bit 4 no remote atomic on the QP; bit 5 stay in RTR; bits 6-7: 3 - number of
//	    receive WQEs
//	h1  bits 0-4: 16 - max_dest_rd_atomic (clamped); bit 5 the first receive WQE points at
//	    the read-only region (local protection error); bit 6 two SGEs per receive WQE;
//	    bit 7 use an SRQ
//	h2  bits 0-1 max hole (64, 128, 256, default)
//	RQ PSN (u24)
func FuzzWeakReceivePath(f *testing.F) {
	g := newGuarded(rxTotal)
	rw := g.fill(rxRWOff, rxRWLen, func(int) byte { return 0 })
	ro := g.fill(rxROOff, rxROLen, func(i int) byte { return 0x40 + byte(i%61) })
	other := g.fill(rxPDOff, rxPDLen, func(i int) byte { return 0xC0 ^ byte(i%59) })
	rq := g.fill(rxRQOff, rxRQLen, func(i int) byte { return 0x80 | byte(i%37) })

	var peerQPN atomic.Uint32
	mon := &txMonitor{check: func(p *wire.Packet) string {
		if p.BTH.DestQP != peerQPN.Load() {
			return fmt.Sprintf("to QP %#x, not the peer QP %#x", p.BTH.DestQP, peerQPN.Load())
		}
		switch {
		case p.BTH.Opcode == wire.OpWeakAck:
			return checkSACK(p)
		case p.BTH.Opcode == wire.OpAcknowledge:
			return "a weak QP sent an ordered-mode ACK"
		case p.Info.Has(wire.IsResponse|wire.IsRead) && len(p.Payload) > 0 && !bytes.Contains(rw, p.Payload) && !bytes.Contains(ro, p.Payload):
			return fmt.Sprintf("%v PSN %#x carries %d bytes found in no readable region: %x",
				p.BTH.Opcode, p.BTH.PSN, len(p.Payload), p.Payload[:min(64, len(p.Payload))])
		}
		return ""
	}}
	a := openSide(f, "127.0.0.1", Config{})
	b := openSide(f, "127.0.0.2", Config{FaultFilter: mon.filter})
	peerQPN.Store(a.qp.QPN())
	mon.flow.Store(&wire.Flow{Src: b.d.LocalAddr().Addr(), Dst: a.d.LocalAddr().Addr(), SrcPort: b.d.LocalAddr().Port(), DstPort: a.d.LocalAddr().Port(), DF: true})
	mrw := reg(f, b.d, rw)
	mro, err := b.d.MRs().Register(1, ro, iova(ro), tpt.RemoteRead)
	must(f, err)
	mpd, err := b.d.MRs().Register(2, other, iova(other), tpt.LocalWrite|tpt.RemoteWrite|tpt.RemoteRead|tpt.RemoteAtomic)
	must(f, err)
	mrq, err := b.d.MRs().Register(1, rq, iova(rq), tpt.LocalWrite)
	must(f, err)
	live := newLiveness(f, mon, a.d, b.d, Weak)
	aAddr, bAddr := a.d.LocalAddr(), b.d.LocalAddr()
	badAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), aAddr.Port())

	f.Fuzz(func(t *testing.T, data []byte) {
		defer watchdog(data).Stop()
		live.tick(t)
		g.reset()
		_ = mon.take()

		r := &fuzzReader{b: data}
		h0, h1, h2 := r.u8(), r.u8(), r.u8()
		rqpsn := r.u24()
		mtu := [4]uint8{wire.MTU256, wire.MTU512, wire.MTU1024, wire.MTU256}[h0&3]
		access := tpt.LocalWrite | tpt.RemoteWrite | tpt.RemoteRead | tpt.RemoteAtomic
		if h0&0x04 != 0 {
			access &^= tpt.RemoteWrite
		}
		if h0&0x08 != 0 {
			access &^= tpt.RemoteRead
		}
		if h0&0x10 != 0 {
			access &^= tpt.RemoteAtomic
		}
		nrecv := 3 - int(h0>>6)
		maxDest := 16 - min(int(h1&0x1F), 16)

		cq := b.d.NewCQ(128)
		cfg := QPConfig{PD: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2}
		if h1&0x80 != 0 {
			cfg.SRQ = b.d.NewRecvQueue(1, 8, 2, true)
		}
		qp, err := b.d.CreateQP(cfg)
		must(t, err)
		defer qp.Destroy()
		must(t, qp.Modify(&Attr{State: StateInit, Port: 1, Access: access}, MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags, lim))
		must(t, qp.Modify(&Attr{State: StateRTR, PathMTU: mtu, DestQPN: a.qp.QPN(), RQPSN: rqpsn, MaxDestRdAtomic: uint8(maxDest),
			MinRNRTimer: 1, Peer: aAddr, Ordering: Weak, MaxHole: weakMaxHole(h2)},
			MaskState|MaskAV|MaskPathMTU|MaskDestQPN|MaskRQPSN|MaskMaxDestRdAtomic|MaskMinRNRTimer|MaskOrdering, lim))
		if h0&0x20 == 0 {
			must(t, qp.Modify(&Attr{State: StateRTS, SQPSN: 0, Timeout: 0, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
				MaskState|MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskSQPSN|MaskMaxQPRdAtomic, lim))
		}
		// Receive WQEs: 512-byte slots of the receive region, one or two SGEs each.
		allowed := []span{{rxRWOff, rxRWLen}}
		for i := 0; i < nrecv; i++ {
			base := mrq.IOVA() + uint64(i*512)
			sg := []SGE{{Addr: base, Length: 400, LKey: mrq.Key()}}
			if h1&0x40 != 0 {
				sg = []SGE{{Addr: base, Length: 200, LKey: mrq.Key()}, {Addr: base + 256, Length: 200, LKey: mrq.Key()}}
			}
			if i == 0 && h1&0x20 != 0 {
				sg[0] = SGE{Addr: mro.IOVA(), Length: 100, LKey: mro.Key()} // no local write: protection error
			}
			for _, s := range sg {
				if s.LKey == mrq.Key() {
					allowed = append(allowed, span{rxRQOff + int(s.Addr-mrq.IOVA()), int(s.Length)})
				}
			}
			wr := []RecvWR{{WRID: uint64(i), SG: sg}}
			if cfg.SRQ != nil {
				must(t, cfg.SRQ.post(&wr[0]))
			} else {
				_, err := qp.PostRecv(wr)
				must(t, err)
			}
		}

		env := &weakEnv{pktEnv: pktEnv{
			ops:     fuzzWeakReqOps,
			destQP:  qp.QPN(),
			mtu:     wire.MTUBytes(mtu),
			regions: [4]fuzzRegion{regionOf(mrw), regionOf(mro), regionOf(mpd), regionOf(mrq)},
			good:    wire.Flow{Src: aAddr.Addr(), Dst: bAddr.Addr(), SrcPort: aAddr.Port(), DstPort: bAddr.Port(), DF: true},
			bad:     wire.Flow{Src: badAddr.Addr(), Dst: bAddr.Addr(), SrcPort: badAddr.Port(), DstPort: bAddr.Port(), DF: true},
		}}
		for n := 0; n < maxFuzzPackets && !r.empty(); n++ {
			qp.mu.Lock()
			env.psnBase = qp.weak.arrived.Base()
			qp.mu.Unlock()
			pkt, fromBad, flush := buildWeakPacket(r, env)
			from := aAddr
			if fromBad {
				from = badAddr
			}
			g.snapshot()
			if weakFeed(b.d, qp, pkt, from, flush) {
				if err := g.changedSince(); err != nil {
					t.Fatalf("packet %d (%x) was refused but changed memory: %v", n, pkt, err)
				}
			}
			if err := weakConsistent(qp); err != nil {
				t.Fatalf("after packet %d (%x): %v", n, pkt, err)
			}
		}
		finish(b.d)
		// Receive WQEs of the QP's own queue complete in posting order. A message takes a
		// WQE of a shared receive queue when its first packet arrives (other QPs take
		// them too), so with an SRQ they complete in message order, each once, but not
		// necessarily in posting order.
		if err := cqInOrder(t, cq, cfg.SRQ == nil); err != nil {
			t.Fatalf("receive completions: %v", err)
		}
		if testing.Verbose() {
			logOutcome(t, qp, cq)
		}
		if err := weakConsistent(qp); err != nil {
			t.Fatalf("after the last packet: %v", err)
		}
		if err := g.check(allowed); err != nil {
			t.Fatalf("responder memory: %v", err)
		}
		if e := mon.take(); e != "" {
			t.Fatalf("responder: %s", e)
		}
	})
}

// FuzzWeakRequesterResponses feeds SACKs (with fuzzed ranges, syndromes and echoed
// transmission numbers), READ responses and atomic ACKs (and anything else) to a
// weakly-ordered requester QP with outstanding work requests, and checks after every
// packet both hole trackers' invariants, the requester's counts (PSNs in flight,
// 0 <= READ/atomic requests outstanding <= max_rd_atomic, send queue indices) and that a
// refused packet changed no memory; after every input, that local memory outside the
// READ and atomic destination buffers never changed, that work requests completed once
// each in posting order, and that every packet the requester sent (first transmissions
// and selective retransmissions) is a weak-mode request carrying source data for its
// work request's remote range; and that the device keeps working.
//
// Input header (then weak packet records, see buildWeakPacket; PSN base = the oldest
// unacknowledged PSN; opcode table = what a weak responder sends):
//
//	h0  bits 0-1 MTU (256, 512, 1024, 256); bits 2-4: 7 - retry_cnt; bits 5-7: 7 - rnr_retry
//	h1  which work requests to post (bit i: requesterWRs entry i; 0 = all)
//	h2  bits 0-4: 16 - max_rd_atomic (clamped); bit 5 fence the CmpSwap and second READ;
//	    bits 6-7 max hole (64, 128, 256, default)
//	SQ PSN (u24)
//
// The requester's device has no loss probe and the QP no ACK timeout, so that nothing is
// retransmitted behind the fuzzer's back; its reordering threshold is 3 transmissions, so
// that SACK echoes reach selective retransmission.
func FuzzWeakRequesterResponses(f *testing.F) {
	g := newGuarded(txTotal)
	src := g.fill(txSrcOff, txSrcLen, func(i int) byte { return byte(i*7 + 1) })
	dst := g.fill(txDstOff, txDstLen, func(i int) byte { return 0xD0 ^ byte(i%53) })

	var peerQPN atomic.Uint32
	mon := &txMonitor{check: func(p *wire.Packet) string {
		if p.BTH.DestQP != peerQPN.Load() {
			return fmt.Sprintf("to QP %#x, not the peer QP %#x", p.BTH.DestQP, peerQPN.Load())
		}
		if p.Info.Has(wire.IsRequest) && !p.Info.Has(wire.IsWeak) {
			return fmt.Sprintf("a weak requester sent an ordered-mode %v", p.BTH.Opcode)
		}
		if p.BTH.Opcode == wire.OpWeakAck {
			return checkSACK(p)
		}
		if !p.Info.Has(wire.IsRequest) {
			return ""
		}
		o, err := wire.DecodeOOH(p.Ext)
		if err != nil {
			return fmt.Sprintf("%v with a bad OOH: %v", p.BTH.Opcode, err)
		}
		if len(p.Payload) > 0 && !bytes.Contains(src, p.Payload) {
			return fmt.Sprintf("%v payload of %d bytes is not from the source buffer", p.BTH.Opcode, len(p.Payload))
		}
		va, n := p.RETH.VA, uint64(p.RETH.DMALen)
		switch {
		case p.Info.Has(wire.IsAtomic):
			va, n = p.Atomic.VA, 8
		case p.Info.Has(wire.IsWrite):
			n = uint64(len(p.Payload)) // every weak WRITE packet addresses its own payload
		case !p.Info.Has(wire.HasRETH):
			return ""
		}
		i := (va - requesterRemoteBase) / 0x1000
		if va < requesterRemoteBase || i >= uint64(len(requesterRemoteLen)) {
			return fmt.Sprintf("%v to remote address %#x, no work request's", p.BTH.Opcode, va)
		}
		base := requesterRemoteBase + i*0x1000
		if va+n > base+requesterRemoteLen[i] {
			return fmt.Sprintf("%v [%#x, +%d) outside work request %d's remote range [%#x, +%d)", p.BTH.Opcode, va, n, i, base, requesterRemoteLen[i])
		}
		if p.Info.Has(wire.IsWrite) && (va-base != uint64(o.Offset) || p.RETH.DMALen != uint32(requesterRemoteLen[i]) || o.Length != p.RETH.DMALen) {
			return fmt.Sprintf("%v at remote offset %d: OOH offset %d, length %d, DMA length %d; work request %d is %d bytes",
				p.BTH.Opcode, va-base, o.Offset, o.Length, p.RETH.DMALen, i, requesterRemoteLen[i])
		}
		return ""
	}}
	a := openSide(f, "127.0.0.1", Config{FaultFilter: mon.filter, ReadChunk: 2, LossProbe: -1, ReorderThreshold: 3})
	b := openSide(f, "127.0.0.2", Config{})
	peerQPN.Store(b.qp.QPN())
	mon.flow.Store(&wire.Flow{Src: a.d.LocalAddr().Addr(), Dst: b.d.LocalAddr().Addr(), SrcPort: a.d.LocalAddr().Port(), DstPort: b.d.LocalAddr().Port(), DF: true})
	msrc, err := a.d.MRs().Register(1, src, iova(src), 0) // local read only
	must(f, err)
	mdst, err := a.d.MRs().Register(1, dst, iova(dst), tpt.LocalWrite)
	must(f, err)
	live := newLiveness(f, mon, a.d, b.d, Weak)
	aAddr, bAddr := a.d.LocalAddr(), b.d.LocalAddr()
	badAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), bAddr.Port())

	f.Fuzz(func(t *testing.T, data []byte) {
		defer watchdog(data).Stop()
		live.tick(t)
		g.reset()
		_ = mon.take()

		r := &fuzzReader{b: data}
		h0, h1, h2 := r.u8(), r.u8(), r.u8()
		sqpsn := r.u24()
		mtu := [4]uint8{wire.MTU256, wire.MTU512, wire.MTU1024, wire.MTU256}[h0&3]
		maxRd := 16 - min(int(h2&0x1F), 16)

		cq := a.d.NewCQ(128)
		qp, err := a.d.CreateQP(QPConfig{PD: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 4, MaxSendSGE: 2, MaxRecvSGE: 2})
		must(t, err)
		defer qp.Destroy()
		must(t, qp.Modify(&Attr{State: StateInit, Port: 1, Access: tpt.LocalWrite | tpt.RemoteWrite | tpt.RemoteRead | tpt.RemoteAtomic},
			MaskState|MaskPKeyIndex|MaskPort|MaskAccessFlags, lim))
		must(t, qp.Modify(&Attr{State: StateRTR, PathMTU: mtu, DestQPN: b.qp.QPN(), RQPSN: 0, MaxDestRdAtomic: 4, MinRNRTimer: 1,
			Peer: bAddr, Ordering: Weak, MaxHole: weakMaxHole(h2 >> 6)},
			MaskState|MaskAV|MaskPathMTU|MaskDestQPN|MaskRQPSN|MaskMaxDestRdAtomic|MaskMinRNRTimer|MaskOrdering, lim))
		must(t, qp.Modify(&Attr{State: StateRTS, SQPSN: sqpsn, Timeout: 0, RetryCnt: 7 - h0>>2&7, RNRRetry: 7 - h0>>5, MaxRdAtomic: uint8(maxRd)},
			MaskState|MaskTimeout|MaskRetryCnt|MaskRNRRetry|MaskSQPSN|MaskMaxQPRdAtomic, lim))
		wrs, allowed := requesterWRs(msrc, mdst, h1, h2&0x20 != 0)
		if _, err := qp.PostSend(wrs); err != nil {
			t.Fatal(err)
		}
		if err := weakConsistent(qp); err != nil {
			t.Fatalf("after posting: %v", err)
		}

		env := &weakEnv{pktEnv: pktEnv{
			ops:     fuzzWeakRespOps,
			destQP:  qp.QPN(),
			mtu:     wire.MTUBytes(mtu),
			regions: [4]fuzzRegion{regionOf(mdst), regionOf(msrc), regionOf(mdst), regionOf(msrc)},
			good:    wire.Flow{Src: bAddr.Addr(), Dst: aAddr.Addr(), SrcPort: bAddr.Port(), DstPort: aAddr.Port(), DF: true},
			bad:     wire.Flow{Src: badAddr.Addr(), Dst: aAddr.Addr(), SrcPort: badAddr.Port(), DstPort: aAddr.Port(), DF: true},
		}}
		for n := 0; n < maxFuzzPackets && !r.empty(); n++ {
			qp.mu.Lock()
			env.psnBase = qp.req.una
			if qp.weak != nil {
				env.txSeq = qp.weak.txSeq
			}
			qp.mu.Unlock()
			pkt, fromBad, flush := buildWeakPacket(r, env)
			from := bAddr
			if fromBad {
				from = badAddr
			}
			g.snapshot()
			if feed(a.d, qp, pkt, from, flush) {
				if err := g.changedSince(); err != nil {
					t.Fatalf("packet %d (%x) was refused but changed memory: %v", n, pkt, err)
				}
			}
			if err := weakConsistent(qp); err != nil {
				t.Fatalf("after packet %d (%x): %v", n, pkt, err)
			}
		}
		finish(a.d)
		if err := cqInOrder(t, cq, true); err != nil {
			t.Fatalf("send completions: %v", err)
		}
		if testing.Verbose() {
			logOutcome(t, qp, cq)
		}
		if err := weakConsistent(qp); err != nil {
			t.Fatalf("after the last packet: %v", err)
		}
		if err := g.check(allowed); err != nil {
			t.Fatalf("requester memory: %v", err)
		}
		if e := mon.take(); e != "" {
			t.Fatalf("requester: %s", e)
		}
	})
}

// ---- seed corpus generator ----

// seedPkt is a packet record in the form buildPacket reads it.
type seedPkt struct {
	ctl    byte
	op     wire.Opcode
	fl     byte
	psnd   byte
	destQP []byte // with ctl bit 5
	pkey   []byte // with ctl bit 6
	pm     []byte // payload length byte (and u16)
	fill   byte
	ext    []byte // extended-header fields, in the order buildPacket reads them
	raw    []byte // kinds 6 and 7
}

func (s seedPkt) encode(ops []wire.Opcode) []byte {
	b := []byte{s.ctl}
	if s.ctl&7 >= 6 {
		return append(append(b, byte(len(s.raw))), s.raw...)
	}
	idx := -1
	for i, o := range ops {
		if o == s.op {
			idx = i
		}
	}
	if idx < 0 {
		b = append(b, 0xF0, byte(s.op))
	} else {
		b = append(b, byte(idx))
	}
	b = append(b, s.fl, s.psnd)
	b = append(b, s.destQP...)
	b = append(b, s.pkey...)
	pm := s.pm
	if pm == nil {
		pm = []byte{0}
	}
	b = append(b, pm...)
	b = append(b, s.fill)
	return append(b, s.ext...)
}

// Field encoders for seeds.
func psnDelta(d int) byte {
	if d == 0 {
		return 0
	}
	return 0x80 | byte(d)&0x7F
}
func plSmall(n int) []byte   { return []byte{byte(n)} } // 0..63
func plMTU() []byte          { return []byte{0x40} }
func plMTUPlus(k int) []byte { return []byte{0x80 | byte(k+32)} } // -32..31
func plBig(n int) []byte     { return []byte{0xC0, byte(n >> 8), byte(n)} }
func vaBase8(sel, k byte) []byte {
	return []byte{0x08 | sel, k}
}
func vaOff(sel byte, off int16) []byte   { return []byte{sel, byte(uint16(off) >> 8), byte(off)} }
func vaEnd(sel byte, back uint16) []byte { return []byte{0x04 | sel, byte(back >> 8), byte(back)} }
func vaRaw(sel byte, va uint64) []byte {
	b := []byte{0x0C | sel, 0, 0, 0, 0, 0, 0, 0, 0}
	putBE64(b[1:], va)
	return b
}
func lenPL() []byte               { return []byte{0x00} }
func len16(n int) []byte          { return []byte{0x40, byte(n >> 8), byte(n)} }
func lenMTU(k, extra byte) []byte { return []byte{0x80 | k | extra<<2} }
func len32(n uint32) []byte {
	b := []byte{0xC0, 0, 0, 0, 0}
	putBE32(b[1:], n)
	return b
}
func aethAck(msn byte) []byte      { return []byte{0x00, msn} }
func aethSyn(syn, msn byte) []byte { return []byte{0x80, syn, msn} }
func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// TestWriteFuzzSeeds writes the seed corpora of FuzzReceivePath, FuzzRequesterResponses,
// FuzzWeakReceivePath and FuzzWeakRequesterResponses into testdata/fuzz/. It only runs with SOFTRNIC_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SOFTRNIC_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set SOFTRNIC_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	write := func(target string, seeds map[string][]byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		// Keep the inputs the fuzzer found (regression-*): the generator cannot make them.
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), "regression-") {
				must(t, os.Remove(filepath.Join(dir, e.Name())))
			}
		}
		must(t, os.MkdirAll(dir, 0o755))
		for name, data := range seeds {
			must(t, os.WriteFile(filepath.Join(dir, name), []byte(fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)), 0o644))
		}
		t.Logf("%s: %d seeds", target, len(seeds))
	}
	prog := func(ops []wire.Opcode, hdr []byte, pkts ...seedPkt) []byte {
		b := append([]byte(nil), hdr...)
		for _, p := range pkts {
			b = append(b, p.encode(ops)...)
		}
		return b
	}

	// FuzzReceivePath: header h0, h1, RQ PSN.
	rh := func(h0, h1 byte, psn uint32) []byte {
		return []byte{h0, h1, byte(psn >> 16), byte(psn >> 8), byte(psn)}
	}
	rx := func(hdr []byte, pkts ...seedPkt) []byte { return prog(fuzzAllOps, hdr, pkts...) }
	def := rh(0, 0, 0)
	wOnly := func(n int, va []byte) seedPkt {
		return seedPkt{op: wire.OpWriteOnly, pm: plSmall(n), fill: 0x11, ext: cat(va, lenPL())}
	}
	read := func(va []byte, n int) seedPkt { return seedPkt{op: wire.OpReadRequest, ext: cat(va, len16(n))} }
	fadd := func(va []byte, add byte) seedPkt { return seedPkt{op: wire.OpFetchAdd, ext: cat(va, []byte{add, 0})} }
	cswap := func(va []byte, swap, cmp byte) seedPkt {
		return seedPkt{op: wire.OpCompareSwap, ext: cat(va, []byte{swap, cmp})}
	}
	send := func(op wire.Opcode, pm []byte) seedPkt { return seedPkt{op: op, pm: pm, fill: 0x30} }
	rxSeeds := map[string][]byte{
		"empty":                 {},
		"header-only":           def,
		"write-only":            rx(def, wOnly(32, vaBase8(0, 4))),
		"write-first-mid-last":  rx(def, seedPkt{op: wire.OpWriteFirst, pm: plMTU(), fill: 1, ext: cat(vaBase8(0, 0), lenMTU(2, 0))}, seedPkt{op: wire.OpWriteMiddle, pm: plMTU(), fill: 2}, seedPkt{op: wire.OpWriteLast, pm: plMTU(), fill: 3}),
		"write-first-mid-short": rx(def, seedPkt{op: wire.OpWriteFirst, pm: plMTU(), fill: 1, ext: cat(vaBase8(0, 2), lenMTU(1, 5))}, seedPkt{op: wire.OpWriteMiddle, pm: plMTU(), fill: 2}, seedPkt{op: wire.OpWriteLastImm, pm: plSmall(5), fill: 3, ext: []byte{9}}),
		"write-past-end":        rx(def, wOnly(32, vaEnd(0, 16))),
		"write-before-start":    rx(def, wOnly(16, vaOff(0, -8))),
		"write-read-only-mr":    rx(def, wOnly(16, vaBase8(1, 1))),
		"write-other-pd":        rx(def, wOnly(16, vaBase8(2, 1))),
		"write-local-only-mr":   rx(def, wOnly(16, vaBase8(3, 1))),
		"write-other-key":       rx(def, wOnly(16, []byte{0x28, 1})),
		"write-stale-key":       rx(def, wOnly(16, []byte{0x88, 1})),
		"write-len-mismatch":    rx(def, seedPkt{op: wire.OpWriteOnly, pm: plSmall(32), ext: cat(vaBase8(0, 0), len16(64))}),
		"write-huge-dmalen":     rx(def, seedPkt{op: wire.OpWriteFirst, pm: plMTU(), ext: cat(vaBase8(0, 0), len32(0xFFFFFFFF))}),
		"write-zero-length":     rx(def, seedPkt{op: wire.OpWriteOnly, ext: cat(vaRaw(0, 0xdeadbeef00), len16(0))}),
		"write-imm":             rx(def, seedPkt{op: wire.OpWriteOnlyImm, pm: plSmall(8), fill: 5, ext: cat(vaBase8(0, 2), lenPL(), []byte{0x42})}),
		"write-imm-no-wqe":      rx(rh(0xC0, 0, 0), seedPkt{op: wire.OpWriteOnlyImm, pm: plSmall(8), ext: cat(vaBase8(0, 2), lenPL(), []byte{1})}, seedPkt{op: wire.OpWriteOnlyImm, pm: plSmall(8), ext: cat(vaBase8(0, 2), lenPL(), []byte{1})}),
		"read":                  rx(def, read(vaBase8(0, 0), 768), seedPkt{op: wire.OpReadRequest, psnd: psnDelta(-3), ext: cat(vaBase8(0, 0), len16(768))}, read(vaEnd(0, 100), 100)),
		"read-dup-middle":       rx(def, read(vaBase8(0, 0), 1000), seedPkt{op: wire.OpReadRequest, psnd: psnDelta(-2), ext: cat(vaBase8(0, 64), len16(488))}),
		"read-past-end":         rx(def, read(vaEnd(0, 50), 100)),
		"read-read-only-mr":     rx(def, read(vaBase8(1, 0), 300)),
		"read-other-pd":         rx(def, read(vaBase8(2, 0), 64)),
		"read-zero":             rx(def, read(vaRaw(0, 1), 0)),
		"read-max-dest-0":       rx(rh(0, 0x10, 0), read(vaBase8(0, 0), 64)),
		"read-ring-overflow":    rx(rh(0, 0x0F, 0), seedPkt{ctl: 0x08, op: wire.OpReadRequest, ext: cat(vaBase8(0, 0), len16(600))}, seedPkt{ctl: 0x08, op: wire.OpReadRequest, ext: cat(vaBase8(0, 1), len16(600))}, read(vaBase8(0, 2), 600), seedPkt{op: wire.OpReadRequest, psnd: psnDelta(-6), ext: cat(vaBase8(0, 0), len16(600))}),
		"atomics":               rx(def, fadd(vaBase8(0, 1), 5), cswap(vaBase8(0, 1), 0x7F, 5), seedPkt{op: wire.OpFetchAdd, psnd: psnDelta(-2), ext: cat(vaBase8(0, 1), []byte{5, 0})}, fadd(vaBase8(0, 2), 1)),
		"atomic-misaligned":     rx(def, fadd([]byte{0x48, 1}, 1)),
		"atomic-past-end":       rx(def, fadd(vaEnd(0, 4), 1)),
		"atomic-read-only-mr":   rx(def, cswap(vaBase8(1, 0), 1, 0)),
		"atomic-big-values":     rx(def, seedPkt{op: wire.OpCompareSwap, ext: cat(vaBase8(0, 3), []byte{0x80, 1, 2, 3, 4, 5, 6, 7, 8, 0x80, 0, 0, 0, 0, 0, 0, 0, 0})}),
		"send-only":             rx(def, send(wire.OpSendOnly, plSmall(50)), send(wire.OpSendOnlyImm, plSmall(0)).withExt([]byte{7})),
		"send-first-last":       rx(def, send(wire.OpSendFirst, plMTU()), send(wire.OpSendLast, plBig(100))),
		"send-too-long":         rx(def, send(wire.OpSendFirst, plMTU()), send(wire.OpSendMiddle, plMTU()), send(wire.OpSendLast, plSmall(1))),
		"send-two-sges":         rx(rh(0, 0x40, 0), send(wire.OpSendFirst, plMTU()), send(wire.OpSendLastImm, plBig(144)).withExt([]byte{3}), send(wire.OpSendOnly, plSmall(63))),
		"send-bad-wqe":          rx(rh(0, 0x20, 0), send(wire.OpSendOnly, plSmall(20))),
		"send-rnr":              rx(rh(0xC0, 0, 0), send(wire.OpSendOnly, plSmall(20)), send(wire.OpSendOnly, plSmall(20))),
		"send-invalidate":       rx(def, send(wire.OpSendOnlyInvalidate, plSmall(4)).withExt([]byte{0})),
		"srq":                   rx(rh(0, 0x80, 0), send(wire.OpSendOnly, plSmall(20)), send(wire.OpSendFirst, plMTU()), seedPkt{op: wire.OpWriteOnly, ext: cat(vaBase8(0, 0), lenPL())}),
		"psn-ahead":             rx(def, seedPkt{op: wire.OpWriteOnly, psnd: psnDelta(5), pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}, wOnly(4, vaBase8(0, 0))),
		"write-duplicate":       rx(def, wOnly(4, vaBase8(0, 0)), seedPkt{op: wire.OpWriteOnly, psnd: psnDelta(-1), pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}),
		"opcode-sequence":       rx(def, seedPkt{op: wire.OpWriteMiddle, pm: plMTU()}),
		"send-then-write":       rx(def, send(wire.OpSendFirst, plMTU()), wOnly(4, vaBase8(0, 0))),
		"psn-wrap":              rx(rh(0, 0, 0xFFFFFE), seedPkt{op: wire.OpWriteFirst, pm: plMTU(), ext: cat(vaBase8(0, 0), lenMTU(2, 0))}, seedPkt{op: wire.OpWriteMiddle, pm: plMTU()}, seedPkt{op: wire.OpWriteLast, pm: plMTU()}, read(vaBase8(0, 0), 512)),
		"no-flush-batch":        rx(def, seedPkt{ctl: 0x08, op: wire.OpWriteOnly, pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}, seedPkt{ctl: 0x08, op: wire.OpReadRequest, ext: cat(vaBase8(0, 0), len16(300))}, seedPkt{ctl: 0x08, op: wire.OpFetchAdd, ext: cat(vaBase8(0, 0), []byte{1, 0})}, seedPkt{ctl: 0x08, op: wire.OpSendOnly, pm: plSmall(4)}),
		"rtr":                   rx(rh(0x20, 0, 0), wOnly(16, vaBase8(0, 0)), send(wire.OpSendOnly, plSmall(3))),
		"qp-without-rights":     rx(rh(0x1C, 0, 0), wOnly(16, vaBase8(0, 0)), read(vaBase8(0, 0), 16), fadd(vaBase8(0, 0), 1)),
		"mtu-1024":              rx(rh(2, 0, 0), seedPkt{op: wire.OpWriteFirst, pm: plMTU(), ext: cat(vaBase8(0, 0), lenMTU(0, 9))}, seedPkt{op: wire.OpWriteLast, pm: plSmall(9)}),
		"response-to-responder": rx(def, seedPkt{op: wire.OpAcknowledge, ext: aethAck(0)}, seedPkt{op: wire.OpReadResponseOnly, pm: plSmall(8), ext: aethAck(0)}),
		"raw":                   rx(def, seedPkt{ctl: 7, raw: []byte("\x0a\x00\xff\xff\x00\x00\x00\x02\x80\x00\x00\x00garbage")}, seedPkt{ctl: 6, raw: []byte{0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x1f, 0, 0, 0}}, seedPkt{ctl: 6, raw: make([]byte, 40)}),
		"wrong-source":          rx(def, seedPkt{ctl: 0x80, op: wire.OpWriteOnly, pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}),
		"bad-icrc":              rx(def, seedPkt{ctl: 0x10, op: wire.OpWriteOnly, pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}),
		"bad-pkey":              rx(def, seedPkt{ctl: 0x40, pkey: []byte{0x7F, 0xFF}, op: wire.OpWriteOnly, pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}),
		"unknown-qp":            rx(def, seedPkt{ctl: 0x20, destQP: []byte{0, 0, 1}, op: wire.OpWriteOnly, pm: plSmall(4), ext: cat(vaBase8(0, 0), lenPL())}),
		"pad-mismatch":          rx(def, seedPkt{op: wire.OpSendOnly, fl: 0x38, pm: plSmall(4)}, seedPkt{op: wire.OpWriteOnly, fl: 0x40, pm: plSmall(5), ext: cat(vaBase8(0, 0), lenPL())}),
		"tver-1":                rx(def, seedPkt{op: wire.OpSendOnly, fl: 0x80, pm: plSmall(4)}),
		"unknown-opcodes":       rx(def, seedPkt{op: 0x15, pm: plSmall(4)}, seedPkt{op: 0xC5}, seedPkt{op: 0x24, pm: plSmall(8)}),
	}
	write("FuzzReceivePath", rxSeeds)

	// FuzzRequesterResponses: header h0, h1, h2, SQ PSN. With MTU 256 and every work
	// request, the PSNs are: SEND 0, READ(600) 1-3 in requests 1-2 and 3, FETCH_ADD 4,
	// WRITE(300) 5-6, CMP_SWAP 7, READ(1000) 8-11 in requests 8-9 and 10-11, READ(0) 12,
	// WRITE_IMM(0) 13.
	th := func(h0, h1, h2 byte, psn uint32) []byte {
		return []byte{h0, h1, h2, byte(psn >> 16), byte(psn >> 8), byte(psn)}
	}
	tx := func(hdr []byte, pkts ...seedPkt) []byte { return prog(fuzzRespOps, hdr, pkts...) }
	ack := func(d int) seedPkt { return seedPkt{op: wire.OpAcknowledge, psnd: psnDelta(d), ext: aethAck(0)} }
	nak := func(d int, syn byte) seedPkt {
		return seedPkt{op: wire.OpAcknowledge, psnd: psnDelta(d), ext: aethSyn(syn, 0)}
	}
	rr := func(op wire.Opcode, pm []byte) seedPkt {
		s := seedPkt{op: op, pm: pm, fill: 0x5A}
		if op != wire.OpReadResponseMiddle {
			s.ext = aethAck(0)
		}
		return s
	}
	aack := func(v byte) seedPkt { return seedPkt{op: wire.OpAtomicAcknowledge, ext: cat(aethAck(0), []byte{v})} }
	all := []seedPkt{
		ack(0),
		rr(wire.OpReadResponseFirst, plMTU()), rr(wire.OpReadResponseLast, plMTU()), rr(wire.OpReadResponseOnly, plBig(88)),
		aack(7), ack(1), aack(0),
		rr(wire.OpReadResponseFirst, plMTU()), rr(wire.OpReadResponseLast, plMTU()),
		rr(wire.OpReadResponseFirst, plMTU()), rr(wire.OpReadResponseLast, plBig(232)),
		rr(wire.OpReadResponseOnly, nil), ack(0),
	}
	tdef := th(0, 0, 0, 0)
	txSeeds := map[string][]byte{
		"empty":                 {},
		"header-only":           tdef,
		"all-complete":          tx(tdef, all...),
		"all-complete-psn-wrap": tx(th(0, 0, 0, 0xFFFFFA), all...),
		"all-no-flush": tx(tdef, func() []seedPkt {
			c := append([]seedPkt(nil), all...)
			for i := range c {
				c[i].ctl |= 0x08
			}
			return c
		}()...),
		"read-out-of-order":     tx(tdef, ack(0), rr(wire.OpReadResponseLast, plMTU()).withPSN(1), rr(wire.OpReadResponseFirst, plMTU())),
		"nak-seq":               tx(tdef, nak(1, wire.AETHNak|wire.NakPSNSeqError), ack(0)),
		"nak-seq-no-retries":    tx(th(0x1C, 0, 0, 0), nak(0, wire.AETHNak), nak(0, wire.AETHNak), nak(0, wire.AETHNak)),
		"nak-access":            tx(tdef, ack(0), nak(0, wire.AETHNak|wire.NakRemoteAccessError)),
		"nak-invalid":           tx(tdef, nak(0, wire.AETHNak|wire.NakInvalidRequest)),
		"nak-remote-op":         tx(tdef, nak(2, wire.AETHNak|wire.NakRemoteOpError)),
		"nak-invalid-rd":        tx(tdef, nak(1, wire.AETHNak|wire.NakInvalidRDRequest)),
		"nak-reserved":          tx(tdef, nak(0, wire.AETHNak|0x1F), nak(0, 0x40), nak(0, 0xE0)),
		"rnr":                   tx(tdef, nak(0, wire.AETHRNR|1), ack(0)),
		"rnr-no-retries":        tx(th(0xE0, 0, 0, 0), nak(0, wire.AETHRNR|1)),
		"read-wrong-length":     tx(tdef, ack(0), rr(wire.OpReadResponseFirst, plMTUPlus(5)), rr(wire.OpReadResponseFirst, plMTUPlus(-1))),
		"read-wrong-opcode":     tx(tdef, ack(0), rr(wire.OpReadResponseOnly, plMTU()), rr(wire.OpReadResponseMiddle, plMTU()), rr(wire.OpReadResponseLast, plBig(88)).withPSN(2)),
		"atomic-ack-for-read":   tx(tdef, ack(0), aack(1)),
		"read-resp-for-atomic":  tx(th(0, 0x04, 0, 0), rr(wire.OpReadResponseOnly, plSmall(8))),
		"ack-beyond-sent":       tx(tdef, ack(40)),
		"ack-covering-read":     tx(tdef, ack(5), ack(0)),
		"ack-duplicate":         tx(tdef, ack(0), ack(0), ack(-1), ack(-20)),
		"max-rd-atomic-1":       tx(th(0, 0, 0x0F, 0), ack(0), rr(wire.OpReadResponseFirst, plMTU()), rr(wire.OpReadResponseLast, plMTU()), rr(wire.OpReadResponseOnly, plBig(88)), aack(1)),
		"max-rd-atomic-0":       tx(th(0, 0, 0x10, 0), ack(0)),
		"fence":                 tx(th(0, 0, 0x20, 0), all...),
		"mtu-1024-reads":        tx(th(2, 0x22, 0, 0), rr(wire.OpReadResponseOnly, plBig(600)), rr(wire.OpReadResponseOnly, plBig(1000))),
		"mtu-512":               tx(th(1, 0, 0, 0), all...),
		"requests-to-requester": tx(tdef, seedPkt{op: wire.OpWriteOnly, pm: plSmall(8), ext: cat(vaBase8(0, 0), lenPL())}, seedPkt{op: wire.OpReadRequest, ext: cat(vaBase8(1, 0), len16(64))}, seedPkt{op: wire.OpSendOnly, pm: plSmall(8)}),
		"atomic-ack-raw-value":  tx(th(0, 0x04, 0, 0), seedPkt{op: wire.OpAtomicAcknowledge, ext: cat(aethAck(0), []byte{0xFF, 1, 2, 3, 4, 5, 6, 7, 8})}),
		"raw":                   tx(tdef, seedPkt{ctl: 7, raw: []byte("\x11\x00\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x1f\x00\x00\x00xxxx")}, seedPkt{ctl: 6, raw: []byte{0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x1f, 0, 0, 0}}),
		"wrong-source":          tx(tdef, seedPkt{ctl: 0x80, op: wire.OpAcknowledge, ext: aethAck(0)}),
		"bad-icrc":              tx(tdef, seedPkt{ctl: 0x10, op: wire.OpAcknowledge, ext: aethAck(0)}),
		"bad-pkey":              tx(tdef, seedPkt{ctl: 0x40, pkey: []byte{0, 1}, op: wire.OpAcknowledge, ext: aethAck(0)}),
		"unknown-qp":            tx(tdef, seedPkt{ctl: 0x20, destQP: []byte{0xFF, 0xFF, 0xFF}, op: wire.OpAcknowledge, ext: aethAck(0)}),
	}
	write("FuzzRequesterResponses", txSeeds)

	writeWeakSeeds(write)
}

// weakSeedPkt is a weak-mode packet record in the form buildWeakPacket reads it. Its PSN
// is absolute.
type weakSeedPkt struct {
	ctl  byte
	op   wire.Opcode
	psn  uint32
	pm   []byte // payload length field(s), for opcodes with a payload other than SACK ranges
	fill byte
	ext  []byte // standard extended-header fields, as buildPacket reads them
	ooh  []byte // OOH fields
	sack []byte // SACK fields
	raw  []byte // kinds 6 and 7
}

func (s weakSeedPkt) encode(ops []wire.Opcode) []byte {
	b := []byte{s.ctl}
	if s.ctl&7 >= 6 {
		return append(append(b, byte(len(s.raw))), s.raw...)
	}
	idx := -1
	for i, o := range ops {
		if o == s.op {
			idx = i
			break
		}
	}
	if idx < 0 || s.ctl&0x20 != 0 {
		b[0] |= 0x20
		b = append(b, byte(s.op))
	} else {
		b = append(b, byte(idx))
	}
	b = append(b, 0x80, byte(s.psn>>16), byte(s.psn>>8), byte(s.psn))
	if s.op.Info().Flags&wire.HasPayload != 0 && s.op != wire.OpWeakAck {
		pm := s.pm
		if pm == nil {
			pm = []byte{0}
		}
		b = append(append(b, pm...), s.fill)
	}
	return append(append(append(b, s.ext...), s.ooh...), s.sack...)
}

// OOH and SACK record encoders for seeds.
func oohOM(k, off, ln byte) byte { return k | off<<3 | ln<<5 }
func oohRec(seq, om byte, mid []byte, tx byte) []byte {
	return append(append([]byte{seq, om}, mid...), tx)
}

// sackRec is a SACK record with echo env.txSeq + int8(echo) and ranges [start, start+n).
func sackRec(echo int8, ranges ...[2]uint32) []byte {
	b := []byte{byte(len(ranges)), byte(echo)}
	for _, r := range ranges {
		b = append(b, 0x80, byte(r[0]>>16), byte(r[0]>>8), byte(r[0]), byte(r[1]))
	}
	return b
}

// writeWeakSeeds writes the seed corpora of FuzzWeakReceivePath and
// FuzzWeakRequesterResponses.
func writeWeakSeeds(save func(target string, seeds map[string][]byte)) {
	prog := func(ops []wire.Opcode, hdr []byte, pkts ...weakSeedPkt) []byte {
		b := append([]byte(nil), hdr...)
		for _, p := range pkts {
			b = append(b, p.encode(ops)...)
		}
		return b
	}
	// FuzzWeakReceivePath: header h0, h1, h2, RQ PSN. MTU 256 unless h0 says otherwise;
	// h2 0 is a max hole of 64.
	wh := func(h0, h1, h2 byte, psn uint32) []byte {
		return []byte{h0, h1, h2, byte(psn >> 16), byte(psn >> 8), byte(psn)}
	}
	rx := func(hdr []byte, pkts ...weakSeedPkt) []byte { return prog(fuzzWeakReqOps, hdr, pkts...) }
	def := wh(0, 0, 0, 0)
	// A one-packet SEND of n (< 64) bytes with receive sequence number rsn.
	send := func(psn uint32, rsn byte, n int) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakSend, psn: psn, pm: plSmall(n), fill: 0x30 + rsn, ooh: oohRec(rsn, oohOM(0, 0, 0), nil, byte(psn))}
	}
	// Packet k of a SEND of 256+rest bytes at MTU 256: k 0 carries an MTU, k 1 the rest.
	send2 := func(psn uint32, rsn byte, k int, rest int) weakSeedPkt {
		if k == 0 {
			return weakSeedPkt{op: wire.OpWeakSend, psn: psn, pm: plMTU(), fill: 0x50, ooh: oohRec(rsn, oohOM(0, 0, 1), []byte{byte(rest - 1)}, byte(psn))}
		}
		return weakSeedPkt{op: wire.OpWeakSend, psn: psn, pm: plSmall(rest), fill: 0x60, ooh: oohRec(rsn, oohOM(1, 0, 0), nil, byte(psn))}
	}
	write := func(psn uint32, va []byte, n int) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakWrite, psn: psn, pm: plSmall(n), fill: 0x11, ext: cat(va, lenPL()), ooh: oohRec(0, oohOM(0, 0, 0), nil, byte(psn))}
	}
	writeImm := func(psn uint32, rsn byte, va []byte, n int, imm byte) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakWriteImm, psn: psn, pm: plSmall(n), fill: 0x22, ext: cat(va, lenPL(), []byte{imm}), ooh: oohRec(rsn, oohOM(0, 0, 0), nil, byte(psn))}
	}
	read := func(psn uint32, seq byte, va []byte, n int) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakReadReq, psn: psn, ext: cat(va, len16(n)), ooh: oohRec(seq, oohOM(0, 3, 2), []byte{0, 0, byte(n >> 8), byte(n)}, byte(psn))}
	}
	fadd := func(psn uint32, seq byte, va []byte, add byte) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakFetchAdd, psn: psn, ext: cat(va, []byte{add, 0}), ooh: oohRec(seq, oohOM(0, 3, 3), nil, byte(psn))}
	}
	cswap := func(psn uint32, seq byte, va []byte, swap, cmp byte) weakSeedPkt {
		return weakSeedPkt{op: wire.OpWeakCmpSwap, psn: psn, ext: cat(va, []byte{swap, cmp}), ooh: oohRec(seq, oohOM(0, 3, 3), nil, byte(psn))}
	}
	with := func(p weakSeedPkt, f func(*weakSeedPkt)) weakSeedPkt { f(&p); return p }
	rxSeeds := map[string][]byte{
		"empty":                 {},
		"header-only":           def,
		"send-in-order":         rx(def, send(0, 0, 20), send(1, 1, 30), send(2, 2, 0)),
		"send-beyond-hole":      rx(def, send(0, 0, 20), send(2, 2, 21), send(1, 1, 22)),
		"send-two-holes":        rx(def, send(0, 0, 1), send(2, 2, 2), send(4, 4&3, 3), send(3, 3, 4), send(1, 1, 5)),
		"send-multi-reversed":   rx(def, send2(1, 0, 1, 44), send2(0, 0, 0, 44), send(2, 1, 7)),
		"send-too-long":         rx(def, send2(0, 0, 0, 194), send2(1, 0, 1, 194)),
		"send-two-sges":         rx(wh(0, 0x40, 0, 0), send2(1, 0, 1, 44), send2(0, 0, 0, 44)),
		"send-bad-recv-lkey":    rx(wh(0, 0x20, 0, 0), send(1, 1, 3), send(0, 0, 3)),
		"send-imm":              rx(def, weakSeedPkt{op: wire.OpWeakSendImm, psn: 0, pm: plSmall(9), fill: 1, ext: []byte{0x77}, ooh: oohRec(0, oohOM(0, 0, 0), nil, 0)}),
		"rnr":                   rx(wh(0xC0, 0, 0, 0), send(0, 0, 5), send(1, 1, 5), write(2, vaBase8(0, 0), 4)),
		"rnr-beyond-wqes":       rx(wh(0x80, 0, 0, 0), send(2, 2, 5), send(0, 0, 5), send(1, 1, 5)),
		"write-beyond-hole":     rx(def, write(1, vaBase8(0, 4), 16), write(0, vaBase8(0, 0), 32)),
		"write-multi-reversed":  rx(def, with(write(1, vaOff(0, 256), 40), func(p *weakSeedPkt) { p.ooh = oohRec(0, oohOM(1, 0, 0), nil, 1) }), with(write(0, vaBase8(0, 0), 0), func(p *weakSeedPkt) { p.pm, p.ooh = plMTU(), oohRec(0, oohOM(0, 0, 1), []byte{39}, 0) })),
		"write-imm-beyond-hole": rx(def, writeImm(1, 0, vaBase8(0, 2), 8, 0x42), write(0, vaBase8(0, 0), 8)),
		"write-imm-no-wqe":      rx(wh(0xC0, 0, 0, 0), writeImm(0, 0, vaBase8(0, 2), 8, 1)),
		"write-other-pd":        rx(def, write(1, vaBase8(0, 0), 4), write(0, vaBase8(2, 1), 16)),
		"write-read-only-mr":    rx(def, write(0, vaBase8(1, 0), 16)),
		"write-past-end":        rx(def, write(0, vaEnd(0, 16), 32)),
		"write-zero-length":     rx(def, weakSeedPkt{op: wire.OpWeakWrite, psn: 0, ext: cat(vaRaw(0, 0xdeadbeef00), lenPL()), ooh: oohRec(0, oohOM(0, 0, 0), nil, 0)}),
		"read-held":             rx(def, read(1, 0, vaBase8(0, 0), 300), write(0, vaBase8(0, 40), 8)),
		"read-rerequest":        rx(def, read(0, 0, vaBase8(0, 0), 600), read(1, 0, vaOff(0, 256), 344), read(0, 0, vaBase8(0, 0), 600)),
		"read-ring-overflow":    rx(wh(0, 0x0F, 0, 0), read(1, 0, vaBase8(0, 0), 100), read(2, 1, vaBase8(0, 1), 100), write(0, vaBase8(0, 2), 4)),
		"read-read-only-mr":     rx(def, read(0, 0, vaBase8(1, 0), 300)),
		"read-zero":             rx(def, read(0, 0, vaRaw(0, 1), 0)),
		"read-max-dest-0":       rx(wh(0, 0x10, 0, 0), read(0, 0, vaBase8(0, 0), 64)),
		"atomics-held":          rx(def, fadd(1, 0, vaBase8(0, 1), 5), cswap(2, 1, vaBase8(0, 1), 0x7F, 5), write(0, vaBase8(0, 8), 4), fadd(1, 0, vaBase8(0, 1), 5), fadd(3, 2, vaBase8(0, 1), 1)),
		"atomic-misaligned":     rx(def, fadd(0, 0, []byte{0x48, 1}, 1)),
		"atomic-past-end":       rx(def, fadd(0, 0, vaEnd(0, 4), 1)),
		"beyond-span":           rx(def, send(0, 0, 3), send(64, 1, 3), send(63, 1, 3), send(65, 2, 3)),
		"beyond-span-256":       rx(wh(0, 0, 2, 0), send(200, 1, 3), send(0, 0, 3)),
		"offset-misaligned":     rx(def, with(send(0, 0, 10), func(p *weakSeedPkt) { p.ooh = oohRec(0, oohOM(0, 1, 0), nil, 0) })),
		"length-mismatch":       rx(def, with(send(0, 0, 10), func(p *weakSeedPkt) { p.ooh = oohRec(0, oohOM(0, 0, 2), []byte{0, 0, 1, 0}, 0) })),
		"offset-past-length":    rx(def, with(send(0, 0, 10), func(p *weakSeedPkt) { p.ooh = oohRec(0, oohOM(2, 0, 3), nil, 0) })),
		"ooh-reserved-flags":    rx(def, with(send(0, 0, 10), func(p *weakSeedPkt) { p.ooh = oohRec(0, 0x80|oohOM(0, 0, 0), []byte{0x82}, 0) })),
		"write-with-recv-flag":  rx(def, with(write(0, vaBase8(0, 0), 8), func(p *weakSeedPkt) { p.ooh = oohRec(0, 0x80|oohOM(0, 0, 0), []byte{wire.OOHRecv}, 0) })),
		"send-seq-far": rx(def, with(send(0, 0, 10), func(p *weakSeedPkt) {
			p.ooh = oohRec(0x80, oohOM(0, 0, 0), nil, 0)
			p.ooh = append([]byte{0x80, 0x12, 0x34, 0x56}, p.ooh[1:]...)
		})),
		"duplicates": rx(def, send(0, 0, 4), send(0, 0, 4), write(1, vaBase8(0, 0), 8), write(1, vaBase8(0, 0), 8), send(3, 2, 4), send(3, 2, 4), send(2, 1, 4)),
		"tx-seq-max": rx(def, with(send(0, 0, 4), func(p *weakSeedPkt) {
			p.ooh = oohRec(0, oohOM(0, 0, 0), nil, 0xFF)
			p.ooh = append(p.ooh, 0xFF, 0xFF, 0xFF, 0xF0)
		})),
		"ordered-opcode":    rx(def, send(0, 0, 4), weakSeedPkt{op: wire.OpSendOnly, psn: 1, pm: plSmall(4)}),
		"ack-to-responder":  rx(def, weakSeedPkt{op: wire.OpWeakAck, psn: 0, ext: aethAck(0), sack: sackRec(0, [2]uint32{2, 3})}),
		"psn-wrap":          rx(wh(0, 0, 0, 0xFFFFFE), send(0xFFFFFE, 0, 4), send(0, 2, 4), send(0xFFFFFF, 1, 4), read(1, 0, vaBase8(0, 0), 512)),
		"rtr":               rx(wh(0x20, 0, 0, 0), send(1, 1, 3), write(0, vaBase8(0, 0), 16), send(2, 0, 3)),
		"qp-without-rights": rx(wh(0x1C, 0, 0, 0), write(0, vaBase8(0, 0), 16), read(1, 0, vaBase8(0, 0), 16), fadd(2, 0, vaBase8(0, 0), 1)),
		"srq":               rx(wh(0, 0x80, 0, 0), send(1, 1, 20), send(0, 0, 20), send(2, 2, 8)),
		"mtu-1024":          rx(wh(2, 0, 0, 0), send(1, 1, 40), with(send(0, 0, 0), func(p *weakSeedPkt) { p.pm = plMTU(); p.ooh = oohRec(0, oohOM(0, 0, 1), []byte{0}, 0) })),
		"no-flush-batch":    rx(def, with(send(1, 1, 4), func(p *weakSeedPkt) { p.ctl = 0x08 }), with(read(2, 0, vaBase8(0, 0), 300), func(p *weakSeedPkt) { p.ctl = 0x08 }), with(fadd(4, 1, vaBase8(0, 0), 1), func(p *weakSeedPkt) { p.ctl = 0x08 }), send(0, 0, 4)),
		"wrong-source":      rx(def, with(send(0, 0, 4), func(p *weakSeedPkt) { p.ctl = 0x80 })),
		"bad-icrc":          rx(def, with(send(0, 0, 4), func(p *weakSeedPkt) { p.ctl = 0x10 })),
		"no-ackreq":         rx(def, with(send(1, 1, 4), func(p *weakSeedPkt) { p.ctl = 0x40 }), with(send(0, 0, 4), func(p *weakSeedPkt) { p.ctl = 0x40 })),
		"raw":               rx(def, weakSeedPkt{ctl: 7, raw: []byte("\xc2\x00\xff\xff\x00\x00\x00\x02\x80\x00\x00\x00garbage")}, weakSeedPkt{ctl: 6, raw: make([]byte, 40)}, weakSeedPkt{ctl: 6, raw: append([]byte{0xC6, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0}, make([]byte, 36)...)}),
	}
	save("FuzzWeakReceivePath", rxSeeds)

	// FuzzWeakRequesterResponses: header h0, h1, h2, SQ PSN. With MTU 256, every work
	// request and ReadChunk 2, the PSNs are: SEND 0, READ(600) 1-3, FETCH_ADD 4, WRITE(300)
	// 5-6, CMP_SWAP 7, READ(1000) 8-11, READ(0) 12, WRITE_IMM(0) 13. h2 0 is a max hole
	// of 64.
	th := func(h0, h1, h2 byte, psn uint32) []byte {
		return []byte{h0, h1, h2, byte(psn >> 16), byte(psn >> 8), byte(psn)}
	}
	tx := func(hdr []byte, pkts ...weakSeedPkt) []byte { return prog(fuzzWeakRespOps, hdr, pkts...) }
	// A SACK of everything up to base+upTo (upTo -1: nothing new) and ranges relative to base.
	sack := func(base uint32, upTo int, echo int8, syn []byte, ranges ...[2]uint32) weakSeedPkt {
		for i := range ranges {
			ranges[i][0] = wire.PSNAdd(base, ranges[i][0])
		}
		ext := aethAck(0)
		if syn != nil {
			ext = syn
		}
		return weakSeedPkt{op: wire.OpWeakAck, psn: wire.PSNAdd(base, uint32(upTo)&wire.PSNMask), ext: ext, sack: sackRec(echo, ranges...)}
	}
	rr := func(base uint32, k uint32, pm []byte) weakSeedPkt {
		return weakSeedPkt{op: wire.OpReadResponseOnly, psn: wire.PSNAdd(base, k), pm: pm, fill: 0x5A, ext: aethAck(0)}
	}
	aack := func(base uint32, k uint32, v byte) weakSeedPkt {
		return weakSeedPkt{op: wire.OpAtomicAcknowledge, psn: wire.PSNAdd(base, k), ext: cat(aethAck(0), []byte{v})}
	}
	inOrder := func(base uint32) []weakSeedPkt {
		return []weakSeedPkt{
			sack(base, 0, -100, nil),
			rr(base, 1, plMTU()), rr(base, 2, plMTU()), rr(base, 3, plBig(88)),
			aack(base, 4, 7), sack(base, 6, -100, nil), aack(base, 7, 0),
			rr(base, 8, plMTU()), rr(base, 9, plMTU()), rr(base, 10, plMTU()), rr(base, 11, plBig(232)),
			rr(base, 12, nil), sack(base, 13, -100, nil),
		}
	}
	reversed := func(base uint32) []weakSeedPkt {
		return []weakSeedPkt{
			sack(base, -1, -100, nil, [2]uint32{13, 1}, [2]uint32{5, 2}),
			rr(base, 12, nil), rr(base, 11, plBig(232)), rr(base, 10, plMTU()), rr(base, 9, plMTU()), rr(base, 8, plMTU()),
			aack(base, 7, 0), aack(base, 4, 7),
			rr(base, 3, plBig(88)), rr(base, 2, plMTU()), rr(base, 1, plMTU()),
			sack(base, 0, -100, nil),
		}
	}
	nak := func(code byte) []byte { return aethSyn(wire.AETHNak|code, 0) }
	tdef := th(0, 0, 0, 0)
	noFlush := func(ps []weakSeedPkt) []weakSeedPkt {
		c := append([]weakSeedPkt(nil), ps...)
		for i := range c {
			c[i].ctl |= 0x08
		}
		return c
	}
	txSeeds := map[string][]byte{
		"empty":                  {},
		"header-only":            tdef,
		"all-in-order":           tx(tdef, inOrder(0)...),
		"all-reversed":           tx(tdef, reversed(0)...),
		"all-in-order-psn-wrap":  tx(th(0, 0, 0, 0xFFFFFA), inOrder(0xFFFFFA)...),
		"all-reversed-psn-wrap":  tx(th(0, 0, 0, 0xFFFFFD), reversed(0xFFFFFD)...),
		"all-no-flush":           tx(tdef, noFlush(reversed(0))...),
		"all-default-max-hole":   tx(th(0, 0, 0xC0, 0), reversed(0)...),
		"sack-ranges":            tx(tdef, sack(0, -1, -100, nil, [2]uint32{5, 2}, [2]uint32{13, 1}), sack(0, 0, -100, nil), sack(0, 13, -100, nil)),
		"sack-echo-loss":         tx(tdef, sack(0, -1, 0, nil, [2]uint32{13, 1}), sack(0, -1, 0, nil, [2]uint32{6, 1}), rr(0, 12, nil)),
		"sack-echo-then-all":     tx(tdef, append([]weakSeedPkt{sack(0, -1, 0, nil, [2]uint32{13, 1})}, inOrder(0)...)...),
		"sack-echo-future":       tx(tdef, with(sack(0, 0, 0, nil), func(p *weakSeedPkt) { p.sack = []byte{0x80, 0x7F, 0xFF, 0xFF, 0xFF} })),
		"sack-too-many-ranges":   tx(tdef, with(sack(0, 0, 0, nil), func(p *weakSeedPkt) { p.sack = append([]byte{17, 0}, bytes.Repeat([]byte{5, 1}, 17)...) })),
		"sack-payload-short":     tx(tdef, with(sack(0, 0, 0, nil, [2]uint32{5, 1}), func(p *weakSeedPkt) { p.sack[0] |= 0x40 })),
		"sack-count-raw":         tx(tdef, with(sack(0, 0, 0, nil), func(p *weakSeedPkt) { p.sack = []byte{0x20, 0, 0, 0, 1, 0} })),
		"sack-empty-range":       tx(tdef, sack(0, 0, 0, nil, [2]uint32{5, 0})),
		"sack-beyond-sent":       tx(tdef, sack(0, -1, 0, nil, [2]uint32{10, 30}), sack(0, 40, 0, nil), sack(0, 13, 0, nil)),
		"sack-covering-reads":    tx(tdef, sack(0, 13, 0, nil, [2]uint32{1, 12})),
		"sack-duplicate":         tx(tdef, sack(0, 0, -100, nil), sack(0, 0, -100, nil), sack(0, -1, -100, nil), sack(0, -20, -100, nil)),
		"rnr":                    tx(tdef, sack(0, -1, -100, aethSyn(wire.AETHRNR|1, 0)), sack(0, 0, -100, nil)),
		"rnr-with-ranges":        tx(tdef, sack(0, 0, 0, aethSyn(wire.AETHRNR|1, 0), [2]uint32{5, 2})),
		"rnr-no-retries":         tx(th(0xE0, 0, 0, 0), sack(0, -1, -100, aethSyn(wire.AETHRNR|1, 0)), sack(0, -1, -100, aethSyn(wire.AETHRNR|1, 0))),
		"nak-access":             tx(tdef, sack(0, 0, -100, nil), sack(0, 0, -100, nak(wire.NakRemoteAccessError))),
		"nak-invalid":            tx(tdef, sack(0, -1, -100, nak(wire.NakInvalidRequest))),
		"nak-remote-op":          tx(tdef, sack(0, 2, -100, nak(wire.NakRemoteOpError))),
		"nak-invalid-rd":         tx(tdef, sack(0, 1, -100, nak(wire.NakInvalidRDRequest))),
		"nak-seq":                tx(tdef, sack(0, 1, -100, nak(wire.NakPSNSeqError))),
		"nak-reserved":           tx(tdef, sack(0, -1, -100, aethSyn(0x40, 0)), sack(0, -1, -100, aethSyn(0xE0, 0))),
		"ordered-ack":            tx(tdef, weakSeedPkt{op: wire.OpAcknowledge, psn: 0, ext: aethAck(0)}),
		"read-wrong-length":      tx(tdef, rr(0, 1, plMTUPlus(5)), rr(0, 3, plMTU()), rr(0, 12, plSmall(1))),
		"read-response-for-send": tx(tdef, rr(0, 0, plSmall(8)), rr(0, 5, plMTU())),
		"atomic-ack-for-read":    tx(tdef, aack(0, 1, 1), aack(0, 0, 1)),
		"duplicate-responses":    tx(tdef, rr(0, 1, plMTU()), rr(0, 1, plMTU()), aack(0, 4, 1), aack(0, 4, 2), rr(0, 2, plMTU()), rr(0, 3, plBig(88)), rr(0, 3, plBig(88))),
		"max-rd-atomic-1":        tx(th(0, 0, 0x0F, 0), sack(0, 0, -100, nil), rr(0, 1, plMTU()), rr(0, 2, plMTU()), rr(0, 3, plBig(88)), aack(0, 4, 1)),
		"max-rd-atomic-0":        tx(th(0, 0, 0x10, 0), sack(0, 0, -100, nil)),
		"fence":                  tx(th(0, 0, 0x20, 0), reversed(0)...),
		"mtu-1024":               tx(th(2, 0, 0, 0), sack(0, 0, -100, nil), rr(0, 1, plBig(600)), aack(0, 2, 1)),
		"mtu-512":                tx(th(1, 0, 0, 0), reversed(0)...),
		"some-wrs":               tx(th(0, 0x25, 0, 0), sack(0, -1, 0, nil, [2]uint32{2, 1}), rr(0, 1, plMTU())),
		"requests-to-requester":  tx(tdef, weakSeedPkt{op: wire.OpWeakSend, psn: 0, pm: plSmall(8), ooh: oohRec(0, oohOM(0, 0, 0), nil, 0)}),
		"wrong-source":           tx(tdef, with(sack(0, 13, 0, nil), func(p *weakSeedPkt) { p.ctl = 0x80 })),
		"bad-icrc":               tx(tdef, with(sack(0, 13, 0, nil), func(p *weakSeedPkt) { p.ctl = 0x10 })),
		"raw":                    tx(tdef, weakSeedPkt{ctl: 7, raw: []byte("\xc1\x00\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x1f\x00\x00\x00xxxx")}, weakSeedPkt{ctl: 6, raw: append([]byte{0xC1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x1f, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9}, 0, 0, 0, 5, 0, 0, 0, 6)}),
	}
	save("FuzzWeakRequesterResponses", txSeeds)
}

func (s seedPkt) withExt(ext []byte) seedPkt { s.ext = ext; return s }
func (s seedPkt) withPSN(d int) seedPkt      { s.psnd = psnDelta(d); return s }
