//go:build linux

package interop

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/interop/rxevm"
	"github.com/softrnic/softrnic/verbs"
)

// TestCMMessages: the CM messages that only a slow or absent application makes, exchanged
// with Linux's CM over rxe in both directions. MRA (MsgRcptAck) is what a CM sends for a
// resent REQ that its application has not answered yet; Linux's passive side sends it
// then (rdma_cm marks every request it delivers as MRA'd, and answers a duplicate with the
// MRA), and so does softrnic's. REJ with "invalid service ID" is what a CM answers a
// request for a port nobody listens on. ucmatose (librdmacm's example) is the rxe side.
func TestCMMessages(t *testing.T) {
	vm := sharedVM(t)
	bin := tool(t, "cmd/ucmatose")
	t.Run("MRA/rxe-server", func(t *testing.T) { mraFromLinux(t, vm, bin) })
	t.Run("MRA/softrnic-server", func(t *testing.T) { mraToLinux(t, vm) })
	t.Run("REJ/softrnic-server", func(t *testing.T) { rejToLinux(t, vm) })
	t.Run("REJ/rxe-server", func(t *testing.T) { rejFromLinux(t, vm) })
}

// cmSysfs is where the guest's ib_cm counts the MADs of rxe0's port 1, by direction
// (cm_tx_msgs, cm_rx_msgs, cm_rx_duplicates) and message ("mra", "rej", "req").
const cmSysfs = "/sys/class/infiniband/rxe0/ports/1/"

func guestCMCounter(t *testing.T, vm *rxevm.VM, name string) int {
	t.Helper()
	out := execOK(t, vm, time.Minute, "cat "+cmSysfs+name)
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("%s: %q", name, out)
	}
	return n
}

// cmCapture captures the bridge while a cell runs; check verifies every packet (ICRC,
// port 4791) and that the capture holds want, e.g. "10.77.1.2->10.77.1.1 MAD MRA".
func cmCapture(t *testing.T, ctx context.Context, vm *rxevm.VM) (check func(want ...string)) {
	path := filepath.Join(t.TempDir(), "cm.pcap")
	stop, err := ppCapture(ctx, vm, path)
	if err != nil {
		t.Fatal(err)
	}
	in := vm.Info()
	return func(want ...string) {
		t.Helper()
		if err := stop(); err != nil {
			var drop *captureDropError
			if !errors.As(err, &drop) {
				t.Fatalf("capture: %v", err)
			}
			t.Logf("capture incomplete: %v", err)
		}
		r, err := CheckCapture(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("bridge: %v", r)
		if err := r.Err(); err != nil {
			t.Error(err)
		}
		for _, w := range want {
			w = expand(w, in)
			if r.ByKind[w] == 0 {
				t.Errorf("no %q on the bridge", w)
			}
		}
	}
}

// hostDevice opens a softrnic device at the host's address (UDP 4791, where a standard
// peer sends) in the VM's namespace, with a CM listener on port 7471.
func hostDevice(t *testing.T, vm *rxevm.VM) (*verbs.Device, *cm.Listener) {
	var dev *verbs.Device
	var l *cm.Listener
	err := vm.InNamespace(func() (err error) {
		if dev, err = verbs.OpenDevice(verbs.DeviceConfig{Addr: vm.Info().HostAddr}); err != nil {
			return err
		}
		l, err = cm.Listen(dev, 7471)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); dev.Close() })
	return dev, l
}

// ucmQP is a QP for one of ucmatose's connections (-C 1 -S 100): one receive of 100
// bytes posted, and a 100-byte message to send.
type ucmQP struct {
	qp   *verbs.QP
	cq   *verbs.CQ
	send *verbs.MR
}

func newUCMQP(t *testing.T, dev *verbs.Device) *ucmQP {
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := dev.CreateCQ(8, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	recv, err := pd.RegMR(make([]byte, 100), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	send, err := pd.RegMR(make([]byte, 100), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := cm.InitQP(qp, 0); err != nil {
		t.Fatal(err)
	}
	if err := qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{recv.SGE(0, 100)}}}); err != nil {
		t.Fatal(err)
	}
	return &ucmQP{qp: qp, cq: cq, send: send}
}

