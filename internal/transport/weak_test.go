package transport

import (
	"bytes"
	"encoding/binary"
	"sync"
	"testing"

	"github.com/softrnic/softrnic/internal/holes"
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// pktRig is a connected pair of QPs (weakly-ordered unless made with newRig) whose devices
// send nothing on their own: every packet they emit is recorded and dropped, and the test
// delivers exactly the packets it wants, in the order it wants, straight into a device's
// receive path.
type pktRig struct {
	t    *testing.T
	a, b *side // a requests, b responds (and the other way round)
	mu   sync.Mutex
	out  map[*Device][][]byte
	pass bool // let packets through instead (for the end-to-end checks)
}

const rigMTU = 1024

func newWeakRig(t *testing.T) *pktRig { return newRig(t, Weak) }

// newRig makes a pktRig whose QPs are in mode.
func newRig(t *testing.T, mode Ordering) *pktRig {
	rg := &pktRig{t: t, out: map[*Device][][]byte{}}
	var devs [2]*Device
	mk := func(i int, ip string) *side {
		return openSide(t, ip, Config{FaultFilter: func(pkt []byte) netio.Verdict {
			rg.mu.Lock()
			defer rg.mu.Unlock()
			if rg.pass {
				return netio.Verdict{Action: netio.Deliver}
			}
			rg.out[devs[i]] = append(rg.out[devs[i]], pkt)
			return netio.Verdict{Action: netio.Drop}
		}, LossProbe: -1})
	}
	rg.a = mk(0, "127.0.0.1")
	devs[0] = rg.a.d
	rg.b = mk(1, "127.0.0.2")
	devs[1] = rg.b.d
	connectMode(t, rg.a, rg.b, wire.MTU1024, 0, 0, mode)
	return rg
}

// sent returns and forgets what d emitted.
func (rg *pktRig) sent(d *Device) [][]byte {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	p := rg.out[d]
	delete(rg.out, d)
	return p
}

// deliver hands pkt, as sent by from's device, to to's device and finishes the batch.
func (rg *pktRig) deliver(to, from *side, pkt []byte) { deliverTo(to, from, pkt) }

// deliverTo hands pkt, as sent by from's device, to to's receive path and finishes the
// batch.
func deliverTo(to, from *side, pkt []byte) {
	d := to.d
	d.q0().rxMu.Lock()
	d.q0().input(pkt, from.d.LocalAddr())
	d.q0().finishBatch()
	d.q0().rxMu.Unlock()
}

// seal appends pad and ICRC for a packet from from's device to to's device.
func seal(from, to *side, pkt []byte) []byte {
	f := wiretest.Flow(from.d.LocalAddr(), to.d.LocalAddr())
	return wiretest.Seal(&f, pkt)
}

// weakData builds a weak SEND or WRITE packet from a to b.
func (rg *pktRig) weakData(op wire.Opcode, psn uint32, o wire.OOH, reth *wire.RETH, imm uint32, payload []byte) []byte {
	info := op.Info()
	pkt := make([]byte, info.HdrLen, info.HdrLen+len(payload)+8)
	bth := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: rg.b.qp.QPN(), PSN: wire.PSN(psn), AckReq: true}
	bth.Put(pkt)
	off := wire.BTHLen
	if info.Flags&wire.HasRETH != 0 {
		reth.Put(pkt[off:])
		off += wire.RETHLen
	}
	if info.Flags&wire.HasImmDt != 0 {
		binary.BigEndian.PutUint32(pkt[off:], imm)
	}
	o.Put(pkt[info.HdrLen-wire.OOHLen:])
	return seal(rg.a, rg.b, append(pkt, payload...))
}

// send1 is a one-packet SEND with receive sequence number rsn.
func (rg *pktRig) send1(psn, rsn uint32, data []byte) []byte {
	return rg.weakData(wire.OpWeakSend, psn, wire.OOH{Seq: wire.PSN(rsn), Length: uint32(len(data)), Flags: wire.OOHRecv}, nil, 0, data)
}

func (rg *pktRig) postRecvs(t *testing.T, mr *tpt.Region, n, size int) {
	for i := 0; i < n; i++ {
		_, err := rg.b.qp.PostRecv([]RecvWR{{WRID: uint64(100 + i), SG: []SGE{{Addr: mr.IOVA() + uint64(i*size), Length: uint32(size), LKey: mr.Key()}}}})
		must(t, err)
	}
}

func pollAll(cq *CQ) []CQE {
	var out []CQE
	buf := make([]CQE, 16)
	for {
		n := cq.Poll(buf)
		if n == 0 {
			return out
		}
		out = append(out, buf[:n]...)
	}
}

