//go:build linux

package interop

import (
	"errors"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/interop/rxevm"
	"github.com/softrnic/softrnic/verbs"
)

// A softrnic device on the VM's link takes the same active MTU as rxe0 on the other end
// (1024 on a 1500-byte link), and refuses a path MTU the link cannot carry.
func TestDeviceMTU(t *testing.T) {
	checkDeviceMTU(t, sharedVM(t))
}

// checkDeviceMTU opens a device at the host's address in vm's namespace and compares its
// port with the link and with rxe0's active MTU.
func checkDeviceMTU(t *testing.T, vm *rxevm.VM) {
	in := vm.Info()
	var dev *verbs.Device
	err := vm.InNamespace(func() (err error) {
		dev, err = verbs.OpenDevice(verbs.DeviceConfig{Addr: in.HostAddr, Port: verbs.AnyPort})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	p, err := dev.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("softrnic at %v: %+v; rxe0 active_mtu %d", in.HostAddr, p, in.ActiveMTU)
	if p.Interface != in.Bridge || p.LinkMTU != in.MTU || p.ActiveMTU.Bytes() != in.ActiveMTU {
		t.Errorf("port on %q, link MTU %d, active MTU %d; want %q, %d and rxe0's %d",
			p.Interface, p.LinkMTU, p.ActiveMTU.Bytes(), in.Bridge, in.MTU, in.ActiveMTU)
	}
	if p.ActiveMTU == verbs.MTU4096 {
		return
	}
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := dev.CreateCQ(4, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	remote := verbs.Endpoint{GID: verbs.GIDFromAddr(in.GuestAddr), Port: 4791, QPNum: 0x11, PSN: 1, AnySourcePort: true}
	err = qp.Connect(1, remote, verbs.ConnectOptions{MTU: p.ActiveMTU + 1})
	if !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), "above the port's active MTU") {
		t.Errorf("Connect above the active MTU: %v", err)
	}
}