// exchange sends the message and waits for one completion of each kind, as ucmatose's
// two sides do (the server sends first, the client replies).
func (u *ucmQP) exchange(ctx context.Context) error {
	if err := u.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled,
		SGList: []verbs.SGE{u.send.SGE(0, 100)}}}); err != nil {
		return err
	}
	wc := make([]verbs.WorkCompletion, 1)
	for seen := 0; seen < 2; seen++ {
		if _, err := u.cq.Wait(ctx, wc); err != nil {
			return err
		}
		if wc[0].Status != verbs.WCSuccess {
			return fmt.Errorf("completion %v: %v", wc[0].Opcode, wc[0].Status)
		}
	}
	return nil
}

// mraFromLinux: ucmatose's server on rxe is stopped (SIGSTOP) before softrnic's client
// connects, so its kernel holds the request undelivered; softrnic resends the REQ after
// its CM response timeout, Linux answers the duplicate with an MRA, softrnic waits the
// MRA's service timeout instead of giving up, and once the server runs again (SIGCONT)
// the connection comes up and carries ucmatose's messages.
func mraFromLinux(t *testing.T, vm *rxevm.VM, bin string) {
	record(t, "ucmatose", true, "CM: MRA from Linux (server stopped until it sent one)")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	check := cmCapture(t, ctx, vm)
	mra := guestCMCounter(t, vm, "cm_tx_msgs/mra")
	srv, err := vm.Spawn(expand("ucmatose -b $GUEST -c 1 -C 1 -S 100", vm.Info()))
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.WaitUntil(ctx, cmListening); err != nil {
		_ = srv.Signal("TERM")
		t.Fatalf("guest server not listening: %v", err)
	}
	if err := srv.Signal("STOP"); err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	cli := vm.HostCommand(ctx, bin, "-s", vm.Info().GuestAddr.String(), "-c", "1", "-C", "1", "-S", "100", "--json")
	cli.Stdout, cli.Stderr = &out, &out
	if err := cli.Start(); err != nil {
		_ = srv.Signal("KILL")
		t.Fatal(err)
	}
	werr := vm.WaitUntil(ctx, fmt.Sprintf("test $(cat %scm_tx_msgs/mra) -gt %d", cmSysfs, mra))
	if err := srv.Signal("CONT"); err != nil {
		t.Error(err)
	}
	if werr != nil {
		t.Errorf("Linux sent no MRA: %v", werr)
	}
	cliErr := cli.Wait()
	gout, gerr, rc, err := srv.Wait(ctx)
	t.Logf("guest (exit %d):\n%s%s", rc, gout, gerr)
	t.Logf("host:\n%s", out.String())
	if err != nil || rc != 0 || !strings.Contains(gout, "return status 0") {
		t.Errorf("guest ucmatose: exit %d, %v", rc, err)
	}
	if cliErr != nil || !strings.Contains(out.String(), `"ok":true`) {
		t.Errorf("softrnic's ucmatose: %v", cliErr)
	}
	if n := jsonCounter(out.String(), "MRAReceived"); n < 1 {
		t.Errorf("softrnic's CM counted %d MRAs received", n)
	}
	check("$GUEST->$HOST MAD MRA", "$HOST->$GUEST MAD RTU")
}

