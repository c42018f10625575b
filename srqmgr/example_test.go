package srqmgr_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/softrnic/softrnic/srqmgr"
	"github.com/softrnic/softrnic/verbs"
)

// A server takes the messages of all its connections from one shared receive queue, and
// a Manager keeps that SRQ stocked: it measures how many receives each connection takes,
// and posts (or retires) registered buffers so that the SRQ holds what the connections
// need between two refills, not a worst case of depth × connections. The server hands
// each receive completion to Consume, which gives the buffer back.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(ip string) *verbs.Device {
		dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr(ip), Port: verbs.AnyPort})
		if err != nil {
			panic(err)
		}
		return dev
	}
	srv, cli := open("127.0.0.2"), open("127.0.0.1")
	defer srv.Close()
	defer cli.Close()

	// The server: one SRQ and one CQ for every connection, and the manager of the SRQ.
	pd, _ := srv.AllocPD()
	cq, _ := srv.CreateCQ(256, nil, 0)
	srq, _ := pd.CreateSRQ(&verbs.SRQInitAttr{MaxWR: 256, MaxSGE: 1})
	m, err := srqmgr.Start(ctx, srqmgr.Config{SRQ: srq, PD: pd, BufSize: 64})
	if err != nil {
		panic(err)
	}
	defer m.Close()

	// Three clients, each with a connection to a QP of the server's on the SRQ; each
	// sends one message.
	pdC, _ := cli.AllocPD()
	cqC, _ := cli.CreateCQ(16, nil, 0)
	text, _ := pdC.RegMR([]byte("client 0client 1client 2"), verbs.AccessLocalWrite)
	for i := range 3 {
		s, _ := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 1}})
		c, _ := pdC.CreateQP(&verbs.QPInitAttr{SendCQ: cqC, RecvCQ: cqC, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1}})
		se, ce := s.Endpoint(verbs.RandomPSN()), c.Endpoint(verbs.RandomPSN())
		if err := s.Connect(se.PSN, ce, verbs.ConnectOptions{}); err != nil {
			panic(err)
		}
		if err := c.Connect(ce.PSN, se, verbs.ConnectOptions{}); err != nil {
			panic(err)
		}
		m.Attach(s) // the manager measures this connection's demand
		c.PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, SGList: []verbs.SGE{text.SGE(8*i, 8)}}})
	}

	var got []string
	wc := make([]verbs.WorkCompletion, 8)
	for len(got) < 3 {
		n, err := cq.Wait(ctx, wc)
		if err != nil {
			panic(err)
		}
		for i := range wc[:n] {
			m.Consume(&wc[i], func(msg []byte) { got = append(got, string(msg)) })
		}
	}
	slices.Sort(got) // connections do not keep order among themselves
	fmt.Println(got)
	fmt.Println("buffers still in use:", m.Summary().InUse)
	// Output:
	// [client 0 client 1 client 2]
	// buffers still in use: 0
}
