package transport

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/wire"
)

// requestPacket builds a request packet with opcode op for q at psn: every extended
// header zero, the payload one MTU (or none, if op carries none), then pad and ICRC as
// from's device would send it to to's.
func requestPacket(from, to *side, op wire.Opcode, psn uint32, mtu int) []byte {
	info := op.Info()
	pkt := make([]byte, info.HdrLen)
	bth := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: to.qp.QPN(), PSN: wire.PSN(psn)}
	bth.Put(pkt)
	if info.Flags&wire.HasPayload != 0 {
		pkt = append(pkt, make([]byte, mtu)...)
	}
	return seal(from, to, pkt)
}

// TestWrongModeOpcodeDropped sends a QP every request opcode of the other ordering mode
// (weak vendor opcodes to an ordered QP, standard ones to a weak QP), at the expected PSN
// and at random ones: each is dropped and counted as WrongMode, the QP stays in RTS and
// keeps working. (A late packet of the QP's previous connection in the other mode, or a
// blind sweep of QP numbers, must not end the connection.)
func TestWrongModeOpcodeDropped(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, mode := range []Ordering{Ordered, Weak} {
		t.Run(mode.String(), func(t *testing.T) {
			a := openSide(t, "127.0.0.1", Config{})
			b := openSide(t, "127.0.0.2", Config{})
			const psnA = 0x1000 // what b expects from a
			connectMode(t, a, b, wire.MTU1024, psnA, 0x500, mode)
			sent := uint64(0)
			for op := 0; op < 256; op++ {
				info := wire.Opcode(op).Info()
				if !info.Valid || info.Flags&wire.IsRequest == 0 || (info.Flags&wire.IsWeak != 0) == (mode == Weak) {
					continue
				}
				for _, psn := range []uint32{psnA, psnA + 1, psnA - 1, rng.Uint32() & wire.PSNMask} {
					deliverTo(b, a, requestPacket(a, b, wire.Opcode(op), psn, 1024))
					sent++
					if st := b.qp.State(); st != StateRTS {
						t.Fatalf("%v QP in %v after a %v request at PSN %#x (expected %#x)", mode, st, wire.Opcode(op), psn, psnA)
					}
				}
			}
			if sent == 0 {
				t.Fatal("no opcode of the other mode found")
			}
			if s := b.qp.Stats(); s.WrongMode != sent {
				t.Errorf("WrongMode %d, want %d (stats %+v)", s.WrongMode, sent, s)
			}
			src, dst := make([]byte, 5000), make([]byte, 5000)
			for i := range src {
				src[i] = byte(i)
			}
			ms, md := reg(t, a.d, src), reg(t, b.d, dst)
			_, err := a.qp.PostSend([]SendWR{{WRID: 1, Opcode: WRWrite, Flags: FlagSignaled, RemoteAddr: md.IOVA(), RKey: md.Key(),
				SG: []SGE{{Addr: ms.IOVA(), Length: uint32(len(src)), LKey: ms.Key()}}}})
			must(t, err)
			if c := waitCQE(t, a.cq, 1)[0]; c.Status != StatusSuccess {
				t.Fatalf("WRITE after the wrong-mode packets: %+v", c)
			}
			if !placed(b.d, func() bool { return binary.BigEndian.Uint32(dst[4996:]) == binary.BigEndian.Uint32(src[4996:]) }) {
				t.Error("WRITE not placed")
			}
		})
	}
}

