package transport

import (
	"bytes"
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
)

// TestWeakRNROncePerRound sends a weakly-ordered QP without a receive WQE the four
// packets of one SEND: one RNR NAK answers them, not one per packet (the requester waits
// once and sends all four again; NAKs for the later packets, arriving after the wait
// ended, would each cost it a retry of rnr_retry). The first packet sent again is refused
// with one more NAK; once a WQE is posted, the resent message is placed.
func TestWeakRNROncePerRound(t *testing.T) {
	rg := newWeakRig(t)
	data := bytes.Repeat([]byte{0x5A}, 4*rigMTU)
	pkts := make([][]byte, 4)
	for i := range pkts {
		pkts[i] = rg.weakData(wire.OpWeakSend, uint32(i), wire.OOH{Seq: 0, Offset: uint32(i * rigMTU), Length: uint32(len(data)), Flags: wire.OOHRecv},
			nil, 0, data[i*rigMTU:(i+1)*rigMTU])
	}
	for _, p := range pkts {
		rg.deliver(rg.b, rg.a, p)
	}
	if n := rg.b.qp.Stats().RNRNAKsSent; n != 1 {
		t.Fatalf("%d RNR NAKs for the four packets of one refused SEND, want 1", n)
	}
	rg.deliver(rg.b, rg.a, pkts[0]) // the requester's round after the wait
	if n := rg.b.qp.Stats().RNRNAKsSent; n != 2 {
		t.Fatalf("%d RNR NAKs after the SEND's first packet came again, want 2", n)
	}
	buf := make([]byte, len(data))
	rg.postRecvs(t, reg(t, rg.b.d, buf), 1, len(buf))
	for _, p := range pkts {
		rg.deliver(rg.b, rg.a, p)
	}
	c := waitCQE(t, rg.b.cq, 1)[0]
	if c.Status != StatusSuccess || c.ByteLen != uint32(len(data)) || !bytes.Equal(buf, data) {
		t.Fatalf("after the WQE was posted: %+v", c)
	}
}