func wrids(es []CQE) []uint64 {
	var w []uint64
	for _, e := range es {
		w = append(w, e.WRID)
	}
	return w
}

func respHoles(q *QP) []holes.Hole { return q.Holes().Responder }

func wantHoles(t *testing.T, what string, got []holes.Hole, want ...holes.Hole) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: holes %+v, want %+v", what, got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: hole %d is %+v, want %+v", what, i, got[i], want[i])
		}
	}
}

func eqU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A SEND completing beyond one hole is placed at once, counted on the hole, and its CQE
// is posted (after the one of the message that filled the hole) when the hole closes by
// a retransmission.
func TestWeakSendBeyondHole(t *testing.T) {
	rg := newWeakRig(t)
	buf := make([]byte, 3*64)
	mr := reg(t, rg.b.d, buf)
	rg.postRecvs(t, mr, 3, 64)
	rg.deliver(rg.b, rg.a, rg.send1(0, 0, []byte("zero")))
	rg.deliver(rg.b, rg.a, rg.send1(2, 2, []byte("two")))
	if got := wrids(pollAll(rg.b.cq)); !eqU64(got, []uint64{100}) {
		t.Fatalf("completions before the hole closed: %v", got)
	}
	if !bytes.Equal(buf[128:131], []byte("two")) {
		t.Fatal("the message beyond the hole was not placed on arrival")
	}
	wantHoles(t, "after PSN 2", respHoles(rg.b.qp), holes.Hole{Start: 1, End: 2, Counts: [holes.MaxKinds]uint32{1}})
	rg.deliver(rg.b, rg.a, rg.send1(1, 1, []byte("one"))) // the retransmission
	if got := wrids(pollAll(rg.b.cq)); !eqU64(got, []uint64{101, 102}) {
		t.Fatalf("completions after the hole closed: %v", got)
	}
	wantHoles(t, "closed", respHoles(rg.b.qp))
	s := rg.b.qp.Stats()
	if s.PlacedOutOfOrder != 1 || s.HolesOpened != 1 || s.HolesClosed != 1 {
		t.Fatalf("counters %+v", s)
	}
	// The SACK sent while the hole was open named the run beyond it.
	found := false
	for _, pkt := range rg.sent(rg.b.d) {
		var p wire.Packet
		if p.Decode(pkt) == nil && p.BTH.Opcode == wire.OpWeakAck && p.BTH.PSN == 0 {
			r, err := wire.DecodeSACK(p.Ext, p.Payload, nil)
			if err == nil && len(r) == 1 && r[0] == [2]wire.PSN{2, 3} {
				found = true
			}
		}
	}
	if !found {
		t.Fatal("no SACK with cumulative PSN 0 and range [2,3)")
	}
}

// Two holes closing in either order; a duplicate of a placed packet changes nothing; a
// packet beyond the bitmap span is dropped and counted.
func TestWeakTwoHolesDuplicateBeyond(t *testing.T) {
	for _, order := range [][2]uint32{{1, 3}, {3, 1}} {
		rg := newWeakRig(t)
		buf := make([]byte, 5*64)
		mr := reg(t, rg.b.d, buf)
		rg.postRecvs(t, mr, 5, 64)
		for _, p := range []uint32{0, 2, 4} {
			rg.deliver(rg.b, rg.a, rg.send1(p, p, []byte{byte('a' + p)}))
		}
		wantHoles(t, "two holes", respHoles(rg.b.qp),
			holes.Hole{Start: 1, End: 2, Counts: [holes.MaxKinds]uint32{1}},
			holes.Hole{Start: 3, End: 4, Counts: [holes.MaxKinds]uint32{1}})
		// A duplicate of PSN 2: not placed again (its buffer byte is changed to see), no
		// extra completion.
		buf[2*64] = 'X'
		rg.deliver(rg.b, rg.a, rg.send1(2, 2, []byte{'c'}))
		if buf[2*64] != 'X' || rg.b.qp.Stats().Duplicates != 1 {
			t.Fatal("duplicate placed again or not counted")
		}
		buf[2*64] = 'c'
		// Beyond the span.
		span := rg.b.qp.weak.resp.span
		rg.deliver(rg.b, rg.a, rg.send1(span+1, 5, []byte{'z'}))
		if rg.b.qp.Stats().BeyondSpan != 1 {
			t.Fatal("packet beyond the span not counted")
		}
		rg.deliver(rg.b, rg.a, rg.send1(order[0], order[0], []byte{byte('a' + order[0])}))
		got := wrids(pollAll(rg.b.cq))
		if order[0] == 1 {
			if !eqU64(got, []uint64{100, 101, 102}) {
				t.Fatalf("first hole closed first: %v", got)
			}
		} else {
			// The second hole closed first: its completion now waits on the first.
			if !eqU64(got, []uint64{100}) {
				t.Fatalf("second hole closed first: %v", got)
			}
			wantHoles(t, "merged", respHoles(rg.b.qp), holes.Hole{Start: 1, End: 2, Counts: [holes.MaxKinds]uint32{3}})
		}
		rg.deliver(rg.b, rg.a, rg.send1(order[1], order[1], []byte{byte('a' + order[1])}))
		all := append(got, wrids(pollAll(rg.b.cq))...)
		if !eqU64(all, []uint64{100, 101, 102, 103, 104}) {
			t.Fatalf("order %v: completions %v", order, all)
		}
		if !bytes.Equal([]byte{buf[0], buf[64], buf[128], buf[192], buf[256]}, []byte("abcde")) {
			t.Fatalf("buffers %q", []byte{buf[0], buf[64], buf[128], buf[192], buf[256]})
		}
	}
}

