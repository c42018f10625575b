package transport

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// TestAnyIPv4Identification sends a device RDMA WRITEs whose ICRC was computed over an
// IPv4 header with a random, nonzero identification, as Linux rxe sends them: each is
// accepted and placed. The same packet with one bit flipped is counted as an ICRC error.
func TestAnyIPv4Identification(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	a := openSide(t, "127.0.0.1", Config{})
	b := openSide(t, "127.0.0.2", Config{})
	const psnA = 0x3000 // what b expects from a
	connectMode(t, a, b, wire.MTU1024, psnA, 0x700, Ordered)
	dst := make([]byte, 64*100)
	md := reg(t, b.d, dst)
	fl := wiretest.Flow(a.d.LocalAddr(), b.d.LocalAddr())
	for i := 0; i < 100; i++ {
		payload := bytes.Repeat([]byte{byte(i + 1)}, 64)
		fl.IPID = uint16(1 + rng.IntN(65535))
		pkt := wiretest.Build(&fl, wire.BTH{Opcode: wire.OpWriteOnly, PKey: wire.DefaultPKey, DestQP: b.qp.QPN(), PSN: wire.PSN(psnA + i)},
			func(hdr []byte) {
				r := wire.RETH{VA: md.IOVA() + uint64(64*i), RKey: md.Key(), DMALen: 64}
				r.Put(hdr[wire.BTHLen:])
			}, payload)
		bad := append([]byte(nil), pkt...)
		bad[wire.BTHLen+wire.RETHLen+10] ^= 0x10
		deliverTo(b, a, bad)
		deliverTo(b, a, pkt)
	}
	if !placed(b.d, func() bool { return dst[len(dst)-1] == 100 }) {
		t.Fatal("the WRITEs were not placed")
	}
	for i := 0; i < 100; i++ {
		if dst[64*i] != byte(i+1) || dst[64*i+63] != byte(i+1) {
			t.Fatalf("WRITE %d not placed", i)
		}
	}
	b.d.q0().rxMu.Lock()
	icrc := b.d.q0().rx.icrc
	b.d.q0().rxMu.Unlock()
	if icrc != 100 {
		t.Errorf("%d ICRC errors counted, want 100 (the corrupted copies)", icrc)
	}
}
