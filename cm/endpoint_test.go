package cm

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// waitWC waits for one completion on cq and checks that it succeeded with op.
func waitWC(t *testing.T, cq *verbs.CQ, op verbs.WCOpcode) verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wc := make([]verbs.WorkCompletion, 1)
	if _, err := cq.Wait(ctx, wc); err != nil {
		t.Fatalf("waiting for %v: %v", op, err)
	}
	if wc[0].Status != verbs.WCSuccess || wc[0].Opcode != op {
		t.Fatalf("completion %v %v, want %v success", wc[0].Opcode, wc[0].Status, op)
	}
	return wc[0]
}

// acceptQPAsync runs l.AcceptQP in a goroutine of its own.
func acceptQPAsync(l *Listener, cfg *QPConfig, p *AcceptParams) <-chan any {
	out := make(chan any, 1)
	go func() {
		ep, err := l.AcceptQP(context.Background(), cfg, p)
		if err != nil {
			out <- err
			return
		}
		out <- ep
	}()
	return out
}

// One call on each side makes the verbs objects and connects them: the server's
// receive posted through QPConfig.Recv takes the client's first SEND, the client READs
// the region whose key came in the private data, and Close frees everything it made and
// nothing it was given.
func TestDialQPAcceptQP(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	pd, err := db.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	table, _ := pd.RegMR([]byte("a table served by B"), verbs.AccessRemoteRead)
	inbox, _ := pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite)
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := acceptQPAsync(l, &QPConfig{PD: pd, Recv: []verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{inbox.SGE(0, 64)}}}},
		&AcceptParams{PrivateData: []byte("welcome")})

	p := fast([]byte("hello"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := DialQP(ctx, da, remote(db, p), nil, p)
	if err != nil {
		t.Fatalf("DialQP: %v", err)
	}
	var srv *Endpoint
	switch v := (<-accepted).(type) {
	case error:
		t.Fatalf("AcceptQP: %v", v)
	case *Endpoint:
		srv = v
	}
	if !bytes.HasPrefix(cli.PrivateData(), []byte("welcome")) || !bytes.HasPrefix(srv.PrivateData(), []byte("hello")) {
		t.Errorf("private data %q / %q", cli.PrivateData(), srv.PrivateData())
	}
	if srv.PD() != pd || cli.PD() == nil || cli.QP().PD() != cli.PD() || srv.QP().PD() != pd {
		t.Errorf("PDs: the server's endpoint has %p (given %p), the client's QP %p (endpoint %p)", srv.PD(), pd, cli.QP().PD(), cli.PD())
	}
	for _, ep := range []*Endpoint{cli, srv} {
		if s := ep.QP().State(); s != verbs.StateRTS {
			t.Errorf("QP in %v, want RTS", s)
		}
	}

	buf, err := cli.RegMR(make([]byte, 64), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatalf("RegMR: %v", err)
	}
	copy(buf.Buf(), "ping")
	if err := cli.QP().PostSend([]verbs.SendWR{
		{WRID: 1, Opcode: verbs.WRSend, SGList: []verbs.SGE{buf.SGE(0, 4)}, SendFlags: verbs.SendSignaled},
		{WRID: 2, Opcode: verbs.WRRDMARead, SGList: []verbs.SGE{buf.SGE(8, table.Len())}, RemoteAddr: table.Addr(), RKey: table.RKey(), SendFlags: verbs.SendSignaled},
	}); err != nil {
		t.Fatalf("PostSend: %v", err)
	}
	waitWC(t, cli.CQ(), verbs.WCSend)
	waitWC(t, cli.CQ(), verbs.WCRDMARead)
	if got := string(buf.Buf()[8 : 8+table.Len()]); got != "a table served by B" {
		t.Errorf("READ brought %q", got)
	}
	if wc := waitWC(t, srv.CQ(), verbs.WCRecv); wc.WRID != 7 || string(inbox.Buf()[:wc.ByteLen]) != "ping" {
		t.Errorf("server received WR %d %q", wc.WRID, inbox.Buf()[:wc.ByteLen])
	}

	// The client's Close disconnects: the server's connection ends.
	cliPD, cliCQ, cliQP := cli.PD(), cli.CQ(), cli.QP()
	if err := cli.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	<-srv.Done()
	if !errors.Is(srv.Err(), ErrDisconnected) {
		t.Errorf("server's connection ended with %v, want ErrDisconnected", srv.Err())
	}
	if err := cli.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
	for what, err := range map[string]error{"QP": cliQP.DestroyQP(), "CQ": cliCQ.DestroyCQ(), "PD": cliPD.DeallocPD(), "MR": buf.DeregMR()} {
		if !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("the client's %s after Close: freeing it again gives %v, want ErrClosed (freed)", what, err)
		}
	}
	if _, err := cli.RegMR(make([]byte, 8), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("RegMR after Close: %v, want ErrClosed", err)
	}

	// The server's Close leaves the PD it was given, and its regions, to their owner.
	if err := srv.Close(); err != nil {
		t.Fatalf("server Close: %v", err)
	}
	if err := table.DeregMR(); err != nil {
		t.Errorf("the server's own region after Close: %v", err)
	}
	inbox.DeregMR()
	if err := pd.DeallocPD(); err != nil {
		t.Errorf("the server's own PD after Close: %v (its QP should be gone)", err)
	}
}

