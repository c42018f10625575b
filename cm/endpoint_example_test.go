package cm_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// A connection in one call on each side: DialQP and Listener.AcceptQP make the PD, the
// CQ and the RC QP and connect them, and Close frees them. The server (127.0.0.2) serves
// a region for RDMA READ, whose address and key travel in the accept's private data,
// and has a receive posted for the client's SEND; the client (127.0.0.1) reads the
// region and sends a message. (The two devices are in one process here, and take any
// free UDP port; two programs on two hosts would each keep the default port 4791 and
// leave DevicePort zero.)
func ExampleDialQP() {
	ctx := context.Background()
	open := func(ip string) *verbs.Device {
		dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr(ip), Port: verbs.AnyPort})
		if err != nil {
			panic(err)
		}
		return dev
	}

	// Server: a PD of its own, so that its regions exist before the connection does.
	srv := open("127.0.0.2")
	defer srv.Close()
	pd, _ := srv.AllocPD()
	table, _ := pd.RegMR([]byte("served from 127.0.0.2"), verbs.AccessRemoteRead)
	inbox, _ := pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite)
	l, err := cm.Listen(srv, 7471)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	served := make(chan string)
	go func() {
		key := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(nil, table.Addr()), table.RKey())
		ep, err := l.AcceptQP(ctx, &cm.QPConfig{PD: pd, Recv: []verbs.RecvWR{{SGList: []verbs.SGE{inbox.SGE(0, 64)}}}},
			&cm.AcceptParams{PrivateData: key})
		if err != nil {
			panic(err)
		}
		wc := make([]verbs.WorkCompletion, 1)
		ep.CQ().Wait(ctx, wc) // the client's SEND
		served <- fmt.Sprintf("server: %v %q", wc[0].Opcode, inbox.Buf()[:wc[0].ByteLen])
		<-ep.Done() // until the client disconnects
		ep.Close()
		served <- "server: " + ep.Err().Error()
	}()

	// Client: everything the connection needs in one call, then a READ and a SEND.
	cli := open("127.0.0.1")
	defer cli.Close()
	ep, err := cm.DialQP(ctx, cli, netip.AddrPortFrom(srv.Addr().Addr(), 7471), nil,
		&cm.DialParams{DevicePort: srv.Addr().Port()})
	if err != nil {
		panic(err)
	}
	addr, rkey := binary.BigEndian.Uint64(ep.PrivateData()), binary.BigEndian.Uint32(ep.PrivateData()[8:])
	mr, _ := ep.RegMR(append(make([]byte, 21), "hello"...), verbs.AccessLocalWrite)
	ep.QP().PostSend([]verbs.SendWR{
		{Opcode: verbs.WRRDMARead, SGList: []verbs.SGE{mr.SGE(0, 21)}, RemoteAddr: addr, RKey: rkey, SendFlags: verbs.SendSignaled},
		{Opcode: verbs.WRSend, SGList: []verbs.SGE{mr.SGE(21, 5)}, SendFlags: verbs.SendSignaled},
	})
	wc := make([]verbs.WorkCompletion, 2)
	for n := 0; n < 2; {
		k, _ := ep.CQ().Wait(ctx, wc[n:])
		n += k
	}
	fmt.Printf("client: %v %q, then %v\n", wc[0].Opcode, mr.Buf()[:21], wc[1].Opcode)
	fmt.Println(<-served)
	ep.Close() // disconnects, then frees the QP, the CQ, the region and the PD
	fmt.Println(<-served)
	// Output:
	// client: RDMA_READ "served from 127.0.0.2", then SEND
	// server: RECV "hello"
	// server: cm: disconnected
}
