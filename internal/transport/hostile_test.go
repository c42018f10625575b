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
			const psnB = 0x1000
			connectMode(t, a, b, wire.MTU1024, 0x500, psnB, mode)
			sent := uint64(0)
			for op := 0; op < 256; op++ {
				info := wire.Opcode(op).Info()
				if !info.Valid || info.Flags&wire.IsRequest == 0 || (info.Flags&wire.IsWeak != 0) == (mode == Weak) {
					continue
				}
				for _, psn := range []uint32{psnB, psnB + 1, psnB - 1, rng.Uint32() & wire.PSNMask} {
					deliverTo(b, a, requestPacket(a, b, wire.Opcode(op), psn, 1024))
					sent++
					if st := b.qp.State(); st != StateRTS {
						t.Fatalf("%v QP in %v after a %v request at PSN %#x (expected %#x)", mode, st, wire.Opcode(op), psn, psnB)
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