// TestWeakLengthWrap sends a weak WRITE with immediate whose out-of-order header declares
// a message of 2^32-1 bytes, in one 1024-byte packet: the length is refused (more than
// 2^31, the protocol's largest message), and no completion reports more bytes than were
// placed. (Before, (Length+mtu-1)/mtu wrapped to one packet, and the receive completed
// with byte_len 4294967295.)
func TestWeakLengthWrap(t *testing.T) {
	a := openSide(t, "127.0.0.1", Config{})
	b := openSide(t, "127.0.0.2", Config{})
	const psnA = 0x2000 // what b expects from a
	connectMode(t, a, b, wire.MTU1024, psnA, 0x500, Weak)
	dst, rbuf := make([]byte, 4096), make([]byte, 64)
	md, mr := reg(t, b.d, dst), reg(t, b.d, rbuf)
	_, err := b.qp.PostRecv([]RecvWR{{WRID: 9, SG: []SGE{{Addr: mr.IOVA(), Length: 64, LKey: mr.Key()}}}})
	must(t, err)
	op := wire.OpWeakWriteImm
	pkt := make([]byte, op.Info().HdrLen, op.Info().HdrLen+1024)
	bth := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: b.qp.QPN(), PSN: psnA, AckReq: true}
	bth.Put(pkt)
	reth := wire.RETH{VA: md.IOVA(), RKey: md.Key(), DMALen: 1024}
	reth.Put(pkt[wire.BTHLen:])
	ooh := wire.OOH{Seq: 0, Offset: 0, Length: 0xFFFFFFFF, Flags: wire.OOHRecv, TxSeq: 1}
	ooh.Put(pkt[len(pkt)-wire.OOHLen:])
	pkt = append(pkt, make([]byte, 1024)...)
	deliverTo(b, a, seal(a, b, pkt))
	var wc [4]CQE
	for _, c := range wc[:b.cq.Poll(wc[:])] {
		if c.Status == StatusSuccess {
			t.Errorf("completion %+v for a message of 2^32-1 bytes of which 1024 arrived", c)
		}
	}
	if st := b.qp.State(); st != StateErr {
		t.Errorf("responder in %v, want ERR (the request is invalid)", st)
	}
}

// TestWeakReadFarBehindBounded sends a weakly-ordered QP READ requests whose PSN lies far
// behind and whose DMA length is near 2^32: each is a duplicate, answered (or dropped)
// after work bounded by the span. Before, the duplicate check walked the arrival bitmap
// PSN by PSN over the whole length (millions of PSNs, milliseconds per packet).
func TestWeakReadFarBehindBounded(t *testing.T) {
	a := openSide(t, "127.0.0.1", Config{})
	b := openSide(t, "127.0.0.2", Config{})
	const psnA = 0x400000 // what b expects from a
	connectMode(t, a, b, wire.MTU256, psnA, 0x500, Weak)
	op := wire.OpWeakReadReq
	for i := uint32(0); i < 200; i++ {
		pkt := make([]byte, op.Info().HdrLen)
		bth := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: b.qp.QPN(), PSN: wire.PSN(psnA - 0x300000 + i), AckReq: true}
		bth.Put(pkt)
		reth := wire.RETH{VA: 0x1000, RKey: 0x1234, DMALen: 0xFFFFFF00 - i}
		reth.Put(pkt[wire.BTHLen:])
		ooh := wire.OOH{Seq: wire.PSN(i), TxSeq: i + 1}
		ooh.Put(pkt[len(pkt)-wire.OOHLen:])
		deliverTo(b, a, seal(a, b, pkt))
	}
	if st := b.qp.State(); st != StateRTS {
		t.Fatalf("responder in %v after old READ requests, want RTS", st)
	}
	if s := b.qp.Stats(); s.Duplicates != 200 {
		t.Errorf("%d duplicates counted, want 200 (%+v)", s.Duplicates, s)
	}
}

// naks returns the AETH syndromes of the acknowledgements (standard or weak) in pkts, and
// whether any READ response is among them.
func naks(t *testing.T, pkts [][]byte) (syns []uint8, readResponses int) {
	t.Helper()
	for _, b := range pkts {
		var p wire.Packet
		if err := p.Decode(b); err != nil {
			t.Fatalf("undecodable packet sent: %v", err)
		}
		switch op := p.BTH.Opcode; {
		case op == wire.OpAcknowledge || op == wire.OpWeakAck:
			if wire.AETHKind(p.AETH.Syndrome) == wire.AETHNak {
				syns = append(syns, p.AETH.Syndrome)
			}
		case op >= wire.OpReadResponseFirst && op <= wire.OpReadResponseOnly:
			readResponses++
		}
	}
	return syns, readResponses
}

