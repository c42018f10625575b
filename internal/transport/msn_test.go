package transport

import (
	"sync"
	"testing"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// TestResponseMSN delivers one receive batch holding WRITE, READ, WRITE, FetchAdd, WRITE
// (messages 1 to 5 of the connection): the READ's response carries MSN 2 and the atomic's
// ACK MSN 4, as Linux rxe computes them (the count of messages up to and including that
// request), not the MSN of the later messages the batch also executed before the
// responses left. Every packet the device sends carries MigReq.
func TestResponseMSN(t *testing.T) {
	var mu sync.Mutex
	msn := map[wire.Opcode]uint32{}
	migReq := true
	mon := func(pkt []byte) netio.Verdict {
		var p wire.Packet
		if p.Decode(pkt) == nil {
			mu.Lock()
			if p.Info.Flags&wire.HasAETH != 0 {
				msn[p.BTH.Opcode] = p.AETH.MSN
			}
			migReq = migReq && p.BTH.MigReq
			mu.Unlock()
		}
		return netio.Verdict{Action: netio.Deliver}
	}
	a := openSide(t, "127.0.0.1", Config{})
	b := openSide(t, "127.0.0.2", Config{FaultFilter: mon})
	const psnA = 0x5000 // what b expects from a
	connectMode(t, a, b, wire.MTU1024, psnA, 0x900, Ordered)
	dst := make([]byte, 64)
	md := reg(t, b.d, dst)
	fl := wiretest.Flow(a.d.LocalAddr(), b.d.LocalAddr())
	reth := func(n uint32) func([]byte) {
		return func(hdr []byte) {
			r := wire.RETH{VA: md.IOVA(), RKey: md.Key(), DMALen: n}
			r.Put(hdr[wire.BTHLen:])
		}
	}
	bth := func(op wire.Opcode, i int) wire.BTH {
		return wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: b.qp.QPN(), PSN: wire.PSN(psnA + i), AckReq: true}
	}
	write := func(i int) []byte { return wiretest.Build(&fl, bth(wire.OpWriteOnly, i), reth(8), make([]byte, 8)) }
	pkts := [][]byte{
		write(0),
		wiretest.Build(&fl, bth(wire.OpReadRequest, 1), reth(16), nil),
		write(2),
		wiretest.Build(&fl, bth(wire.OpFetchAdd, 3), func(hdr []byte) {
			at := wire.AtomicETH{VA: md.IOVA() + 32, RKey: md.Key(), SwapAdd: 1}
			at.Put(hdr[wire.BTHLen:])
		}, nil),
		write(4),
	}
	d := b.d
	d.q0().rxMu.Lock()
	for _, p := range pkts {
		d.q0().input(p, a.d.LocalAddr())
	}
	d.q0().finishBatch()
	d.q0().rxMu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if got, ok := msn[wire.OpReadResponseOnly]; !ok || got != 2 {
		t.Errorf("READ response MSN %d (sent: %v), want 2", got, ok)
	}
	if got, ok := msn[wire.OpAtomicAcknowledge]; !ok || got != 4 {
		t.Errorf("atomic ACK MSN %d (sent: %v), want 4", got, ok)
	}
	if !migReq {
		t.Error("a packet without MigReq")
	}
}