// mraToLinux: ucmatose's client on rxe connects to a softrnic listener whose application
// accepts only after Linux resent its REQ (its CM response timeout, about 4.8 s) and
// softrnic answered that with an MRA; Linux then waits instead of giving up, and the
// connection carries ucmatose's messages.
func mraToLinux(t *testing.T, vm *rxevm.VM) {
	record(t, "ucmatose", false, "CM: MRA to Linux (accept after the REQ was resent)")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	check := cmCapture(t, ctx, vm)
	mra := guestCMCounter(t, vm, "cm_rx_msgs/mra")
	dev, l := hostDevice(t, vm)
	u := newUCMQP(t, dev)
	cli, err := vm.Spawn(expand("ucmatose -s $HOST -c 1 -C 1 -S 100", vm.Info()))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Signal("KILL")
	req, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, func() bool { return cm.DeviceCounters(dev).MRASent > 0 }); err != nil {
		t.Fatalf("softrnic sent no MRA: %v (%+v)", err, cm.DeviceCounters(dev))
	}
	conn, err := req.Accept(u.qp, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := u.exchange(ctx); err != nil {
		t.Error(err)
	}
	conn.Disconnect()
	gout, gerr, rc, err := cli.Wait(ctx)
	t.Logf("guest (exit %d):\n%s%s", rc, gout, gerr)
	t.Logf("softrnic: %s", cmStats(dev))
	if err != nil || rc != 0 || !strings.Contains(gout, "return status 0") {
		t.Errorf("guest ucmatose: exit %d, %v", rc, err)
	}
	if n := guestCMCounter(t, vm, "cm_rx_msgs/mra"); n <= mra {
		t.Errorf("Linux's cm_rx_msgs/mra stayed at %d", n)
	}
	check("$HOST->$GUEST MAD MRA", "$HOST->$GUEST MAD REP", "$GUEST->$HOST MAD RTU")
}

// rejToLinux: ucmatose's client on rxe asks for a port that softrnic's device does not
// listen on, and rdma_cm reports the REJ's reason to it (8, invalid service ID), as a
// Linux peer's CM would have answered.
func rejToLinux(t *testing.T, vm *rxevm.VM) {
	record(t, "ucmatose", false, "CM: REJ to Linux (no listener on the port)")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	check := cmCapture(t, ctx, vm)
	dev, _ := hostDevice(t, vm)
	gout, gerr, rc, err := vm.Exec(ctx, expand("ucmatose -s $HOST -p 7472 -c 1 -C 1 -S 100", vm.Info()))
	t.Logf("guest (exit %d):\n%s%s", rc, gout, gerr)
	if err != nil {
		t.Fatal(err)
	}
	if want := "RDMA_CM_EVENT_REJECTED, error: 8"; rc == 0 || !strings.Contains(gout, want) {
		t.Errorf("guest ucmatose exited %d without %q", rc, want)
	}
	if s := cm.DeviceCounters(dev); s.REJSent == 0 || s.Dropped != 0 {
		t.Errorf("softrnic's CM: %+v", s)
	}
	check("$HOST->$GUEST MAD REJ")
}

// rejFromLinux: softrnic dials a port on rxe's address that nothing listens on; Linux's
// CM answers with REJ "invalid service ID", which Dial returns as ErrNoListener at once.
func rejFromLinux(t *testing.T, vm *rxevm.VM) {
	record(t, "ucmatose", true, "CM: REJ from Linux (no listener on the port)")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	check := cmCapture(t, ctx, vm)
	dev, _ := hostDevice(t, vm)
	u := newUCMQP(t, dev)
	_, err := cm.Dial(ctx, dev, netip.AddrPortFrom(vm.Info().GuestAddr, 7473), u.qp, nil)
	var rej *cm.RejectError
	if !errors.Is(err, cm.ErrNoListener) || !errors.As(err, &rej) {
		t.Errorf("Dial to a port with no listener: %v", err)
	}
	if s := cm.DeviceCounters(dev); s.REJReceived != 1 || s.REQRetries != 0 || s.Dropped != 0 {
		t.Errorf("softrnic's CM: %+v", s)
	}
	check("$GUEST->$HOST MAD REJ")
}

// waitFor polls cond until it holds or ctx ends: for a counter of another party, which
// nothing signals.
func waitFor(ctx context.Context, cond func() bool) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

var jsonCounterRE = regexp.MustCompile(`"(\w+)":(\d+)`)

// jsonCounter is the value of the first "name":N in a tool's --json output (-1 if none).
func jsonCounter(out, name string) int {
	for _, m := range jsonCounterRE.FindAllStringSubmatch(out, -1) {
		if m[1] == name {
			n, _ := strconv.Atoi(m[2])
			return n
		}
	}
	return -1
}

// cmStats formats dev's CM counters for a log.
func cmStats(dev *verbs.Device) string { return fmt.Sprintf("%+v", cm.DeviceCounters(dev)) }
