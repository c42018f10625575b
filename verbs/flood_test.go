package verbs_test

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/verbs"
)

// BenchmarkReadFloodVictimRTT measures what a READ flood on one QP does to another QP of
// the same device. A peer that is a plain UDP socket (127.0.0.3) keeps up to 16 RDMA READ
// requests of 64 MiB outstanding against QP H of device B: 32 bytes of requests for 1 GiB
// of responses, which it never reads. Meanwhile QP V of device A ping-pongs 8-byte SENDs
// with QP W of device B. Reported per sub-benchmark: the victim's round trip (p50, p99,
// max, in µs) and, flooded, the READ response packets B sent per second.
//
//	go test -run NONE -bench ReadFlood -benchtime 3000x ./verbs/
func BenchmarkReadFloodVictimRTT(b *testing.B) {
	for _, flood := range []bool{false, true} {
		name := "idle"
		if flood {
			name = "flooded"
		}
		b.Run(name, func(b *testing.B) {
			rtts, resp := readFlood(b, b.N, flood)
			if flood {
				b.ReportMetric(resp, "resp-pkts/s")
			}
			slices.Sort(rtts)
			at := func(q float64) float64 { return float64(rtts[int(q*float64(len(rtts)-1))].Nanoseconds()) / 1e3 }
			b.ReportMetric(at(0.5), "p50-µs")
			b.ReportMetric(at(0.99), "p99-µs")
			b.ReportMetric(at(1), "max-µs")
		})
	}
}

// A READ flood on one QP (1 GiB of responses asked for with 32 bytes of requests) does not
// kill another QP of the same device: the victim's 300 ping-pongs all succeed. (Before the
// responses were produced in rounds, the device sent a whole flood's responses before
// anything else, the victim's ACKs waited behind them, and it ran out of retries.)
func TestReadFloodVictimSurvives(t *testing.T) {
	if testing.Short() {
		t.Skip("moves gigabytes of READ responses; skipped in -short mode")
	}
	readFlood(t, 300, true)
}

// readFlood runs n victim ping-pongs, with or without the flood, and returns their round
// trips and the flood's READ response packets per second.
func readFlood(b testing.TB, n int, flood bool) ([]time.Duration, float64) {
	v, w := newSides(b, pairConfig{CQE: 1024})
	epV, epW := v.qp.Endpoint(verbs.RandomPSN()), w.qp.Endpoint(verbs.RandomPSN())
	o := verbs.ConnectOptions{MTU: verbs.MTU4096}
	if err := v.qp.Connect(epV.PSN, epW, o); err != nil {
		b.Fatal(err)
	}
	if err := w.qp.Connect(epW.PSN, epV, o); err != nil {
		b.Fatal(err)
	}
	bufV := mustReg(b, v.pd, make([]byte, 64), verbs.AccessLocalWrite)
	bufW := mustReg(b, w.pd, make([]byte, 64), verbs.AccessLocalWrite)

	var stop chan struct{}
	var wg sync.WaitGroup
	var stopFlood func()
	var h *side
	if flood {
		h = newSide(b, w.ctx, defaultCap, 64, false)
		src := mustReg(b, h.pd, make([]byte, 64<<20), verbs.AccessRemoteRead)
		uc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.3:0")))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { uc.Close() })
		fake := uc.LocalAddr().(*net.UDPAddr).AddrPort()
		psn := verbs.RandomPSN()
		ep := verbs.Endpoint{GID: verbs.GIDFromAddr(fake.Addr()), Port: fake.Port(), QPNum: 0xABCDE, PSN: psn}
		if err := h.qp.Connect(verbs.RandomPSN(), ep, o); err != nil {
			b.Fatal(err)
		}
		const npkts = 64 << 20 / 4096
		stop = make(chan struct{})
		var once sync.Once
		stopFlood = func() { once.Do(func() { close(stop) }); wg.Wait() }
		b.Cleanup(stopFlood) // before uc closes, also when the test fails
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				sent := h.qp.Counters().TxPackets
				for i := 0; i < 16; i++ {
					sendReadRequest(b, uc, w.ctx, h.qp, psn, src)
					psn = (psn + npkts) & 0xFFFFFF
				}
				// The next 16 when these are answered (or the benchmark ends).
				for h.qp.Counters().TxPackets < sent+16*npkts {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
				}
			}
		}()
	}

	rtts := make([]time.Duration, 0, n)
	wc := make([]verbs.WorkCompletion, 4)
	poll := func(cq *verbs.CQ) {
		for {
			if n := cq.PollCQ(wc); n > 0 {
				if wc[0].Status != verbs.WCSuccess {
					b.Fatalf("victim completion %+v", wc[0])
				}
				return
			}
		}
	}
	var txH uint64
	if h != nil {
		txH = h.qp.Counters().TxPackets
	}
	if bb, ok := b.(*testing.B); ok {
		bb.ResetTimer()
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		mustPostRecv(b, w.qp, verbs.RecvWR{WRID: 1, SGList: sge(bufW, 0, 8)})
		mustPostRecv(b, v.qp, verbs.RecvWR{WRID: 2, SGList: sge(bufV, 0, 8)})
		t0 := time.Now()
		mustPostSend(b, v.qp, verbs.SendWR{WRID: 3, Opcode: verbs.WRSend, SGList: sge(bufV, 0, 8)})
		poll(w.rcq)
		mustPostSend(b, w.qp, verbs.SendWR{WRID: 4, Opcode: verbs.WRSend, SGList: sge(bufW, 0, 8)})
		poll(v.rcq)
		rtts = append(rtts, time.Since(t0))
	}
	if bb, ok := b.(*testing.B); ok {
		bb.StopTimer()
	}
	elapsed := time.Since(start)
	var resp float64
	if flood {
		resp = float64(h.qp.Counters().TxPackets-txH) / elapsed.Seconds()
		stopFlood()
	}
	return rtts, resp
}

// sendReadRequest sends, from uc, an RDMA READ request for the whole of src to qp at psn.
func sendReadRequest(b testing.TB, uc *net.UDPConn, dev *verbs.Device, qp *verbs.QP, psn uint32, src *verbs.MR) {
	op := wire.OpReadRequest
	pkt := make([]byte, op.Info().HdrLen, op.Info().HdrLen+4)
	bth := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: qp.QPNum(), PSN: wire.PSN(psn), AckReq: true}
	bth.Put(pkt)
	reth := wire.RETH{VA: src.Addr(), RKey: src.RKey(), DMALen: uint32(src.Len())}
	reth.Put(pkt[wire.BTHLen:])
	sendRaw(b, uc, dev, pkt)
}