// A DialQP that fails leaves nothing behind; an AcceptQP that cannot make its QP rejects
// the request (no resources) and leaves nothing behind either.
func TestDialQPAcceptQPFailures(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pdA, _ := da.AllocPD()
	p := fast(nil)
	if _, err := DialQP(ctx, da, remote(db, p), &QPConfig{PD: pdA}, p); !errors.Is(err, ErrNoListener) {
		t.Fatalf("DialQP to a port nobody listens on: %v, want ErrNoListener", err)
	}
	if err := pdA.DeallocPD(); err != nil {
		t.Errorf("the PD after a failed DialQP: %v (a QP left on it?)", err)
	}

	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pdB, _ := db.AllocPD()
	accepted := acceptQPAsync(l, &QPConfig{PD: pdB, Cap: verbs.QPCap{MaxSendWR: 1 << 30}}, nil)
	_, err = DialQP(ctx, da, remote(db, p), nil, p)
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != ReasonNoResources {
		t.Errorf("DialQP to a listener that cannot make the QP: %v, want a reject for no resources", err)
	}
	if err, ok := (<-accepted).(error); !ok || !strings.Contains(err.Error(), "AcceptQP") || !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("AcceptQP with a QP too large: %v, want an error of AcceptQP wrapping ErrInvalid", err)
	}
	if err := pdB.DeallocPD(); err != nil {
		t.Errorf("the PD after a failed AcceptQP: %v", err)
	}

	// An SRQ of another PD than the one given is refused before anything is made.
	pd1, _ := da.AllocPD()
	pd2, _ := da.AllocPD()
	srq, err := pd2.CreateSRQ(&verbs.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DialQP(ctx, da, remote(db, p), &QPConfig{PD: pd1, SRQ: srq}, p); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("DialQP with an SRQ of another PD: %v, want ErrInvalid", err)
	}
}

// Close reports an endpoint's own PD it cannot free because regions registered on it
// outside RegMR remain; and after the device was closed it has nothing to report.
func TestEndpointClose(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := acceptQPAsync(l, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := fast(nil)
	cli, err := DialQP(ctx, da, remote(db, p), nil, p)
	if err != nil {
		t.Fatalf("DialQP: %v", err)
	}
	srv, ok := (<-accepted).(*Endpoint)
	if !ok {
		t.Fatal("AcceptQP failed")
	}
	stray, err := cli.PD().RegMR(make([]byte, 8), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Close(); !errors.Is(err, verbs.ErrBusy) || !strings.Contains(err.Error(), "RegMR") {
		t.Errorf("Close with a region registered outside RegMR: %v, want ErrBusy naming RegMR", err)
	}
	stray.DeregMR()
	if err := cli.PD().DeallocPD(); err != nil {
		t.Errorf("the endpoint's PD once the stray region is gone: %v", err)
	}

	<-srv.Done()
	db.Close()
	if err := srv.Close(); err != nil {
		t.Errorf("Close after the device closed: %v, want nil", err)
	}
}

// An endpoint on a shared receive queue takes the SRQ's PD and its receives.
func TestAcceptQPOnSRQ(t *testing.T) {
	da, db := devs(t, verbs.DeviceConfig{})
	pd, _ := db.AllocPD()
	srq, err := pd.CreateSRQ(&verbs.SRQInitAttr{MaxWR: 8, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	inbox, _ := pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite)
	if err := srq.PostSRQRecv([]verbs.RecvWR{{WRID: 3, SGList: []verbs.SGE{inbox.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := acceptQPAsync(l, &QPConfig{SRQ: srq}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := fast(nil)
	cli, err := DialQP(ctx, da, remote(db, p), nil, p)
	if err != nil {
		t.Fatalf("DialQP: %v", err)
	}
	defer cli.Close()
	srv, ok := (<-accepted).(*Endpoint)
	if !ok {
		t.Fatal("AcceptQP on an SRQ failed")
	}
	defer srv.Close()
	if srv.PD() != pd {
		t.Errorf("the endpoint's PD is not the SRQ's")
	}
	buf, _ := cli.RegMR([]byte("via the SRQ"), verbs.AccessLocalWrite)
	if err := cli.QP().PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, SGList: []verbs.SGE{buf.SGE(0, buf.Len())}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, srv.CQ(), verbs.WCRecv); wc.WRID != 3 || string(inbox.Buf()[:wc.ByteLen]) != "via the SRQ" {
		t.Errorf("received WR %d %q", wc.WRID, inbox.Buf()[:wc.ByteLen])
	}
}