// A packet landing inside a hole cuts it in two: completions beyond the hole stay counted
// on its second part; one the packet itself completes is counted on the first part; each
// part releases its own completions when it closes, in order.
func TestWeakHoleInsideHole(t *testing.T) {
	rg := newWeakRig(t)
	buf := make([]byte, 8*64)
	mr := reg(t, rg.b.d, buf)
	rg.postRecvs(t, mr, 8, 64)
	rg.deliver(rg.b, rg.a, rg.send1(0, 0, []byte{'a'}))
	rg.deliver(rg.b, rg.a, rg.send1(6, 6, []byte{'g'})) // hole [1,6)
	wantHoles(t, "one hole", respHoles(rg.b.qp), holes.Hole{Start: 1, End: 6, Counts: [holes.MaxKinds]uint32{1}})
	rg.deliver(rg.b, rg.a, rg.send1(3, 3, []byte{'d'})) // inside it
	wantHoles(t, "cut", respHoles(rg.b.qp),
		holes.Hole{Start: 1, End: 3, Counts: [holes.MaxKinds]uint32{1}},
		holes.Hole{Start: 4, End: 6, Counts: [holes.MaxKinds]uint32{1}})
	if buf[3*64] != 'd' || buf[6*64] != 'g' {
		t.Fatal("packets beyond holes not placed on arrival")
	}
	// Fill the second part first: its completion now waits on the first part.
	rg.deliver(rg.b, rg.a, rg.send1(4, 4, []byte{'e'}))
	rg.deliver(rg.b, rg.a, rg.send1(5, 5, []byte{'f'}))
	if got := wrids(pollAll(rg.b.cq)); !eqU64(got, []uint64{100}) {
		t.Fatalf("completions with the first part open: %v", got)
	}
	wantHoles(t, "second part closed", respHoles(rg.b.qp), holes.Hole{Start: 1, End: 3, Counts: [holes.MaxKinds]uint32{4}})
	rg.deliver(rg.b, rg.a, rg.send1(2, 2, []byte{'c'}))
	rg.deliver(rg.b, rg.a, rg.send1(1, 1, []byte{'b'}))
	if got := wrids(pollAll(rg.b.cq)); !eqU64(got, []uint64{101, 102, 103, 104, 105, 106}) {
		t.Fatalf("completions after all closed: %v", got)
	}
	for i, c := range []byte("abcdefg") {
		if buf[i*64] != c {
			t.Fatalf("message %d: %q", i, buf[i*64])
		}
	}
}