// wantRemoteAccessNAK checks that the responder answered with a remote access error NAK
// and moved its QP to ERR.
func wantRemoteAccessNAK(t *testing.T, rg *pktRig, syns []uint8) {
	t.Helper()
	if len(syns) != 1 || wire.AETHValue(syns[0]) != wire.NakRemoteAccessError {
		t.Errorf("responder NAKs %#x, want one remote access error", syns)
	}
	if st := rg.b.qp.State(); st != StateErr {
		t.Errorf("responder QP in %v, want ERR", st)
	}
}

// deregMidMessage delivers the first of a message's packets to the responder, deregisters
// the responder's region reg (then quiesces, as DeregMR does), lets the application reuse
// buf, delivers the rest, checks that buf did not change and returns the NAK syndromes
// the responder sent.
func deregMidMessage(t *testing.T, rg *pktRig, reg *tpt.Region, buf []byte, pkts [][]byte) []uint8 {
	t.Helper()
	if len(pkts) < 3 {
		t.Fatalf("%d packets sent, want 3", len(pkts))
	}
	rg.deliver(rg.b, rg.a, pkts[0])
	rg.sent(rg.b.d)
	must(t, rg.b.d.MRs().Deregister(reg))
	rg.b.d.Quiesce()
	for i := range buf { // the application's buffer again
		buf[i] = 0xEE
	}
	rg.deliver(rg.b, rg.a, pkts[1])
	rg.deliver(rg.b, rg.a, pkts[2])
	placed(rg.b.d, func() bool {
		if !bytes.Equal(buf, bytes.Repeat([]byte{0xEE}, len(buf))) {
			t.Errorf("the deregistered buffer changed after DeregMR")
		}
		return true
	})
	syns, _ := naks(t, rg.sent(rg.b.d))
	return syns
}

// TestDeregDuringWrite deregisters the target of a multi-packet RDMA WRITE after its
// FIRST packet was placed: the packets after it place nothing (the application already
// reuses the buffer) and the message ends in a remote access NAK.
func TestDeregDuringWrite(t *testing.T) {
	for _, mode := range []Ordering{Ordered, Weak} {
		t.Run(mode.String(), func(t *testing.T) {
			rg := newRig(t, mode)
			src, dst := make([]byte, 3000), make([]byte, 3000)
			for i := range src {
				src[i] = byte(i)
			}
			ms, md := reg(t, rg.a.d, src), reg(t, rg.b.d, dst)
			_, err := rg.a.qp.PostSend([]SendWR{{WRID: 1, Opcode: WRWrite, Flags: FlagSignaled, RemoteAddr: md.IOVA(), RKey: md.Key(),
				SG: []SGE{{Addr: ms.IOVA(), Length: 3000, LKey: ms.Key()}}}})
			must(t, err)
			wantRemoteAccessNAK(t, rg, deregMidMessage(t, rg, md, dst, rg.sent(rg.a.d)))
		})
	}
}

// TestDeregBeforeDuplicateRead deregisters the source of an RDMA READ after it was
// answered, then the requester's READ request arrives again (its responses were lost): the
// responder must not answer it from the memory the application has reused, but NAK it.
func TestDeregBeforeDuplicateRead(t *testing.T) {
	for _, mode := range []Ordering{Ordered, Weak} {
		t.Run(mode.String(), func(t *testing.T) {
			rg := newRig(t, mode)
			src, back := make([]byte, 2000), make([]byte, 2000)
			for i := range src {
				src[i] = byte(i)
			}
			ms, mb := reg(t, rg.b.d, src), reg(t, rg.a.d, back)
			_, err := rg.a.qp.PostSend([]SendWR{{WRID: 1, Opcode: WRRead, Flags: FlagSignaled, RemoteAddr: ms.IOVA(), RKey: ms.Key(),
				SG: []SGE{{Addr: mb.IOVA(), Length: 2000, LKey: mb.Key()}}}})
			must(t, err)
			req := rg.sent(rg.a.d)[0]
			rg.deliver(rg.b, rg.a, req)
			if _, n := naks(t, rg.sent(rg.b.d)); n != 2 {
				t.Fatalf("%d READ responses, want 2", n)
			}
			must(t, rg.b.d.MRs().Deregister(ms))
			rg.b.d.Quiesce()
			for i := range src { // the application's buffer again
				src[i] = 0x77
			}
			rg.deliver(rg.b, rg.a, req) // the same request again: its responses were lost
			syns, n := naks(t, rg.sent(rg.b.d))
			if n != 0 {
				t.Errorf("%d READ responses sent from a deregistered region", n)
			}
			wantRemoteAccessNAK(t, rg, syns)
		})
	}
}

