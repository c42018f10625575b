package cm

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// The tests' rig: two devices (A dials, B listens) on separate loopback addresses, and
// helpers for QPs with receives posted before the handshake.

const testPort = 7471

// fast are dial parameters for tests: quick retries (a busy machine only makes them
// resend, which the state machine must absorb), and a keep-alive that notices a killed
// peer within a second.
func fast(data []byte) *DialParams {
	return &DialParams{PrivateData: data, ResponseTimeout: 100 * time.Millisecond, MaxRetries: 15}
}

func devs(t *testing.T, cfg verbs.DeviceConfig) (a, b *verbs.Device) {
	t.Helper()
	return verbstest.OpenDevice(t, verbstest.IPA, cfg), verbstest.OpenDevice(t, verbstest.IPB, cfg)
}

// remote is the service address of b's listener, with b's UDP port in p.
func remote(b *verbs.Device, p *DialParams) netip.AddrPort {
	p.DevicePort = b.Addr().Port()
	return netip.AddrPortFrom(b.Addr().Addr(), testPort)
}

// endpoint is one side's QP with a registered buffer and receives posted in INIT.
type endpoint struct {
	*verbstest.Side
	buf []byte
	mr  *verbs.MR
}

func newEndpoint(t testing.TB, ctx *verbs.Device, recvs int) *endpoint {
	t.Helper()
	s := verbstest.NewSide(t, ctx, verbstest.SideConfig{Cap: verbstest.DefaultCap, CQE: 1024})
	e := &endpoint{Side: s, buf: make([]byte, 4096)}
	e.mr = verbstest.MustReg(t, s.PD, e.buf, verbstest.AllAccess)
	if recvs > 0 {
		if err := InitQP(s.QP, verbstest.AllRemote); err != nil {
			t.Fatalf("InitQP: %v", err)
		}
		for i := 0; i < recvs; i++ {
			verbstest.MustPostRecv(t, s.QP, verbs.RecvWR{WRID: uint64(i), SGList: verbstest.SGL(e.mr, 2048, 2048)})
		}
	}
	return e
}

// sendRecv sends n bytes from a to b over the connected QPs and checks they arrive.
func sendRecv(t testing.TB, a, b *endpoint, n int) {
	t.Helper()
	copy(a.buf, testutil.Pattern(n, uint64(n)))
	verbstest.MustPostSend(t, a.QP, verbs.SendWR{WRID: 99, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: verbstest.SGL(a.mr, 0, n)})
	verbstest.WantSendWC(t, verbstest.PollOne(t, a.SCQ), 99, verbs.WCSend, a.QP)
	wc := verbstest.PollOne(t, b.RCQ)
	if wc.Status != verbs.WCSuccess || int(wc.ByteLen) != n {
		t.Fatalf("receive: %v, %d bytes, want success, %d", wc.Status, wc.ByteLen, n)
	}
	verbstest.CheckBytes(t, "received", b.buf[2048:2048+n], a.buf[:n])
}

// handshake listens on b, dials from a and accepts, with the given parameters.
func handshake(t *testing.T, a, b *endpoint, dp *DialParams, ap *AcceptParams) (ca, cb *Conn) {
	t.Helper()
	l, err := Listen(b.Ctx, testPort)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	type res struct {
		c   *Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		r, err := l.Accept(testutil.Context(t))
		if err != nil {
			acc <- res{nil, err}
			return
		}
		c, err := r.Accept(b.QP, ap)
		acc <- res{c, err}
	}()
	ca, err = Dial(testutil.Context(t), a.Ctx, remote(b.Ctx, dp), a.QP, dp)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	r := <-acc
	if r.err != nil {
		t.Fatalf("Accept: %v", r.err)
	}
	return ca, r.c
}

// acceptEach accepts n requests on l, the i-th on the QP qp(i) returns, each Accept in a
// goroutine of its own so that many handshakes go on at once. It returns the connections
// (in the order they completed), failing the test on the first error.
func acceptEach(t *testing.T, l *Listener, n int, qp func(i int) (*verbs.QP, error), ap *AcceptParams) <-chan *Conn {
	t.Helper()
	conns := make(chan *Conn, n)
	errs := make(chan error, n)
	go func() {
		for i := 0; i < n; i++ {
			r, err := l.Accept(testutil.Context(t))
			if err != nil {
				errs <- err
				return
			}
			q, err := qp(i)
			if err != nil {
				errs <- err
				return
			}
			go func() {
				c, err := r.Accept(q, ap)
				if err != nil {
					errs <- err
					return
				}
				conns <- c
			}()
		}
	}()
	out := make(chan *Conn, n)
	go func() {
		defer close(out)
		for i := 0; i < n; i++ {
			select {
			case c := <-conns:
				out <- c
			case err := <-errs:
				t.Errorf("Accept: %v", err)
				return
			}
		}
	}()
	return out
}

// dialEach dials b's listener from every QP at once and returns the connections in the
// QPs' order, failing the test on any error.
func dialEach(t *testing.T, a, b *verbs.Device, qps []*verbs.QP, params func() *DialParams) []*Conn {
	t.Helper()
	conns := make([]*Conn, len(qps))
	errs := make([]error, len(qps))
	var wg sync.WaitGroup
	for i, qp := range qps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := params()
			conns[i], errs[i] = Dial(testutil.Context(t), a, remote(b, p), qp, p)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
	}
	return conns
}

// collect takes n connections from accepted, failing the test if fewer come.
func collect(t *testing.T, accepted <-chan *Conn, n int) []*Conn {
	t.Helper()
	var out []*Conn
	for c := range accepted {
		out = append(out, c)
	}
	if len(out) != n {
		t.Fatalf("%d connections accepted, want %d", len(out), n)
	}
	return out
}

// injectREQ hands m (the manager of device to) a ConnectRequest as if it came from src,
// with the rdma_cm header naming both addresses.
func injectREQ(m *manager, src netip.AddrPort, to *verbs.Device, req *mad.REQ) {
	h := mad.CMAHeader{SrcPort: 1, Src: src.Addr(), Dst: to.Addr().Addr()}
	h.Put(req.PrivateData[:])
	var b [mad.Size]byte
	mad.Put(b[:], 1, req)
	m.HandleMAD(src, 1, b[:])
}