// A WRITE with immediate beyond a hole: its data lands at once, its receive completion
// (with the immediate) waits for the hole; a plain WRITE needs no completion.
func TestWeakWriteImmBeyondHole(t *testing.T) {
	rg := newWeakRig(t)
	tgt := make([]byte, 4096)
	mt := reg(t, rg.b.d, tgt)
	rbuf := make([]byte, 64)
	mr := reg(t, rg.b.d, rbuf)
	rg.postRecvs(t, mr, 1, 64)
	// PSN 0: a 2-packet WRITE (first packet lost for now); PSN 2: WRITE with immediate.
	w0 := bytes.Repeat([]byte{7}, rigMTU)
	w1 := bytes.Repeat([]byte{8}, 10)
	reth := func(off uint64, n uint32) *wire.RETH {
		return &wire.RETH{VA: mt.IOVA() + off, RKey: mt.Key(), DMALen: n}
	}
	rg.deliver(rg.b, rg.a, rg.weakData(wire.OpWeakWrite, 1, wire.OOH{Offset: rigMTU, Length: rigMTU + 10}, reth(rigMTU, rigMTU+10), 0, w1))
	rg.deliver(rg.b, rg.a, rg.weakData(wire.OpWeakWriteImm, 2, wire.OOH{Seq: 0, Length: 4, Flags: wire.OOHRecv}, reth(3000, 4), 0xfeed, []byte("imm!")))
	if !bytes.Equal(tgt[3000:3004], []byte("imm!")) || !bytes.Equal(tgt[rigMTU:rigMTU+10], w1) {
		t.Fatal("WRITE packets beyond the hole not placed on arrival")
	}
	if got := pollAll(rg.b.cq); len(got) != 0 {
		t.Fatalf("completion before the hole closed: %+v", got)
	}
	wantHoles(t, "hole at 0", respHoles(rg.b.qp), holes.Hole{Start: 0, End: 1, Counts: [holes.MaxKinds]uint32{1}})
	rg.deliver(rg.b, rg.a, rg.weakData(wire.OpWeakWrite, 0, wire.OOH{Offset: 0, Length: rigMTU + 10}, reth(0, rigMTU+10), 0, w0))
	got := pollAll(rg.b.cq)
	if len(got) != 1 || got[0].Opcode != WCRecvRDMAImm || got[0].Imm != 0xfeed || got[0].Flags != WCFlagWithImm || got[0].ByteLen != 4 {
		t.Fatalf("completion %+v", got)
	}
	if !bytes.Equal(tgt[:rigMTU], w0) {
		t.Fatal("first WRITE packet not placed")
	}
}

// A READ request beyond a hole is checked and its responses prepared, but they wait for
// the doorbell: nothing goes out until the hole closes.
func TestWeakReadRequestBeyondHole(t *testing.T) {
	rg := newWeakRig(t)
	src := bytes.Repeat([]byte("0123456789abcdef"), 128) // 2 KiB: 2 responses at MTU 1024
	ms := reg(t, rg.b.d, src)
	tgt := make([]byte, 64)
	mt := reg(t, rg.b.d, tgt)
	// PSN 0: WRITE (lost for now). PSN 1..2: READ request (2 responses).
	rd := func() []byte {
		pkt := make([]byte, wire.OpWeakReadReq.Info().HdrLen)
		(&wire.BTH{Opcode: wire.OpWeakReadReq, PKey: wire.DefaultPKey, DestQP: rg.b.qp.QPN(), PSN: 1}).Put(pkt)
		(&wire.RETH{VA: ms.IOVA(), RKey: ms.Key(), DMALen: 2048}).Put(pkt[wire.BTHLen:])
		(&wire.OOH{Seq: 0, Length: 2048}).Put(pkt[wire.BTHLen+wire.RETHLen:])
		return seal(rg.a, rg.b, pkt)
	}
	rg.sent(rg.b.d)
	rg.deliver(rg.b, rg.a, rd())
	for _, pkt := range rg.sent(rg.b.d) {
		if op := wire.Opcode(pkt[0]); op != wire.OpWeakAck {
			t.Fatalf("%v sent before the doorbell", op)
		}
	}
	wantHoles(t, "read held", respHoles(rg.b.qp), holes.Hole{Start: 0, End: 1, Counts: [holes.MaxKinds]uint32{0, 1}})
	rg.deliver(rg.b, rg.a, rg.weakData(wire.OpWeakWrite, 0, wire.OOH{Length: 4}, &wire.RETH{VA: mt.IOVA(), RKey: mt.Key(), DMALen: 4}, 0, []byte("done")))
	var resp []wire.Packet
	for _, pkt := range rg.sent(rg.b.d) {
		var p wire.Packet
		if p.Decode(pkt) == nil && p.Info.Flags&wire.IsRead != 0 {
			resp = append(resp, p)
		}
	}
	if len(resp) != 2 || resp[0].BTH.PSN != 1 || resp[1].BTH.PSN != 2 ||
		!bytes.Equal(resp[0].Payload, src[:1024]) || !bytes.Equal(resp[1].Payload, src[1024:]) {
		t.Fatalf("responses after the doorbell: %d", len(resp))
	}
}

