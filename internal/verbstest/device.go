// Package verbstest is the test rig the project's suites share for devices on loopback:
// it opens devices, builds connected RC QP pairs and SRQ fan-ins, registers buffers, and
// waits for completions, events and conditions with the failure guard
// testutil.WaitLimit (never for a time: see internal/testutil).
//
//	a, b := verbstest.NewPair(t, verbstest.PairConfig{Link: verbstest.DefaultLink().InMode(verbs.OrderingWeak)})
//	src := verbstest.MustReg(t, a.PD, testutil.Pattern(4096, 1), 0)
//	dst := verbstest.MustReg(t, b.PD, make([]byte, 4096), verbstest.AllAccess)
//	verbstest.MustPostSend(t, a.QP, verbs.SendWR{Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
//		SGList: verbstest.SGL(src, 0, 4096), RemoteAddr: dst.Addr(), RKey: dst.RKey()})
//	verbstest.PollOne(t, a.SCQ)
//
// Devices open on 127.0.0.1 (IPA) and 127.0.0.2 (IPB) with an ephemeral UDP port, fault
// injection off unless the configuration asks for it, and close when the test ends.
package verbstest

import (
	"net/netip"
	"runtime"
	"sync"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/verbs"
)

// WaitLimit bounds every wait of the rig. It is a failure guard only: tests wait for
// conditions, never for time (see internal/testutil).
const WaitLimit = testutil.WaitLimit

// The addresses the two devices of a pair open on.
var (
	IPA = netip.MustParseAddr("127.0.0.1")
	IPB = netip.MustParseAddr("127.0.0.2")
)

// OpenDevice opens a device on ip with an ephemeral UDP port and closes it when the test
// ends. Unless cfg says otherwise, fault injection is off (SOFTRNIC_FAULTS is ignored) so
// that tests are deterministic. The device takes part in Progress.
func OpenDevice(t testing.TB, ip netip.Addr, cfg verbs.DeviceConfig) *verbs.Device {
	t.Helper()
	cfg.Addr = ip
	cfg.Port = verbs.AnyPort
	if cfg.Faults == nil {
		cfg.Faults = &verbs.Faults{}
	}
	ctx, err := verbs.OpenDevice(cfg)
	if err != nil {
		t.Fatalf("OpenDevice(%v): %v", ip, err)
	}
	t.Cleanup(func() { ctx.Close() })
	cq, err := ctx.CreateCQ(1, nil, 0)
	if err != nil {
		t.Fatalf("CreateCQ: %v", err)
	}
	progress.Lock()
	progress.cqs[ctx] = cq
	progress.Unlock()
	t.Cleanup(func() {
		progress.Lock()
		delete(progress.cqs, ctx)
		progress.Unlock()
	})
	return ctx
}

// progress holds an empty CQ of every open test device. Polling an empty CQ lets its
// device process the packets waiting on its socket in the calling goroutine (as
// documented for PollCQ). Waiting loops do that for every device, so that a test does not
// depend on the Go scheduler running another device's receive goroutine while the test
// goroutine busy-polls: on a loaded machine that goroutine can wait for tens of
// milliseconds, long enough for short ACK timeouts to expire.
var progress = struct {
	sync.Mutex
	cqs map[*verbs.Device]*verbs.CQ
}{cqs: map[*verbs.Device]*verbs.CQ{}}

// Progress lets every device opened with OpenDevice process its waiting packets, then
// yields. The rig's waits call it on every round.
func Progress() {
	progress.Lock()
	cqs := make([]*verbs.CQ, 0, len(progress.cqs))
	for _, cq := range progress.cqs {
		cqs = append(cqs, cq)
	}
	progress.Unlock()
	var wc [1]verbs.WorkCompletion
	for _, cq := range cqs {
		cq.PollCQ(wc[:])
	}
	runtime.Gosched()
}

// Settle orders, for the race detector, the work the devices' engines did so far before
// what the test does next, and what the test did before their later work. RDMA places
// and fetches data in the devices' goroutines and reports completion through the network:
// the requester's completion proves that the responder placed the data, but the race
// detector cannot see an ordering carried by packets. The engine touches registered
// memory only while it holds the device's receive path or a QP's lock, and
// Context.Counters takes both. (A real program learns that an RDMA WRITE arrived from a
// later message it receives, which orders it in the same way.)
func Settle(ctxs ...*verbs.Device) {
	for _, c := range ctxs {
		c.Counters()
	}
}