// TestDeregDuringSend deregisters the buffer of the receive WQE a multi-packet SEND is
// filling: the rest of the message places nothing, the receive completes with a local
// protection error and the requester gets a remote operational error NAK.
func TestDeregDuringSend(t *testing.T) {
	for _, mode := range []Ordering{Ordered, Weak} {
		t.Run(mode.String(), func(t *testing.T) {
			rg := newRig(t, mode)
			src, rbuf := make([]byte, 3000), make([]byte, 4096)
			for i := range src {
				src[i] = byte(i)
			}
			ms, mr := reg(t, rg.a.d, src), reg(t, rg.b.d, rbuf)
			_, err := rg.b.qp.PostRecv([]RecvWR{{WRID: 5, SG: []SGE{{Addr: mr.IOVA(), Length: 4096, LKey: mr.Key()}}}})
			must(t, err)
			_, err = rg.a.qp.PostSend([]SendWR{{WRID: 1, Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{{Addr: ms.IOVA(), Length: 3000, LKey: ms.Key()}}}})
			must(t, err)
			syns := deregMidMessage(t, rg, mr, rbuf, rg.sent(rg.a.d))
			if len(syns) != 1 || wire.AETHValue(syns[0]) != wire.NakRemoteOpError {
				t.Errorf("responder NAKs %#x, want one remote operational error", syns)
			}
			var wc [4]CQE
			if n := rg.b.cq.Poll(wc[:]); n == 0 || wc[0].WRID != 5 || wc[0].Status != StatusLocProtErr {
				t.Errorf("receive completions %+v, want WRID 5 with a local protection error", wc[:n])
			}
		})
	}
}

// QP numbers cannot be guessed from the ones before: the first QP of fresh devices gets
// many different numbers, and consecutive QPs of one device are not numbered in sequence.
func TestQPNumbersUnpredictable(t *testing.T) {
	first := map[uint32]bool{}
	for i := 0; i < 20; i++ {
		s := openSide(t, "127.0.0.1", Config{})
		first[s.qp.QPN()] = true
		s.d.Close()
	}
	if len(first) < 19 {
		t.Errorf("the first QP of 20 fresh devices got only %d numbers", len(first))
	}
	s := openSide(t, "127.0.0.1", Config{})
	prev, close := s.qp.QPN(), 0
	for i := 0; i < 200; i++ {
		q, err := s.d.CreateQP(QPConfig{PD: 1, SendCQ: s.cq, RecvCQ: s.cq, MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1})
		must(t, err)
		if d := int64(q.QPN()) - int64(prev); d >= -16 && d <= 16 {
			close++
		}
		prev = q.QPN()
		if q.QPN() < 2 {
			t.Fatalf("reserved QP number %d handed out", q.QPN())
		}
	}
	if close > 20 {
		t.Errorf("%d of 200 consecutive QP numbers within 16 of the one before", close)
	}
}