// A READ response beyond a hole (on the requester): it is placed on arrival, and the READ
// work request it finishes completes after the one before it, when the hole closes.
func TestWeakReadResponseBeyondHole(t *testing.T) {
	rg := newWeakRig(t)
	dst := make([]byte, 3*rigMTU)
	md := reg(t, rg.a.d, dst)
	// Two READs: A of 2 packets (PSN 0..1), B of 1 packet (PSN 2). Their requests are
	// dropped by the rig; the test answers them.
	for i, n := range []uint32{2 * rigMTU, rigMTU} {
		_, err := rg.a.qp.PostSend([]SendWR{{WRID: uint64(i + 1), Opcode: WRRead, Flags: FlagSignaled, RemoteAddr: 0x1000,
			RKey: 0x99, SG: []SGE{{Addr: md.IOVA() + uint64(i)*2*rigMTU, Length: n, LKey: md.Key()}}}})
		must(t, err)
	}
	resp := func(op wire.Opcode, psn uint32, fill byte) []byte {
		pkt := make([]byte, op.Info().HdrLen)
		(&wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: rg.a.qp.QPN(), PSN: wire.PSN(psn)}).Put(pkt)
		if op.Info().Flags&wire.HasAETH != 0 {
			(&wire.AETH{Syndrome: wire.AETHAck | wire.NoCredits}).Put(pkt[wire.BTHLen:])
		}
		return seal(rg.b, rg.a, append(pkt, bytes.Repeat([]byte{fill}, rigMTU)...))
	}
	rg.deliver(rg.a, rg.b, resp(wire.OpReadResponseFirst, 0, 'a'))
	rg.deliver(rg.a, rg.b, resp(wire.OpReadResponseOnly, 2, 'c')) // B's only response, beyond the hole at 1
	if dst[2*rigMTU] != 'c' {
		t.Fatal("response beyond the hole not placed on arrival")
	}
	if got := pollAll(rg.a.cq); len(got) != 0 {
		t.Fatalf("a READ completed across the hole: %+v", got)
	}
	h := rg.a.qp.Holes().Requester
	if len(h) != 1 || h[0].Start != 1 || h[0].End != 2 || h[0].Counts[kindReadDone] != 1 {
		t.Fatalf("requester holes %+v", h)
	}
	rg.deliver(rg.a, rg.b, resp(wire.OpReadResponseLast, 1, 'b')) // closes it
	got := pollAll(rg.a.cq)
	if len(got) != 2 || got[0].WRID != 1 || got[1].WRID != 2 || got[0].Opcode != WCRead || got[0].Status != 0 {
		t.Fatalf("completions %+v", got)
	}
	if dst[0] != 'a' || dst[rigMTU] != 'b' || dst[2*rigMTU] != 'c' {
		t.Fatal("READ data")
	}
}

// End to end through the sockets: an exact loss (the second of three SENDs, once) is
// repaired by one selective retransmission, nothing else is sent twice, and the
// completions come in order.
func TestWeakSelectiveRetransmission(t *testing.T) {
	rg := newWeakRig(t)
	rg.mu.Lock()
	rg.pass = true
	rg.mu.Unlock()
	var dropped bool
	var dmu sync.Mutex
	// Replace a's filter: drop its PSN 1 data packet once.
	rg.a.d.conn.SetFilter(func(pkt []byte) netio.Verdict {
		dmu.Lock()
		defer dmu.Unlock()
		if wire.Opcode(pkt[0]) == wire.OpWeakSend && pkt[11] == 1 && !dropped {
			dropped = true
			return netio.Verdict{Action: netio.Drop}
		}
		return netio.Verdict{Action: netio.Deliver}
	})
	src := []byte("abcdefghijklmnopqrstuvwx")
	ms := reg(t, rg.a.d, src)
	buf := make([]byte, 3*64)
	mr := reg(t, rg.b.d, buf)
	rg.postRecvs(t, mr, 3, 64)
	for i := 0; i < 3; i++ {
		_, err := rg.a.qp.PostSend([]SendWR{{WRID: uint64(i), Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{{Addr: ms.IOVA() + uint64(8*i), Length: 8, LKey: ms.Key()}}}})
		must(t, err)
	}
	got := waitCQE(t, rg.b.cq, 3)
	if w := wrids(got); !eqU64(w, []uint64{100, 101, 102}) {
		t.Fatalf("receive completions %v", w)
	}
	waitCQE(t, rg.a.cq, 3)
	s := rg.a.qp.Stats()
	if s.SelectiveRetransmits != 1 || s.Retransmits != 1 {
		t.Fatalf("retransmissions %+v", s)
	}
	placed(rg.b.d, func() bool {
		if !bytes.Equal(buf[64:72], src[8:16]) {
			t.Fatal("retransmitted message")
		}
		return true
	})
}
