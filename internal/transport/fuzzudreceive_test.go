package transport

import (
	"bytes"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// FuzzUDReceivePath feeds a UD QP datagrams of any opcode, Q_Key, length and source,
// sealed with a valid ICRC: nothing panics; no byte outside the posted receive buffers
// changes (the guard bytes around them stay), nor a buffer's bytes past what its
// completion reports; a completion never reports more than its buffer holds; a datagram
// with another Q_Key is counted and completes nothing; and nothing is sent in answer (a UD
// QP acknowledges nothing).
func FuzzUDReceivePath(f *testing.F) {
	const qkey, bufLen, nbuf, guard, fillByte = 0x1234, 300, 4, 64, 0xEE
	var sent atomic.Int64
	b := udSideCfg(f, "127.0.0.2", qkey, Config{FaultFilter: func([]byte) netio.Verdict {
		sent.Add(1)
		return netio.Verdict{Action: netio.Drop}
	}})
	mem := make([]byte, guard+nbuf*bufLen+guard)
	mr := reg(f, b.d, mem)
	posted := [nbuf]bool{}
	slot := func(i int) []byte { return mem[guard+i*bufLen : guard+(i+1)*bufLen] }
	for _, s := range []struct {
		op     uint8
		key    uint8
		n      uint16
		from   uint8
		srcQP  uint32
		fillBy byte
	}{
		{0, 0, 16, 0, 7, 1}, {1, 0, 260, 0, 7, 2}, {1, 0, 261, 0, 7, 3}, {0, 1, 16, 0, 7, 4},
		{2, 0, 16, 0, 7, 5}, {3, 0, 0, 1, 0xFFFFFF, 6}, {0, 0, 4000, 2, 1, 7},
	} {
		f.Add(s.op, s.key, s.n, s.from, s.srcQP, s.fillBy)
	}
	f.Fuzz(func(t *testing.T, opSel, keySel uint8, n uint16, fromSel uint8, srcQP uint32, fillBy byte) {
		q := b.qp
		// Every buffer posted, its bytes (and the guards) known.
		for i := range posted {
			if !posted[i] {
				for k := range slot(i) {
					slot(i)[k] = fillByte
				}
				_, err := q.PostRecv([]RecvWR{{WRID: uint64(i), SG: []SGE{{Addr: mr.IOVA() + uint64(guard+i*bufLen), Length: bufLen, LKey: mr.Key()}}}})
				must(t, err)
				posted[i] = true
			}
		}
		for k := 0; k < guard; k++ {
			mem[k], mem[len(mem)-1-k] = fillByte, fillByte
		}
		op := [4]wire.Opcode{wire.OpUDSendOnly, wire.OpUDSendOnlyImm, wire.OpSendOnly, wire.Opcode(opSel)}[opSel&3]
		if !op.Info().Valid {
			op = wire.OpUDSendOnly
		}
		key := uint32(qkey)
		if keySel&1 != 0 {
			key = uint32(keySel) << 8
		}
		from := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:4791"), netip.MustParseAddrPort("127.0.0.3:1"),
			netip.MustParseAddrPort("[::ffff:127.0.0.9]:65535")}[int(fromSel)%3]
		fl := wiretest.Flow(from, b.d.LocalAddr())
		payload := bytes.Repeat([]byte{fillBy}, int(n)%5000)
		if op.Info().Flags&wire.HasPayload == 0 {
			payload = nil
		}
		pkt := wiretest.Build(&fl, wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: q.QPN(), PSN: wire.PSN(srcQP)}, func(hdr []byte) {
			if op.Info().Flags&wire.HasDETH != 0 {
				d := wire.DETH{QKey: key, SrcQP: srcQP & wire.PSNMask}
				d.Put(hdr[wire.BTHLen:])
			}
		}, payload)
		qkeyErrs, sent0 := q.Stats().QKeyErrors, sent.Load()
		b.d.q0().rxMu.Lock()
		b.d.q0().input(pkt, from)
		b.d.q0().finishBatch()
		b.d.q0().rxMu.Unlock()

		for k := 0; k < guard; k++ {
			if mem[k] != fillByte || mem[len(mem)-1-k] != fillByte {
				t.Fatalf("a guard byte changed (%d from the edge)", k)
			}
		}
		var cqes [8]CQE
		for _, e := range cqes[:b.cq.Poll(cqes[:])] {
			i := int(e.WRID)
			if i >= nbuf || !posted[i] {
				t.Fatalf("completion for WRID %d, which is not posted: %+v", e.WRID, e)
			}
			posted[i] = false
			if e.ByteLen > bufLen {
				t.Fatalf("completion reports %d bytes of a %d-byte buffer", e.ByteLen, bufLen)
			}
			for k, c := range slot(i)[e.ByteLen:] {
				if c != fillByte {
					t.Fatalf("byte %d of buffer %d, past the %d the completion reports, changed", int(e.ByteLen)+k, i, e.ByteLen)
				}
			}
			if e.Status == StatusSuccess && (key != qkey || e.SrcQP != srcQP&wire.PSNMask || e.Flags&WCFlagGRH == 0) {
				t.Fatalf("delivered %+v (Q_Key %#x, source QP %#x)", e, key, srcQP&wire.PSNMask)
			}
		}
		if key != qkey && op.Info().Flags&wire.HasDETH != 0 && q.Stats().QKeyErrors != qkeyErrs+1 {
			t.Fatalf("a datagram with Q_Key %#x was not counted", key)
		}
		if sent.Load() != sent0 {
			t.Fatalf("the UD QP sent %d packets in answer", sent.Load()-sent0)
		}
		if q.State() == StateErr {
			// A receive error (a datagram longer than its buffer) moved the QP to ERR: its
			// WQEs were flushed above; start again from RESET.
			must(t, q.Modify(&Attr{State: StateReset}, MaskState, lim))
			udUp(t, q, qkey)
			posted = [nbuf]bool{}
		}
	})
}