// addPair connects another pair of QPs in mode between the rig's two devices.
func (rg *pktRig) addPair(t *testing.T, mode Ordering) (a, b *side) {
	mk := func(d *Device) *side {
		cq := d.NewCQ(256)
		qp, err := d.CreateQP(QPConfig{PD: 1, SendCQ: cq, RecvCQ: cq, MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 4, MaxRecvSGE: 4})
		must(t, err)
		return &side{d: d, cq: cq, qp: qp}
	}
	a, b = mk(rg.a.d), mk(rg.b.d)
	connectMode(t, a, b, wire.MTU1024, 0, 0, mode)
	return a, b
}

// TestReadResponsesBudgeted sends a responder four READ requests of 1 MiB each (4,096
// response packets at MTU 1024, 32 bytes of requests), then a SEND on another QP of the
// same device: the other QP's ACK goes out after at most one round of the READ QP's
// responses (respBudget packets), not after all of them; and every response is still
// sent, round by round.
func TestReadResponsesBudgeted(t *testing.T) {
	rg := newRig(t, Ordered)
	a2, b2 := rg.addPair(t, Ordered)
	src := make([]byte, 1<<20)
	ms := reg(t, rg.b.d, src)
	// The test is the responder's receive path: hold it, so that the device's own receive
	// goroutine (which also sends pending rounds) cannot run rounds in between.
	d := rg.b.d
	d.q0().rxMu.Lock()
	defer d.q0().rxMu.Unlock()
	deliver := func(to, from *side, pkt []byte) {
		d.q0().input(pkt, from.d.LocalAddr())
		d.q0().finishBatch()
	}
	for i := uint32(0); i < 4; i++ {
		op := wire.OpReadRequest
		pkt := make([]byte, op.Info().HdrLen)
		bth := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: rg.b.qp.QPN(), PSN: wire.PSN(i * 1024), AckReq: true}
		bth.Put(pkt)
		reth := wire.RETH{VA: ms.IOVA(), RKey: ms.Key(), DMALen: 1 << 20}
		reth.Put(pkt[wire.BTHLen:])
		deliver(rg.b, rg.a, seal(rg.a, rg.b, pkt))
	}
	responses := func(pkts [][]byte) (n int, ackAt int) {
		ackAt = -1
		for _, b := range pkts {
			var p wire.Packet
			must(t, p.Decode(b))
			switch {
			case p.BTH.DestQP == rg.a.qp.QPN() && p.BTH.Opcode >= wire.OpReadResponseFirst && p.BTH.Opcode <= wire.OpReadResponseOnly:
				n++
			case p.BTH.DestQP == a2.qp.QPN() && p.BTH.Opcode == wire.OpAcknowledge && ackAt < 0:
				ackAt = n
			}
		}
		return n, ackAt
	}
	before, _ := responses(rg.sent(rg.b.d))
	if before > 4*respBudget || before >= 4096 {
		t.Errorf("%d READ responses sent while the 4 requests were received, want at most %d", before, min(4*respBudget, 4095))
	}

	rbuf := make([]byte, 64)
	mr := reg(t, b2.d, rbuf)
	_, err := b2.qp.PostRecv([]RecvWR{{WRID: 1, SG: []SGE{{Addr: mr.IOVA(), Length: 64, LKey: mr.Key()}}}})
	must(t, err)
	op := wire.OpSendOnly
	pkt := make([]byte, op.Info().HdrLen, op.Info().HdrLen+8)
	bth := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: b2.qp.QPN(), PSN: 0, AckReq: true}
	bth.Put(pkt)
	pkt = append(pkt, "8 bytes!"...)
	deliver(b2, a2, seal(a2, b2, pkt))
	during, ackAt := responses(rg.sent(rg.b.d))
	if ackAt < 0 {
		t.Fatal("no ACK for the other QP's SEND")
	}
	if ackAt > respBudget {
		t.Errorf("the other QP's ACK left after %d READ responses, want at most %d", ackAt, respBudget)
	}

	// The rest goes out round by round.
	total := before + during
	for i := 0; i < 4096 && total < 4096; i++ {
		d.q0().finishBatch()
		n, _ := responses(rg.sent(rg.b.d))
		total += n
	}
	if total != 4096 {
		t.Errorf("%d READ responses in all, want 4096", total)
	}
}

