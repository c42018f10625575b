package verbs_test

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

type benchPair struct {
	ctx      [2]*verbs.Device
	cq       [2]*verbs.CQ
	qp       [2]*verbs.QP
	mr       [2]*verbs.MR
	src, dst []byte
}

// newBenchPair connects two devices with one CQ per side (verbstest.NewPair, MTU 4096)
// and registers a 1 MiB source buffer on the first and a destination on the second.
func newBenchPair(b *testing.B) *benchPair {
	b.Helper()
	p := &benchPair{src: make([]byte, 1<<20), dst: make([]byte, 1<<20)}
	x, y := verbstest.NewPair(b, verbstest.PairConfig{
		Options: &verbs.ConnectOptions{MTU: verbs.MTU4096},
		PSNA:    1, PSNB: 2,
		Cap:      verbs.QPCap{MaxSendWR: 1024, MaxRecvWR: 1024, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64},
		CQE:      4096,
		SharedCQ: true,
	})
	for i, s := range []*verbstest.Side{x, y} {
		mr := verbstest.MustReg(b, s.PD, [2][]byte{p.src, p.dst}[i], verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		p.ctx[i], p.cq[i], p.qp[i], p.mr[i] = s.Ctx, s.SCQ, s.QP, mr
	}
	return p
}

// BenchmarkPostSendPollCQ posts one signaled 8-byte RDMA WRITE and polls its completion:
// the full verbs fast path (post, transmit, peer placement and ACK, completion, poll).
func BenchmarkPostSendPollCQ(b *testing.B) {
	p := newBenchPair(b)
	sge := []verbs.SGE{p.mr[0].SGE(0, 8)}
	wr := []verbs.SendWR{{WRID: 7, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled, SGList: sge,
		RemoteAddr: p.mr[1].Addr(), RKey: p.mr[1].RKey()}}
	wc := make([]verbs.WorkCompletion, 4)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := p.qp[0].PostSend(wr); err != nil {
			b.Fatal(err)
		}
		for p.cq[0].PollCQ(wc) == 0 {
		}
		if wc[0].Status != verbs.WCSuccess {
			b.Fatal(wc[0].Status)
		}
	}
}

// BenchmarkPostSendBatch posts 16 unsignaled 4 KiB RDMA WRITEs and one signaled, then
// polls: the bandwidth-style fast path.
func BenchmarkPostSendBatch(b *testing.B) {
	p := newBenchPair(b)
	const n = 16
	sges := make([]verbs.SGE, n)
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		sges[i] = p.mr[0].SGE(i*4096, 4096)
		wrs[i] = verbs.SendWR{Opcode: verbs.WRRDMAWrite, SGList: sges[i : i+1], RemoteAddr: p.mr[1].Addr() + uint64(i*4096), RKey: p.mr[1].RKey()}
	}
	wrs[n-1].SendFlags = verbs.SendSignaled
	wc := make([]verbs.WorkCompletion, 4)
	b.SetBytes(n * 4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := p.qp[0].PostSend(wrs); err != nil {
			b.Fatal(err)
		}
		for p.cq[0].PollCQ(wc) == 0 {
		}
	}
}

// BenchmarkPollCQEmpty polls an empty CQ (which also lets the device receive).
func BenchmarkPollCQEmpty(b *testing.B) {
	p := newBenchPair(b)
	wc := make([]verbs.WorkCompletion, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.cq[0].PollCQ(wc)
	}
}

// BenchmarkSendRecv posts a receive and an 8-byte SEND and polls both completions.
func BenchmarkSendRecv(b *testing.B) {
	p := newBenchPair(b)
	rsge := []verbs.SGE{p.mr[1].SGE(0, 64)}
	rwr := []verbs.RecvWR{{WRID: 1, SGList: rsge}}
	ssge := []verbs.SGE{p.mr[0].SGE(0, 8)}
	swr := []verbs.SendWR{{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled | verbs.SendInline, SGList: ssge}}
	wc := make([]verbs.WorkCompletion, 4)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := p.qp[1].PostRecv(rwr); err != nil {
			b.Fatal(err)
		}
		if err := p.qp[0].PostSend(swr); err != nil {
			b.Fatal(err)
		}
		for p.cq[1].PollCQ(wc) == 0 {
		}
		for p.cq[0].PollCQ(wc) == 0 {
		}
	}
}

// BenchmarkRegMR registers and deregisters a fresh 128 KiB buffer: pinned (its pages
// faulted in by RegMR) and on demand (faulted in when first touched).
func BenchmarkRegMR(b *testing.B) {
	ctx := openDevice(b, ipA, verbs.DeviceConfig{})
	pd, err := ctx.AllocPD()
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		access verbs.AccessFlags
	}{{"pinned", verbs.AccessLocalWrite}, {"on-demand", verbs.AccessLocalWrite | verbs.AccessOnDemand}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				mr, err := pd.RegMR(make([]byte, 128<<10), c.access)
				if err != nil {
					b.Fatal(err)
				}
				mr.DeregMR()
			}
		})
	}
}

// BenchmarkRegMRResident times RegMR and DeregMR on a buffer whose pages are resident
// already (as msg's reserve keeps them): what an enlargement's registrations cost once the
// memory is there. An iteration registers a region and deregisters one: regMRBatch
// registrations in a row, then as many deregistrations, each run timed (reg-ns and
// dereg-ns per region; ns/op is both).
func BenchmarkRegMRResident(b *testing.B) {
	ctx := openDevice(b, ipA, verbs.DeviceConfig{})
	pd, err := ctx.AllocPD()
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 128<<10)
	for i := range buf {
		buf[i] = 1
	}
	for _, c := range []struct {
		name   string
		access verbs.AccessFlags
	}{{"pinned", verbs.AccessLocalWrite}, {"on-demand", verbs.AccessLocalWrite | verbs.AccessOnDemand}} {
		b.Run(c.name, func(b *testing.B) {
			mrs := make([]*verbs.MR, 0, regMRBatch)
			var reg, dereg time.Duration
			deregAll := func() {
				t := time.Now()
				for _, mr := range mrs {
					mr.DeregMR()
				}
				dereg += time.Since(t)
				mrs = mrs[:0]
			}
			start := time.Now()
			for b.Loop() {
				mr, err := pd.RegMR(buf, c.access)
				if err != nil {
					b.Fatal(err)
				}
				if mrs = append(mrs, mr); len(mrs) == regMRBatch {
					reg += time.Since(start)
					deregAll()
					start = time.Now()
				}
			}
			if len(mrs) > 0 {
				reg += time.Since(start)
				deregAll()
			}
			b.ReportMetric(float64(reg.Nanoseconds())/float64(b.N), "reg-ns/op")
			b.ReportMetric(float64(dereg.Nanoseconds())/float64(b.N), "dereg-ns/op")
		})
	}
}

// regMRBatch is how many regions BenchmarkRegMRResident registers before deregistering.
const regMRBatch = 256
