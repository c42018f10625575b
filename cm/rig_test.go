package cm

import (
	"context"
	"net/netip"
	"testing"
	"time"

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

func devs(t *testing.T, cfg verbs.DeviceConfig) (a, b *verbs.Context) {
	t.Helper()
	return verbstest.OpenDevice(t, verbstest.IPA, cfg), verbstest.OpenDevice(t, verbstest.IPB, cfg)
}

// remote is the service address of b's listener, with b's UDP port in p.
func remote(b *verbs.Context, p *DialParams) netip.AddrPort {
	p.DevicePort = b.Addr().Port()
	return netip.AddrPortFrom(b.Addr().Addr(), testPort)
}

// endpoint is one side's QP with a registered buffer and receives posted in INIT.
type endpoint struct {
	*verbstest.Side
	buf []byte
	mr  *verbs.MR
}

func newEndpoint(t testing.TB, ctx *verbs.Context, recvs int) *endpoint {
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
	copy(a.buf, verbstest.Pattern(n, uint64(n)))
	verbstest.MustPostSend(t, a.QP, verbs.SendWR{WRID: 99, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: verbstest.SGL(a.mr, 0, n)})
	verbstest.WantSendWC(t, verbstest.PollOne(t, a.SCQ), 99, verbs.WCSend, a.QP)
	wc := verbstest.PollOne(t, b.RCQ)
	if wc.Status != verbs.WCSuccess || int(wc.ByteLen) != n {
		t.Fatalf("receive: %v, %d bytes, want success, %d", wc.Status, wc.ByteLen, n)
	}
	verbstest.CheckBytes(t, "received", b.buf[2048:2048+n], a.buf[:n])
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
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
		r, err := l.Accept(ctxT(t))
		if err != nil {
			acc <- res{nil, err}
			return
		}
		c, err := r.Accept(b.QP, ap)
		acc <- res{c, err}
	}()
	ca, err = Dial(ctxT(t), a.Ctx, remote(b.Ctx, dp), a.QP, dp)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	r := <-acc
	if r.err != nil {
		t.Fatalf("Accept: %v", r.err)
	}
	return ca, r.c
}