// A weak READ request beyond the span whose read sequence number maps to a resource slot
// that is held (a READ waiting behind a hole) is dropped as beyond the span: checks that
// can end the connection come after the PSN.
func TestWeakReadBeyondSpanSlotHeld(t *testing.T) {
	rg := newRig(t, Weak)
	src := make([]byte, 4096)
	ms := reg(t, rg.b.d, src)
	read := func(psn, seq uint32) []byte {
		op := wire.OpWeakReadReq
		pkt := make([]byte, op.Info().HdrLen)
		bth := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: rg.b.qp.QPN(), PSN: wire.PSN(psn), AckReq: true}
		bth.Put(pkt)
		reth := wire.RETH{VA: ms.IOVA(), RKey: ms.Key(), DMALen: 1024}
		reth.Put(pkt[wire.BTHLen:])
		ooh := wire.OOH{Seq: wire.PSN(seq), TxSeq: seq + 1}
		ooh.Put(pkt[len(pkt)-wire.OOHLen:])
		return seal(rg.a, rg.b, pkt)
	}
	rg.deliver(rg.b, rg.a, read(1, 0))      // PSN 0 missing: held in slot 0
	rg.deliver(rg.b, rg.a, read(50000, 16)) // far beyond the span, slot 16 % 16 = 0
	if st := rg.b.qp.State(); st != StateRTS {
		t.Fatalf("responder in %v after a READ beyond the span, want RTS", st)
	}
	if s := rg.b.qp.Stats(); s.BeyondSpan != 1 {
		t.Errorf("BeyondSpan %d, want 1", s.BeyondSpan)
	}
}

// The out-of-order-messages limit acts: with a hard limit of 2 and HardDrop, the third
// message completed behind a hole drops the connection (before, nothing counted towards
// it, and a QP held any number of messages behind a hole).
func TestLimitOOOMsgsActs(t *testing.T) {
	rg := newRig(t, Weak)
	var lc LimitConfig
	lc.Limits[LimitOOOMsgs] = Limit{Hard: 2}
	lc.OnHard = HardDrop
	rg.b.qp.SetLimits(&lc)
	buf := make([]byte, 16*64)
	rg.postRecvs(t, reg(t, rg.b.d, buf), 16, 64)
	for i := uint32(1); i <= 3; i++ { // PSN 0 (message 0) never arrives: a hole
		rg.deliver(rg.b, rg.a, rg.send1(i, i, []byte("held")))
	}
	s := rg.b.qp.LimitStats()
	if s.HardHits[LimitOOOMsgs] != 1 || rg.b.qp.State() != StateErr {
		t.Errorf("after 3 messages behind a hole with a hard limit of 2: hard hits %d, QP %v; want 1 and ERR",
			s.HardHits[LimitOOOMsgs], rg.b.qp.State())
	}
	if s.Peak[LimitOOOMsgs] != 3 {
		t.Errorf("peak out-of-order messages %d, want 3", s.Peak[LimitOOOMsgs])
	}
}

// PlacedOutOfOrder counts what was placed: a packet beyond a hole that the limit queue
// refuses is not counted (before, it was counted before the limit check).
func TestPlacedOutOfOrderAfterLimits(t *testing.T) {
	rg := newRig(t, Weak)
	var lc LimitConfig
	lc.Limits[LimitOOOSegs] = Limit{Hard: 1}
	lc.OnHard = HardRNR
	rg.b.qp.SetLimits(&lc)
	buf := make([]byte, 16*64)
	rg.postRecvs(t, reg(t, rg.b.d, buf), 16, 64)
	rg.deliver(rg.b, rg.a, rg.send1(2, 2, []byte("one"))) // PSNs 0 and 1 missing
	rg.deliver(rg.b, rg.a, rg.send1(3, 3, []byte("two"))) // a second segment ahead: refused
	if s := rg.b.qp.Stats(); s.PlacedOutOfOrder != 1 || s.RNRNAKsSent != 1 {
		t.Errorf("PlacedOutOfOrder %d, RNR NAKs %d; want 1 placed and 1 refused", s.PlacedOutOfOrder, s.RNRNAKsSent)
	}
	if ls := rg.b.qp.LimitStats(); ls.HardHits[LimitOOOSegs] != 1 || ls.Decisions[DecideHardRNR] != 1 {
		t.Errorf("out-of-order segments limit: %d hard hits, %d hard RNRs; want 1 and 1", ls.HardHits[LimitOOOSegs], ls.Decisions[DecideHardRNR])
	}
}

