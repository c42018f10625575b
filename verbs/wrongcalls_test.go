package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/softrnic/softrnic/verbs"
)

// TestSGEOutsideRegion checks that a post refuses a scatter/gather element that does not
// lie within the region its key names (before it, after its end, a negative length, one
// too long for an SGE) with a *PostError naming the call, the work request and the SGE,
// wrapping ErrInvalid: the work requests before it are posted and complete, the refused
// one and those after it are not, and the QP stays in RTS (no local protection error
// completion, no QP in ERR). The same for PostSend (gather, scatter of a READ, inline),
// PostRecv and PostSRQRecv.
func TestSGEOutsideRegion(t *testing.T) {
	const size = 4096
	bad := []struct {
		name string
		sge  func(mr *verbs.MR) verbs.SGE
	}{
		{"SGE(-1, 10)", func(mr *verbs.MR) verbs.SGE { return mr.SGE(-1, 10) }},
		{"past the end", func(mr *verbs.MR) verbs.SGE { return mr.SGE(size-10, 11) }},
		{"at the end", func(mr *verbs.MR) verbs.SGE { return mr.SGE(size, 1) }},
		{"far past the end", func(mr *verbs.MR) verbs.SGE { return mr.SGE(1<<40, 8) }},
		{"negative length", func(mr *verbs.MR) verbs.SGE { return mr.SGE(0, -1) }},
		{"length above 2^32", func(mr *verbs.MR) verbs.SGE { return mr.SGE(0, 1<<32+8) }},
		{"literal before the start", func(mr *verbs.MR) verbs.SGE {
			return verbs.SGE{Addr: mr.Addr() - 8, Length: 8, LKey: mr.LKey()}
		}},
	}
	cp := verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}
	a, b := newPair(t, pairConfig{Cap: cp})
	local := mustReg(t, a.pd, pattern(size, 7), verbs.AccessLocalWrite)
	remote := mustReg(t, b.pd, make([]byte, size), allAccess)
	recvBuf := mustReg(t, b.pd, make([]byte, size), verbs.AccessLocalWrite)
	srq, err := b.pd.CreateSRQ(&verbs.SRQInitAttr{MaxWR: 8, MaxSGE: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srq.DestroySRQ() })
	write := func(id uint64, sg ...verbs.SGE) verbs.SendWR {
		return verbs.SendWR{WRID: id, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled, SGList: sg,
			RemoteAddr: remote.Addr(), RKey: remote.RKey()}
	}
	// wantRefused checks err: a *PostError of op for work request 1, SGE 1.
	wantRefused := func(t *testing.T, op string, err error) {
		t.Helper()
		var pe *verbs.PostError
		if !errors.As(err, &pe) || pe.Index != 1 || pe.Op != op {
			t.Fatalf("%s: %v, want a *PostError of %s for work request 1", op, err, op)
		}
		if !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("%s: %v does not wrap ErrInvalid", op, err)
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "verbs: "+op+": work request 1 refused") || !strings.Contains(msg, "SGE 1 ") {
			t.Errorf("%s: %q does not name the call, the work request and SGE 1", op, msg)
		}
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			t.Run("PostSend", func(t *testing.T) {
				err := a.qp.PostSend([]verbs.SendWR{write(1, local.SGE(0, 16)), write(2, local.SGE(0, 8), c.sge(local)), write(3, local.SGE(0, 16))})
				wantRefused(t, "PostSend", err)
				wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCRDMAWrite, a.qp)
				expectEmpty(t, a.scq, "send CQ after the refused work request")
				expectState(t, a.qp, verbs.StateRTS)
			})
			t.Run("PostSend READ", func(t *testing.T) {
				rd := write(2, local.SGE(0, 8), c.sge(local))
				rd.Opcode = verbs.WRRDMARead
				wantRefused(t, "PostSend", a.qp.PostSend([]verbs.SendWR{write(1, local.SGE(0, 16)), rd}))
				wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCRDMAWrite, a.qp)
				expectState(t, a.qp, verbs.StateRTS)
			})
			t.Run("PostSend inline", func(t *testing.T) {
				in := write(2, local.SGE(0, 8), c.sge(local))
				in.SendFlags |= verbs.SendInline
				wantRefused(t, "PostSend", a.qp.PostSend([]verbs.SendWR{write(1, local.SGE(0, 16)), in}))
				wantSendWC(t, pollOne(t, a.scq), 1, verbs.WCRDMAWrite, a.qp)
				expectState(t, a.qp, verbs.StateRTS)
			})
			t.Run("PostRecv", func(t *testing.T) {
				good := verbs.RecvWR{WRID: 1, SGList: []verbs.SGE{recvBuf.SGE(0, 64)}}
				wrong := verbs.RecvWR{WRID: 2, SGList: []verbs.SGE{recvBuf.SGE(0, 8), c.sge(recvBuf)}}
				wantRefused(t, "PostRecv", b.qp.PostRecv([]verbs.RecvWR{good, wrong}))
				// The receive before it was posted: a SEND lands in it.
				mustPostSend(t, a.qp, verbs.SendWR{WRID: 5, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(local, 0, 32)})
				wantSendWC(t, pollOne(t, a.scq), 5, verbs.WCSend, a.qp)
				if wc := pollOne(t, b.rcq); wc.WRID != 1 || wc.Status != verbs.WCSuccess || wc.ByteLen != 32 {
					t.Errorf("receive completion %+v, want WR 1 with 32 bytes", wc)
				}
				expectState(t, b.qp, verbs.StateRTS)
			})
			t.Run("PostSRQRecv", func(t *testing.T) {
				before := srq.Posted()
				good := verbs.RecvWR{WRID: 1, SGList: []verbs.SGE{recvBuf.SGE(0, 64)}}
				wrong := verbs.RecvWR{WRID: 2, SGList: []verbs.SGE{recvBuf.SGE(0, 8), c.sge(recvBuf)}}
				wantRefused(t, "PostSRQRecv", srq.PostSRQRecv([]verbs.RecvWR{good, wrong}))
				if got := srq.Posted(); got != before+1 {
					t.Errorf("SRQ holds %d receives, want %d (the one before the refused one)", got, before+1)
				}
			})
		})
	}
}

