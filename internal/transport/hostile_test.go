package transport

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
)

// requestPacket builds a request packet with opcode op for q at psn: every extended
// header zero, the payload one MTU (or none, if op carries none), then pad and ICRC as
// from's device would send it to to's.
func requestPacket(from, to *side, op wire.Opcode, psn uint32, mtu int) []byte {
	info := op.Info()
	pkt := make([]byte, info.HdrLen)
	bth := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: to.qp.QPN(), PSN: psn}
	bth.Put(pkt)
	if info.Flags&wire.HasPayload != 0 {
		pkt = append(pkt, make([]byte, mtu)...)
	}
	return seal(from, to, pkt)
}

// deliverTo hands pkt, as sent by from's device, to to's receive path.
func deliverTo(to, from *side, pkt []byte) {
	d := to.d
	d.rxMu.Lock()
	d.input(pkt, from.d.LocalAddr())
	d.finishBatch()
	d.rxMu.Unlock()
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
		bth := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: b.qp.QPN(), PSN: psnA - 0x300000 + i, AckReq: true}
		bth.Put(pkt)
		reth := wire.RETH{VA: 0x1000, RKey: 0x1234, DMALen: 0xFFFFFF00 - i}
		reth.Put(pkt[wire.BTHLen:])
		ooh := wire.OOH{Seq: i, TxSeq: i + 1}
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