// In weak mode several messages can be in progress at once; the in-order-messages limit
// bounds them: with a hard limit of 2 (RNR), the first packet of a third two-packet SEND
// started before the others complete is refused.
func TestLimitInOrderMsgsWeak(t *testing.T) {
	rg := newRig(t, Weak)
	var lc LimitConfig
	lc.Limits[LimitInOrderMsgs] = Limit{Hard: 2}
	lc.OnHard = HardRNR
	rg.b.qp.SetLimits(&lc)
	buf := make([]byte, 16*4096)
	rg.postRecvs(t, reg(t, rg.b.d, buf), 16, 4096)
	for m := uint32(0); m < 3; m++ { // messages 0, 1, 2 at PSNs 0-1, 2-3, 4-5: first packets only
		o := wire.OOH{Seq: wire.PSN(m), Offset: 0, Length: 2048, Flags: wire.OOHRecv, TxSeq: m + 1}
		rg.deliver(rg.b, rg.a, rg.weakData(wire.OpWeakSend, 2*m, o, nil, 0, make([]byte, 1024)))
	}
	ls := rg.b.qp.LimitStats()
	if ls.HardHits[LimitInOrderMsgs] != 1 || ls.Peak[LimitInOrderMsgs] != 3 || rg.b.qp.Stats().RNRNAKsSent != 1 {
		t.Errorf("three messages started: %d hard hits, peak %d, %d RNR NAKs; want 1, 3 and 1",
			ls.HardHits[LimitInOrderMsgs], ls.Peak[LimitInOrderMsgs], rg.b.qp.Stats().RNRNAKsSent)
	}
	if st := rg.b.qp.State(); st != StateRTS {
		t.Errorf("QP in %v after an RNR refusal, want RTS", st)
	}
}

// readSeqs returns the read sequence numbers of the weak READ requests in pkts.
func readSeqs(t *testing.T, pkts [][]byte) []uint32 {
	t.Helper()
	var seqs []uint32
	for _, b := range pkts {
		var p wire.Packet
		must(t, p.Decode(b))
		if p.BTH.Opcode == wire.OpWeakReadReq {
			o, err := wire.DecodeOOH(p.Ext)
			must(t, err)
			seqs = append(seqs, uint32(o.Seq))
		}
	}
	return seqs
}

