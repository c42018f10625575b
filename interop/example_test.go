package interop_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/softrnic/softrnic/interop"
	"github.com/softrnic/softrnic/verbs"
)

// Check a capture of RoCEv2 traffic as the interoperability tests check the link to rxe:
// every packet's ICRC verified, packets counted by direction and kind. Here the capture
// is one softrnic device's (DeviceConfig.PcapFile), of a SEND to another device and its
// acknowledgement; tcpdump's capture of a real link is read the same way.
func ExampleCheckCapture() {
	dir, err := os.MkdirTemp("", "capture")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "a.pcap")

	// The check looks at UDP port 4791, the RoCEv2 port: device A takes it, on a loopback
	// address of its own so that no other program's device is in the way; B takes any port.
	var a *verbs.Device
	for try := 0; a == nil; try++ {
		ip := netip.AddrFrom4([4]byte{127, byte(rand.IntN(250) + 1), byte(rand.IntN(250) + 1), 1})
		if a, err = verbs.OpenDevice(verbs.DeviceConfig{Addr: ip, PcapFile: file}); err != nil && try == 9 {
			panic(err)
		}
	}
	b, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: a.Addr().Addr().Next(), Port: verbs.AnyPort})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	qp := func(dev *verbs.Device) (*verbs.QP, *verbs.CQ) {
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(4, nil, 0)
		qp, _ := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
		return qp, cq
	}
	qa, cqa := qp(a)
	qb, cqb := qp(b)
	ea, eb := qa.Endpoint(verbs.RandomPSN()), qb.Endpoint(verbs.RandomPSN())
	qa.Connect(ea.PSN, eb, verbs.ConnectOptions{})
	qb.Connect(eb.PSN, ea, verbs.ConnectOptions{})
	qb.PostRecv([]verbs.RecvWR{{}})
	qa.PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled}})
	wc := make([]verbs.WorkCompletion, 1)
	cqb.Wait(context.Background(), wc)
	cqa.Wait(context.Background(), wc) // the SEND acknowledged
	a.Close()                          // the capture is complete

	r, err := interop.CheckCapture(file)
	if err != nil {
		panic(err)
	}
	var kinds []string
	for k := range r.ByKind {
		ends := strings.Fields(k)
		way := "A->B"
		if strings.HasPrefix(k, b.Addr().Addr().String()) {
			way = "B->A"
		}
		kinds = append(kinds, way+" "+ends[len(ends)-1])
	}
	slices.Sort(kinds)
	fmt.Println(kinds, "bad ICRC:", len(r.BadICRC))
	// Output:
	// [A->B RC_SEND_ONLY B->A RC_ACKNOWLEDGE] bad ICRC: 0
}
