package verbs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// After Close, every goroutine waiting on the device (GetCQEvent, GetAsyncEvent, CQ.Wait)
// is woken with ErrClosed, and every call on it or its objects returns an error wrapping
// ErrClosed: nothing blocks, nothing reports success.
func TestCloseWakesWaitersAndRefusesCalls(t *testing.T) {
	a, _ := newPair(t, pairConfig{})
	ch, err := a.ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	cq := mustCQ(t, a.ctx, 16, ch)
	if err := cq.ReqNotifyCQ(false); err != nil {
		t.Fatal(err)
	}
	buf := mustReg(t, a.pd, make([]byte, 64), verbs.AccessLocalWrite)
	srq, err := a.pd.CreateSRQ(&verbs.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}

	errs := make(chan error, 3)
	go func() { _, err := ch.GetCQEvent(context.Background()); errs <- err }()
	go func() { _, err := a.ctx.GetAsyncEvent(context.Background()); errs <- err }()
	go func() {
		_, err := a.scq.Wait(context.Background(), make([]verbs.WorkCompletion, 1))
		errs <- err
	}()
	if err := a.ctx.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wantWoken(t, errs, 3, "Close")

	sg := []verbs.SGE{buf.SGE(0, 8)}
	calls := map[string]error{
		"PostSend":    a.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.WRSend, SGList: sg}}),
		"PostRecv":    a.qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: sg}}),
		"PostSRQRecv": srq.PostSRQRecv([]verbs.RecvWR{{WRID: 1, SGList: sg}}),
	}
	_, calls["AllocPD"] = a.ctx.AllocPD()
	_, calls["RegMR"] = a.pd.RegMR(make([]byte, 8), verbs.AccessLocalWrite)
	_, calls["CreateCQ"] = a.ctx.CreateCQ(4, nil, 0)
	_, calls["CreateCompChannel"] = a.ctx.CreateCompChannel()
	_, calls["CreateQP"] = a.pd.CreateQP(&verbs.QPInitAttr{SendCQ: a.scq, RecvCQ: a.rcq, Cap: defaultCap})
	_, calls["Wait"] = cq.Wait(context.Background(), make([]verbs.WorkCompletion, 1))
	for name, err := range calls {
		if !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("%s after Close: %v, want an error wrapping ErrClosed", name, err)
		}
	}
}

// DestroyCompChannel wakes every goroutine waiting on the channel, not just one.
func TestDestroyCompChannelWakesAll(t *testing.T) {
	ctx := openDevice(t, ipA, verbs.DeviceConfig{})
	ch, err := ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		go func() { _, err := ch.GetCQEvent(context.Background()); errs <- err }()
	}
	if err := ch.DestroyCompChannel(); err != nil {
		t.Fatal(err)
	}
	wantWoken(t, errs, 4, "DestroyCompChannel")
}

// wantWoken checks that n waiters return ErrClosed on errs after what woke them.
func wantWoken(t *testing.T, errs <-chan error, n int, what string) {
	t.Helper()
	guard := time.After(waitLimit)
	for i := 0; i < n; i++ {
		select {
		case err := <-errs:
			if !errors.Is(err, verbs.ErrClosed) {
				t.Errorf("a waiter returned %v after %s, want ErrClosed", err, what)
			}
		case <-guard:
			t.Fatalf("%d of %d waiters still blocked %v after %s", n-i, n, waitLimit, what)
		}
	}
}