// In weak mode READs complete out of order; the responder keeps each in the resource slot
// seq % max_dest_rd_atomic. A requester must not send READ seq+16 while READ seq (whose
// responses were lost) is incomplete, even with only one READ outstanding: the new one
// would take the slot the lost responses are replayed from, and the old READ would never
// complete (seen as a soak that ran out of retries on a busy machine).
func TestWeakReadSlotNotReusedEarly(t *testing.T) {
	rg := newRig(t, Weak)
	const reads = 17
	src, dst := make([]byte, reads*1024), make([]byte, reads*1024)
	ms, md := reg(t, rg.b.d, src), reg(t, rg.a.d, dst)
	for i := 0; i < reads; i++ {
		_, err := rg.a.qp.PostSend([]SendWR{{WRID: uint64(i), Opcode: WRRead, Flags: FlagSignaled, RemoteAddr: ms.IOVA() + uint64(i*1024), RKey: ms.Key(),
			SG: []SGE{{Addr: md.IOVA() + uint64(i*1024), Length: 1024, LKey: md.Key()}}}})
		must(t, err)
	}
	reqs := rg.sent(rg.a.d)
	if seqs := readSeqs(t, reqs); len(seqs) != 16 {
		t.Fatalf("%d READ requests sent, want 16 (max_rd_atomic)", len(seqs))
	}
	for _, p := range reqs {
		rg.deliver(rg.b, rg.a, p)
	}
	resps := rg.sent(rg.b.d)
	var lost []byte
	for _, p := range resps {
		var pk wire.Packet
		must(t, pk.Decode(p))
		if pk.BTH.Opcode == wire.OpReadResponseOnly && lost == nil {
			lost = p // READ 0's response: lost
			continue
		}
		rg.deliver(rg.a, rg.b, p)
	}
	if seqs := readSeqs(t, rg.sent(rg.a.d)); len(seqs) != 0 {
		t.Fatalf("READ requests %v sent while READ 0 is incomplete: READ 16 would take its responder slot", seqs)
	}
	rg.deliver(rg.a, rg.b, lost)
	if seqs := readSeqs(t, rg.sent(rg.a.d)); len(seqs) != 1 || seqs[0] != 16 {
		t.Errorf("after READ 0 completed: READ requests %v, want READ 16", seqs)
	}
}

// A soft limit slows traffic that takes no receive WQE too: RDMA WRITE packets beyond a
// hole, over a soft hole-span limit, borrow a burst, then are paced — dropped unplaced and
// unacknowledged (no RNR NAK: a WRITE has none), for the requester to send again. Once the
// hole closes they are accepted and the whole message arrives.
func TestLimitSoftPacesWrites(t *testing.T) {
	rg := newRig(t, Weak)
	lc := LimitConfig{Burst: 2}
	lc.Limits[LimitHoleSpan] = Limit{Soft: 4}
	rg.b.qp.SetLimits(&lc)
	src, dst := make([]byte, 20*1024), make([]byte, 20*1024)
	for i := range src {
		src[i] = byte(i*7 + 1)
	}
	ms, md := reg(t, rg.a.d, src), reg(t, rg.b.d, dst)
	_, err := rg.a.qp.PostSend([]SendWR{{WRID: 1, Opcode: WRWrite, Flags: FlagSignaled, RemoteAddr: md.IOVA(), RKey: md.Key(),
		SG: []SGE{{Addr: ms.IOVA(), Length: uint32(len(src)), LKey: ms.Key()}}}})
	must(t, err)
	pkts := rg.sent(rg.a.d)
	if len(pkts) != 20 {
		t.Fatalf("%d packets, want 20", len(pkts))
	}
	for _, p := range pkts[1:] { // PSN 0 missing: the span grows with every packet
		rg.deliver(rg.b, rg.a, p)
	}
	ls, st := rg.b.qp.LimitStats(), rg.b.qp.Stats()
	t.Logf("decisions %v, soft hits %d, RNR NAKs %d", ls.Decisions, ls.SoftHits[LimitHoleSpan], st.RNRNAKsSent)
	if ls.Decisions[DecidePace] == 0 || ls.Decisions[DecideBorrow] == 0 || st.RNRNAKsSent != 0 || rg.b.qp.State() != StateRTS {
		t.Fatalf("WRITE packets over a soft span limit: decisions %v, %d RNR NAKs, QP %v; want borrows, then paces without RNR, RTS",
			ls.Decisions, st.RNRNAKsSent, rg.b.qp.State())
	}
	placedNow := placed(rg.b.d, func() bool { return bytes.Equal(dst[19*1024:], src[19*1024:]) })
	if placedNow {
		t.Error("the last packet, far over the soft limit, was placed")
	}
	// The hole closes; the requester sends the paced packets again: all accepted.
	rg.deliver(rg.b, rg.a, pkts[0])
	for _, p := range pkts[1:] {
		rg.deliver(rg.b, rg.a, p)
	}
	if !placed(rg.b.d, func() bool { return bytes.Equal(dst, src) }) {
		t.Error("the message is not complete after the hole closed and the paced packets came again")
	}
}