// wrongCall is a call a user makes on something closed or destroyed, and the name its
// error must start with ("verbs: NAME: ").
type wrongCall struct {
	op string
	fn func() error
}

// checkWrongCalls checks that every call's error wraps target and starts with
// prefix+op+": ".
func checkWrongCalls(t *testing.T, when string, prefix string, target error, calls []wrongCall) {
	t.Helper()
	for _, c := range calls {
		err := c.fn()
		if !errors.Is(err, target) {
			t.Errorf("%s after %s: %v, want an error wrapping %q", c.op, when, err, target)
			continue
		}
		if want := prefix + c.op + ": "; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s after %s: %q does not start with %q", c.op, when, err, want)
		}
	}
}

// TestWrongCalls checks the errors of the calls a user makes on destroyed objects and on
// a closed device: each wraps ErrClosed (never ErrInvalid: PostSend on a destroyed QP is
// not a state error) and names the call.
func TestWrongCalls(t *testing.T) {
	a, _ := newPair(t, pairConfig{})
	ch, err := a.ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	cq := mustCQ(t, a.ctx, 16, ch)
	buf := mustReg(t, a.pd, make([]byte, 64), verbs.AccessLocalWrite)
	srq, err := a.pd.CreateSRQ(&verbs.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	ah, err := a.pd.CreateAH(&verbs.AHAttr{DGID: verbs.GIDFromAddr(ipB)})
	if err != nil {
		t.Fatal(err)
	}
	sg := []verbs.SGE{buf.SGE(0, 8)}
	send := []verbs.SendWR{{WRID: 1, Opcode: verbs.WRSend, SGList: sg}}
	recv := []verbs.RecvWR{{WRID: 1, SGList: sg}}
	wc := make([]verbs.WorkCompletion, 1)
	bg := context.Background()

	for _, destroy := range []func() error{a.qp.DestroyQP, srq.DestroySRQ, ah.DestroyAH, buf.DeregMR, cq.DestroyCQ, ch.DestroyCompChannel} {
		if err := destroy(); err != nil {
			t.Fatal(err)
		}
	}
	checkWrongCalls(t, "the object was destroyed", "verbs: ", verbs.ErrClosed, []wrongCall{
		{"PostSend", func() error { return a.qp.PostSend(send) }},
		{"PostRecv", func() error { return a.qp.PostRecv(recv) }},
		{"ModifyQP", func() error { return a.qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateErr}, verbs.QPAttrState) }},
		{"DestroyQP", a.qp.DestroyQP},
		{"PostSRQRecv", func() error { return srq.PostSRQRecv(recv) }},
		{"ModifySRQ", func() error { return srq.ModifySRQ(&verbs.SRQAttr{SRQLimit: 1}, verbs.SRQAttrLimit) }},
		{"DestroySRQ", srq.DestroySRQ},
		{"DestroyAH", ah.DestroyAH},
		{"DeregMR", buf.DeregMR},
		{"ReqNotifyCQ", func() error { return cq.ReqNotifyCQ(false) }},
		{"CQ.Wait", func() error { _, err := cq.Wait(bg, wc); return err }},
		{"ResizeCQ", func() error { return cq.ResizeCQ(8) }},
		{"ModifyCQ", func() error { return cq.ModifyCQ(&verbs.CQAttr{}, verbs.CQAttrModeration) }},
		{"DestroyCQ", cq.DestroyCQ},
		{"GetCQEvent", func() error { _, err := ch.GetCQEvent(bg); return err }},
		{"DestroyCompChannel", ch.DestroyCompChannel},
	})

	if err := a.ctx.Close(); err != nil {
		t.Fatal(err)
	}
	checkWrongCalls(t, "Close", "verbs: ", verbs.ErrClosed, []wrongCall{
		{"PostSend", func() error { return a.qp.PostSend(send) }},
		{"AllocPD", func() error { _, err := a.ctx.AllocPD(); return err }},
		{"RegMR", func() error { _, err := a.pd.RegMR(make([]byte, 8), 0); return err }},
		{"CreateCQ", func() error { _, err := a.ctx.CreateCQ(4, nil, 0); return err }},
		{"CreateCompChannel", func() error { _, err := a.ctx.CreateCompChannel(); return err }},
		{"CreateQP", func() error {
			_, err := a.pd.CreateQP(&verbs.QPInitAttr{SendCQ: a.scq, RecvCQ: a.rcq, Cap: defaultCap})
			return err
		}},
		{"CreateSRQ", func() error { _, err := a.pd.CreateSRQ(&verbs.SRQInitAttr{MaxWR: 4}); return err }},
		{"CreateAH", func() error { _, err := a.pd.CreateAH(&verbs.AHAttr{DGID: verbs.GIDFromAddr(ipB)}); return err }},
		{"GetAsyncEvent", func() error { _, err := a.ctx.GetAsyncEvent(bg); return err }},
		{"CQ.Wait", func() error { _, err := a.scq.Wait(bg, wc); return err }},
		{"AddCompletionHandler", func() error { _, err := a.ctx.AddCompletionHandler(verbs.HandlerConfig{}); return err }},
		{"SetCompletionHandler", func() error { return a.ctx.SetCompletionHandler(0, nil) }},
	})
}

