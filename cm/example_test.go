package cm_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// A server and a client (two devices in one process here; two programs or hosts in
// practice) connect an RC QP each through the connection manager. The server's buffer
// address and rkey travel in the accept's private data; the client then writes into the
// server's memory with RDMA WRITE and tells it with a SEND, then disconnects.
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
	poll := func(cq *verbs.CQ) verbs.WorkCompletion {
		wc := make([]verbs.WorkCompletion, 1)
		for cq.PollCQ(wc) == 0 {
		}
		return wc[0]
	}

	// Server: listen on service port 7471, post a receive, accept with the buffer's
	// address and rkey as private data.
	srv, pdS, cqS, qpS := open("127.0.0.2")
	defer srv.Close()
	mem := make([]byte, 64)
	mrS, _ := pdS.RegMR(mem, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	l, err := cm.Listen(srv, 7471)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	cm.InitQP(qpS, verbs.AccessRemoteWrite) // RESET -> INIT, so that receives can be posted
	qpS.PostRecv([]verbs.RecvWR{{WRID: 1}}) // a zero-length receive for the notification
	served := make(chan *cm.Conn)
	go func() {
		req, err := l.Accept(context.Background())
		if err != nil {
			panic(err)
		}
		fmt.Printf("server: request %q\n", req.PrivateData[:5])
		info := binary.BigEndian.AppendUint64(nil, mrS.Addr())
		info = binary.BigEndian.AppendUint32(info, mrS.RKey())
		conn, err := req.Accept(qpS, &cm.AcceptParams{PrivateData: info})
		if err != nil {
			panic(err)
		}
		served <- conn
	}()

	// Client: dial the server's device (its IP, the service port; its UDP port, which is
	// 4791 unless the device was opened elsewhere).
	cli, pdC, cqC, qpC := open("127.0.0.1")
	defer cli.Close()
	conn, err := cm.Dial(context.Background(), cli, netip.AddrPortFrom(srv.Addr().Addr(), 7471), qpC,
		&cm.DialParams{PrivateData: []byte("hello"), DevicePort: srv.Addr().Port()})
	if err != nil {
		panic(err)
	}
	addr, rkey := binary.BigEndian.Uint64(conn.PrivateData()), binary.BigEndian.Uint32(conn.PrivateData()[8:])
	sconn := <-served

	msg := []byte("written by the client")
	mrC, _ := pdC.RegMR(msg, verbs.AccessLocalWrite)
	qpC.PostSend([]verbs.SendWR{
		{WRID: 1, Opcode: verbs.WRRDMAWrite, SGList: []verbs.SGE{mrC.SGE(0, len(msg))}, RemoteAddr: addr, RKey: rkey},
		{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled},
	})
	fmt.Println("client:", poll(cqC).Status)
	wc := poll(cqS)
	fmt.Printf("server: %v %v, memory %q\n", wc.Opcode, wc.Status, mem[:len(msg)])

	conn.Disconnect()
	<-sconn.Done()
	fmt.Println("server:", sconn.Err())
	// Output:
	// server: request "hello"
	// client: success
	// server: RECV success, memory "written by the client"
	// server: cm: disconnected
}
