package transport

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
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
	var pl int
	switch pm := r.u8(); pm >> 6 {
	case 0:
		pl = int(pm & 0x3F)
	case 1:
		pl = env.mtu
	case 2:
		pl = max(0, env.mtu+int(pm&0x3F)-32)
	case 3:
		pl = int(r.u16()) % 4200
	}
	fill := r.u8()

	info := op.Info()
	hl := wire.BTHLen
	if info.Valid {
		hl = info.HdrLen
	}
	pad := wire.PadFor(pl)
	pkt = make([]byte, hl, hl+pl+pad+wire.ICRCLen)
	o := wire.BTHLen
	f := info.Flags
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
	}
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
// sequence, dropped, NAKed): a refused packet must not change memory.
func feed(d *Device, q *QP, pkt []byte, from netip.AddrPort, flush bool) (refused bool) {
	before, st := q.Stats(), q.State()
	d.rxMu.Lock()
	rx := d.rx
	d.input(pkt, from)
	refused = d.rx.icrc+d.rx.malformed+d.rx.pkey+d.rx.unknownQP != rx.icrc+rx.malformed+rx.pkey+rx.unknownQP
	if flush {
		d.finishBatch()
	}
	d.rxMu.Unlock()
	after := q.Stats()
	return refused || st == StateErr ||
		after.Duplicates+after.OutOfSequence+after.NAKsSent+after.RNRNAKsSent+after.WrongSource+after.Dropped !=
			before.Duplicates+before.OutOfSequence+before.NAKsSent+before.RNRNAKsSent+before.WrongSource+before.Dropped
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

// liveWrite checks that the devices still work: a fresh QP pair from -> to, an RDMA WRITE
// and its completion. The local ACK timeout is generous (67 ms, 7 retries) so that a
// loaded machine (fuzz workers use every core) does not fail the check.
func liveWrite(t testing.TB, from, to *Device, src, dst []byte, msrc, mdst *tpt.Region, seq int) {
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
			Peer: s.peer.d.LocalAddr()}, MaskState|MaskAV|MaskPathMTU|MaskDestQPN|MaskRQPSN|MaskMaxDestRdAtomic|MaskMinRNRTimer, lim))
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
	liveSrc, liveDst := make([]byte, 3000), make([]byte, 3000)
	mls, mld := reg(f, a.d, liveSrc), reg(f, b.d, liveDst)
	live := func(t testing.TB, seq int) {
		mon.pass.Store(true)
		defer mon.pass.Store(false)
		liveWrite(t, a.d, b.d, liveSrc, liveDst, mls, mld, seq)
	}
	f.Cleanup(func() {
		if !f.Failed() {
			live(f, 0)
		}
	})
	aAddr, bAddr := a.d.LocalAddr(), b.d.LocalAddr()
	badAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), aAddr.Port())
	var execs atomic.Int64

	f.Fuzz(func(t *testing.T, data []byte) {
		defer watchdog(data).Stop()
		if n := execs.Add(1); n%liveEvery == 1 {
			live(t, int(n))
		}
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
	liveSrc, liveDst := make([]byte, 3000), make([]byte, 3000)
	mls, mld := reg(f, a.d, liveSrc), reg(f, b.d, liveDst)
	live := func(t testing.TB, seq int) {
		mon.pass.Store(true)
		defer mon.pass.Store(false)
		liveWrite(t, a.d, b.d, liveSrc, liveDst, mls, mld, seq)
	}
	f.Cleanup(func() {
		if !f.Failed() {
			live(f, 0)
		}
	})
	aAddr, bAddr := a.d.LocalAddr(), b.d.LocalAddr()
	badAddr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), bAddr.Port())
	var execs atomic.Int64

	f.Fuzz(func(t *testing.T, data []byte) {
		defer watchdog(data).Stop()
		if n := execs.Add(1); n%liveEvery == 1 {
			live(t, int(n))
		}
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

// TestWriteFuzzSeeds writes the seed corpora of FuzzReceivePath and
// FuzzRequesterResponses into testdata/fuzz/. It only runs with SOFTRNIC_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SOFTRNIC_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set SOFTRNIC_WRITE_FUZZ_SEEDS=1 to regenerate testdata/fuzz")
	}
	write := func(target string, seeds map[string][]byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		must(t, os.RemoveAll(dir))
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
}

func (s seedPkt) withExt(ext []byte) seedPkt { s.ext = ext; return s }
func (s seedPkt) withPSN(d int) seedPkt      { s.psnd = psnDelta(d); return s }