// TestPortClash checks that opening a device on an address and port another device holds
// fails with an error that says so and points to AnyPort.
func TestPortClash(t *testing.T) {
	first := openDevice(t, ipA, verbs.DeviceConfig{Port: verbs.AnyPort})
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: ipA, Port: int(first.Addr().Port())})
	if err == nil {
		dev.Close()
		t.Fatal("a second device opened on the first one's address and port")
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("%v does not wrap EADDRINUSE", err)
	}
	for _, want := range []string{"verbs: open device: ", "another device", first.Addr().String(), "AnyPort"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}

// bareNumber matches what fmt prints for an integer type without a String method.
var bareNumber = regexp.MustCompile(`^-?[0-9]+$`)

// TestEnumNames checks that every value of every enum and flag set of the package prints
// its name, and that a value outside it prints with its type, never as a bare number.
func TestEnumNames(t *testing.T) {
	named := []fmt.Stringer{
		verbs.WRRDMAWrite, verbs.WRRDMAWriteWithImm, verbs.WRSend, verbs.WRSendWithImm, verbs.WRRDMARead,
		verbs.WRAtomicCmpAndSwp, verbs.WRAtomicFetchAndAdd,
		verbs.WCSend, verbs.WCRDMAWrite, verbs.WCRDMARead, verbs.WCCompSwap, verbs.WCFetchAdd, verbs.WCRecv, verbs.WCRecvRDMAWithImm,
		verbs.WCSuccess, verbs.WCLocProtErr, verbs.WCRemAccessErr, verbs.WCGeneralErr,
		verbs.StateReset, verbs.StateInit, verbs.StateRTR, verbs.StateRTS, verbs.StateSQD, verbs.StateSQE, verbs.StateErr,
		verbs.QPTypeRC, verbs.QPTypeUD, verbs.OrderingOrdered, verbs.OrderingWeak,
		verbs.MTU256, verbs.MTU512, verbs.MTU1024, verbs.MTU2048, verbs.MTU4096,
		verbs.EventCQErr, verbs.EventQPFatal, verbs.EventQPReqErr, verbs.EventQPAccessErr, verbs.EventCommEst,
		verbs.EventSQDrained, verbs.EventDeviceFatal, verbs.EventSRQErr, verbs.EventSRQLimitReached, verbs.EventQPLastWQE,
		verbs.AccessLocalWrite, verbs.AccessRemoteWrite, verbs.AccessRemoteRead, verbs.AccessRemoteAtomic, verbs.AccessOnDemand,
		verbs.SendFence, verbs.SendSignaled, verbs.SendSolicited, verbs.SendInline,
		verbs.WCGRH, verbs.WCWithImm, verbs.CQAttrHandler, verbs.CQAttrModeration, verbs.SRQAttrMaxWR, verbs.SRQAttrLimit,
		verbs.QPAttrState, verbs.QPAttrAV, verbs.ZeroTimeout, verbs.ZeroMaxRdAtomic,
		verbs.AtomicNone, verbs.AtomicHCA, verbs.AtomicGlob, verbs.PortDown, verbs.PortActive,
		verbs.HardRNR, verbs.HardDrop, verbs.DecideBorrow, verbs.DecidePace,
		verbs.VendorBounds,
	}
	seen := map[string]fmt.Stringer{}
	for _, v := range named {
		s := v.String()
		if s == "" || bareNumber.MatchString(s) && fmt.Sprintf("%T", v) != "verbs.MTU" {
			t.Errorf("%T value %#v prints as %q", v, v, s)
		}
		if other, dup := seen[fmt.Sprintf("%T %s", v, s)]; dup {
			t.Errorf("%T values %#v and %#v both print as %q", v, v, other, s)
		}
		seen[fmt.Sprintf("%T %s", v, s)] = v
	}
	for _, c := range []struct {
		v    fmt.Stringer
		want string
	}{
		{verbs.WROpcode(44), "WROpcode(44)"},
		{verbs.MTU1024, "1024"},
		{verbs.MTU(9), "MTU(9)"},
		{verbs.AccessLocalWrite | verbs.AccessRemoteRead, "LOCAL_WRITE|REMOTE_READ"},
		{verbs.AccessFlags(0), "0"},
		{verbs.AccessFlags(0x1000) | verbs.AccessRemoteWrite, "REMOTE_WRITE|0x1000"},
		{verbs.SendSignaled | verbs.SendInline, "SIGNALED|INLINE"},
		{verbs.QPAttrMask(0), "0"},
		{verbs.AtomicCap(7), "AtomicCap(7)"},
	} {
		if got := c.v.String(); got != c.want {
			t.Errorf("%T(%#v).String() = %q, want %q", c.v, c.v, got, c.want)
		}
	}
}
