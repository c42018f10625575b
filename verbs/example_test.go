package verbs_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/softrnic/softrnic/verbs"
)

// Two devices on one host (127.0.0.1 and 127.0.0.2), one RC queue pair each: a SEND with
// immediate data into a posted receive, then an RDMA WRITE straight into the peer's
// registered memory, each completion waited for with CQ.Wait.
func Example() {
	open := func(ip string) (*verbs.Device, *verbs.PD, *verbs.CQ, *verbs.QP) {
		dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr(ip), Port: verbs.AnyPort})
		if err != nil {
			panic(err)
		}
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(64, nil, 0)
		qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			panic(err)
		}
		return dev, pd, cq, qp
	}
	devA, pdA, cqA, qpA := open("127.0.0.1")
	defer devA.Close()
	devB, pdB, cqB, qpB := open("127.0.0.2")
	defer devB.Close()

	// Exchange endpoints (out of band in real programs) and connect: RESET->INIT->RTR->RTS.
	// Each side sends from a random starting PSN, and tells the peer which.
	epA, epB := qpA.Endpoint(verbs.RandomPSN()), qpB.Endpoint(verbs.RandomPSN())
	if err := qpA.Connect(epA.PSN, epB, verbs.ConnectOptions{}); err != nil {
		panic(err)
	}
	if err := qpB.Connect(epB.PSN, epA, verbs.ConnectOptions{}); err != nil {
		panic(err)
	}

	src := []byte("hello, remote memory")
	dst := make([]byte, 64)
	mrA, _ := pdA.RegMR(src, verbs.AccessLocalWrite)
	mrB, _ := pdB.RegMR(dst, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)

	// SEND with immediate data into a posted receive.
	qpB.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{mrB.SGE(0, 64)}}})
	qpA.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRSendWithImm, ImmData: 42,
		SendFlags: verbs.SendSignaled, SGList: []verbs.SGE{mrA.SGE(0, 5)}}})
	// CQ.Wait polls until a completion is in (or the context ends).
	ctx := context.Background()
	wc := make([]verbs.WorkCompletion, 1)
	if _, err := cqB.Wait(ctx, wc); err != nil {
		panic(err)
	}
	fmt.Println(wc[0].Opcode, wc[0].Status, wc[0].ByteLen, wc[0].ImmData, string(dst[:5]))
	cqA.Wait(ctx, wc)
	fmt.Println(wc[0].Opcode, wc[0].Status)

	// RDMA WRITE: the peer's CPU is not involved; only the writer gets a completion. The
	// peer learns that the data is there from a later message (RC keeps them in order).
	qpB.PostRecv([]verbs.RecvWR{{WRID: 4}})
	qpA.PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
		SGList: []verbs.SGE{mrA.SGE(0, len(src))}, RemoteAddr: mrB.Addr() + 8, RKey: mrB.RKey()},
		{WRID: 5, Opcode: verbs.WRSend}})
	cqA.Wait(ctx, wc)
	write := wc[0]
	cqB.Wait(ctx, wc) // the message after the WRITE
	fmt.Println(write.Opcode, write.Status, string(dst[8:8+len(src)]))
	// Output:
	// RECV success 5 42 hello
	// SEND success
	// RDMA_WRITE success hello, remote memory
}

// The sequence of the package documentation, one call per libibverbs function: a QP
// connected to itself with ModifyQP, and a SEND whose completion is waited for on a
// completion channel (sleeping, not polling).
func Example_completionChannel() {
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr("127.0.0.1"), Port: verbs.AnyPort})
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	da := dev.QueryDevice()
	pd, _ := dev.AllocPD()
	buf := make([]byte, 64)
	mr, _ := pd.RegMR(buf, verbs.AccessLocalWrite)
	ch, _ := dev.CreateCompChannel()
	cq, _ := dev.CreateCQ(16, ch, 0)
	qpCap := verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	qp, _ := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: qpCap})

	// RESET -> INIT -> RTR -> RTS. The peer is the QP itself; a real one's Endpoint comes
	// out of band.
	self := qp.Endpoint(verbs.RandomPSN())
	for _, s := range []struct {
		qpAttr verbs.QPAttr
		mask   verbs.QPAttrMask
	}{
		{verbs.QPAttr{QPState: verbs.StateInit, PortNum: 1},
			verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags},
		{verbs.QPAttr{QPState: verbs.StateRTR, PathMTU: verbs.MTU1024, DestQPNum: self.QPNum, RQPSN: self.PSN, MinRNRTimer: 12,
			AHAttr: verbs.AHAttr{DGID: self.GID, DestPort: self.Port, PortNum: 1, IsGlobal: true, HopLimit: 64}},
			verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN |
				verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer},
		{verbs.QPAttr{QPState: verbs.StateRTS, SQPSN: self.PSN, Timeout: 14, RetryCnt: 7, RNRRetry: 7},
			verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry |
				verbs.QPAttrSQPSN | verbs.QPAttrMaxQPRdAtomic},
	} {
		if err := qp.ModifyQP(&s.qpAttr, s.mask); err != nil {
			panic(err)
		}
	}

	// Arm the CQ, post, and sleep until its event; then poll.
	copy(buf, "hello")
	cq.ReqNotifyCQ(false)
	qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{mr.SGE(32, 32)}}})
	qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled,
		SGList: []verbs.SGE{mr.SGE(0, 5)}}})
	got, err := ch.GetCQEvent(context.Background())
	if err != nil {
		panic(err)
	}
	got.AckCQEvents(1)
	wc := make([]verbs.WorkCompletion, 2)
	for n := 0; n < len(wc); {
		n += cq.PollCQ(wc[n:])
	}
	slices.SortFunc(wc, func(a, b verbs.WorkCompletion) int { return int(a.WRID) - int(b.WRID) })
	fmt.Println(da.PhysPortCnt, "port,", got == cq)
	fmt.Println(wc[0].Opcode, wc[0].Status, string(buf[32:32+wc[0].ByteLen]))
	fmt.Println(wc[1].Opcode, wc[1].Status)
	// Output:
	// 1 port, true
	// RECV success hello
	// SEND success
}
