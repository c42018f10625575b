package verbs_test

import (
	"log/slog"
	"slices"
	"strconv"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// TestQPsListsLiveQPs checks that Device.QPs lists the QPs CreateQP made and not those
// destroyed, and that QP.SRQ names the SRQ a QP was created with.
func TestQPsListsLiveQPs(t *testing.T) {
	dev := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	s := verbstest.NewSide(t, dev, verbstest.SideConfig{Cap: verbstest.DefaultCap, CQE: 64})
	srq, err := s.PD.CreateSRQ(&verbs.SRQInitAttr{MaxWR: 16, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	onSRQ, err := s.PD.CreateQP(&verbs.QPInitAttr{SendCQ: s.SCQ, RecvCQ: s.RCQ, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := s.PD.CreateQP(&verbs.QPInitAttr{SendCQ: s.SCQ, RecvCQ: s.RCQ, Cap: verbstest.DefaultCap})
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.DestroyQP(); err != nil {
		t.Fatal(err)
	}
	var got []uint32
	for _, q := range dev.QPs() {
		got = append(got, q.QPNum())
	}
	slices.Sort(got)
	want := []uint32{s.QP.QPNum(), onSRQ.QPNum()}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("QPs: %v, want %v", got, want)
	}
	if onSRQ.SRQ() != srq || s.QP.SRQ() != nil {
		t.Errorf("SRQ: %p and %p, want %p and nil", onSRQ.SRQ(), s.QP.SRQ(), srq)
	}
	if err := onSRQ.DestroyQP(); err != nil {
		t.Fatal(err)
	}
	if ids := dev.CompletionHandlers(); len(ids) != dev.QueryDevice().NumCompVectors || len(ids) > 0 && ids[0] != 0 {
		t.Errorf("CompletionHandlers: %v, want 0..%d", ids, dev.QueryDevice().NumCompVectors-1)
	}
}

// TestLoggerQPError checks that a device with a Logger logs a QP whose retries ran out
// (the peer's device closed), at Warn, naming both ends and the reason.
func TestLoggerQPError(t *testing.T) {
	rec := testutil.NewLogRecorder()
	a, b := verbstest.NewPair(t, verbstest.PairConfig{Link: fastLink(0, 7), DevA: verbs.DeviceConfig{Logger: rec.Logger()}})
	buf := verbstest.MustReg(t, a.PD, make([]byte, 64), verbs.AccessLocalWrite)
	bAddr, bQPN := b.Ctx.Addr(), b.QP.QPNum()
	if err := b.Ctx.Close(); err != nil {
		t.Fatal(err)
	}
	verbstest.MustPostSend(t, a.QP, verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: verbstest.SGL(buf, 0, 8)})
	verbstest.WantStatus(t, verbstest.PollOne(t, a.SCQ), 1, verbs.WCRetryExcErr, a.QP)
	r := rec.Wait(t, "verbs: QP entered the error state")
	want := map[string]string{"local": a.Ctx.Addr().String(), "qpn": strconv.Itoa(int(a.QP.QPNum())),
		"remote": bAddr.String(), "remote_qpn": strconv.Itoa(int(bQPN)), "reason": verbs.WCRetryExcErr.String()}
	for k, v := range want {
		if r.Attrs[k] != v {
			t.Errorf("%s=%q, want %q (record %v)", k, r.Attrs[k], v, r)
		}
	}
	if r.Level != slog.LevelWarn {
		t.Errorf("level %v, want Warn", r.Level)
	}
}
