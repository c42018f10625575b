package transport

import (
	"bytes"
	"testing"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// Two devices with four receive queues each and eight QP pairs: the QPs are spread evenly
// over the queues (two each); a SEND one way and a WRITE the other on every pair. Every
// packet a queue receives is for one of its own QPs (no packet misrouted), each queue
// receives exactly what its QPs count as received, and every queue receives traffic.
func TestQueuesSteerByQP(t *testing.T) {
	if !netioCanSteer() {
		t.Skip("no steering by QP on this system: devices have one queue")
	}
	const queues, size = 4, 20000
	a := openSide(t, "127.0.0.1", Config{Queues: queues})
	b := openSide(t, "127.0.0.2", Config{Queues: queues})
	if a.d.Queues() != queues || b.d.Queues() != queues {
		t.Fatalf("%d and %d queues, want %d", a.d.Queues(), b.d.Queues(), queues)
	}
	as, bs := []*side{a}, []*side{b}
	aq, bq := []*QP{a.qp}, []*QP{b.qp}
	for len(as) < 2*queues {
		for _, s := range []struct {
			own  *side
			list *[]*side
			qps  *[]*QP
		}{{a, &as, &aq}, {b, &bs, &bq}} {
			qp, err := s.own.d.CreateQP(QPConfig{PD: 1, SendCQ: s.own.cq, RecvCQ: s.own.cq, MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1})
			must(t, err)
			*s.list = append(*s.list, &side{d: s.own.d, cq: s.own.cq, qp: qp})
			*s.qps = append(*s.qps, qp)
		}
	}
	for _, qps := range [][]*QP{aq, bq} {
		var per [queues]int
		for _, q := range qps {
			per[q.QPN()%queues]++
		}
		if per != [queues]int{2, 2, 2, 2} {
			t.Fatalf("QPs per queue %v, want 2 each", per)
		}
	}
	src, dst := make([]byte, size), make([]byte, size*len(as))
	for i := range src {
		src[i] = byte(i * 13)
	}
	srcB := bytes.Clone(src)
	ma, mb, msb := reg(t, a.d, src), reg(t, b.d, dst), reg(t, b.d, srcB)
	back := make([]byte, size*len(as))
	mback := reg(t, a.d, back)
	for i := range as {
		connectMode(t, as[i], bs[i], wire.MTU1024, 0, 0, Ordered)
		_, err := bs[i].qp.PostRecv([]RecvWR{{WRID: 1, SG: []SGE{{Addr: mb.IOVA() + uint64(i*size), Length: size, LKey: mb.Key()}}}})
		must(t, err)
		_, err = as[i].qp.PostSend([]SendWR{{WRID: 2, Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{{Addr: ma.IOVA(), Length: size, LKey: ma.Key()}}}})
		must(t, err)
		_, err = bs[i].qp.PostSend([]SendWR{{WRID: 3, Opcode: WRWrite, Flags: FlagSignaled, RemoteAddr: mback.IOVA() + uint64(i*size), RKey: mback.Key(),
			SG: []SGE{{Addr: msb.IOVA(), Length: size, LKey: msb.Key()}}}})
		must(t, err)
	}
	// a: one send completion per pair; b: a receive and a write completion per pair.
	for _, c := range append(waitCQE(t, a.cq, len(as)), waitCQE(t, b.cq, 2*len(bs))...) {
		if c.Status != 0 {
			t.Fatalf("completion %+v", c)
		}
	}
	if !placed(a.d, func() bool { return bytes.Equal(back, bytes.Repeat(src, len(as))) }) ||
		!placed(b.d, func() bool { return bytes.Equal(dst, bytes.Repeat(src, len(as))) }) {
		t.Fatal("data placed wrong")
	}
	for _, s := range []struct {
		name string
		d    *Device
		qps  []*QP
	}{{"a", a.d, aq}, {"b", b.d, bq}} {
		var own [queues]uint64
		for _, q := range s.qps {
			own[q.QPN()%queues] += q.Stats().RxPackets
		}
		var total uint64
		for i, st := range s.d.QueueStats() {
			total += st.RxPackets
			if st.Misrouted != 0 {
				t.Errorf("%s queue %d: %d packets for another queue's QPs", s.name, i, st.Misrouted)
			}
			if st.RxPackets == 0 || st.RxPackets != own[i] {
				t.Errorf("%s queue %d received %d packets, its QPs %d: want the same, and some", s.name, i, st.RxPackets, own[i])
			}
		}
		if ds := s.d.Stats(); ds.RxPackets != total {
			t.Errorf("%s: device counts %d packets received, its queues %d", s.name, ds.RxPackets, total)
		}
		t.Logf("%s: %d QPs, per queue %v", s.name, len(s.qps), own)
	}
}

func netioCanSteer() bool { return netio.CanSteer }
