package cm

import (
	"errors"
	"log/slog"
	"net/netip"
	"strconv"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// TestLogConnectionEvents checks the records each side's device logger gets: a request to
// a port with no listener rejected (Warn on both sides), a connection established (Info
// on both sides, naming both QPs), and closed (Info: by this side on one, by the peer on
// the other).
func TestLogConnectionEvents(t *testing.T) {
	recA, recB := testutil.NewLogRecorder(), testutil.NewLogRecorder()
	devA := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{Logger: recA.Logger()})
	devB := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{Logger: recB.Logger()})
	a, b := newEndpoint(t, devA, 1), newEndpoint(t, devB, 1)

	p := fast(nil)
	to := remote(devB, p)
	nowhere := netip.AddrPortFrom(to.Addr(), testPort+1)
	l, err := ListenUD(devB, testPort+2) // B's connection manager runs, with no listener on the port dialled
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := Dial(testutil.Context(t), devA, nowhere, a.QP, p); !errors.Is(err, ErrNoListener) {
		t.Fatalf("Dial to a port with no listener: %v, want ErrNoListener", err)
	}
	want := func(r testutil.LogRecord, level slog.Level, attrs map[string]string) {
		t.Helper()
		if r.Level != level {
			t.Errorf("%q: level %v, want %v", r.Msg, r.Level, level)
		}
		for k, v := range attrs {
			if r.Attrs[k] != v {
				t.Errorf("%q: %s=%q, want %q (record %v)", r.Msg, k, r.Attrs[k], v, r)
			}
		}
	}
	qpn := func(qp *verbs.QP) string { return strconv.Itoa(int(qp.QPNum())) }
	reason := ReasonInvalidServiceID.String()
	want(recA.Wait(t, evRejected), slog.LevelWarn, map[string]string{"local": devA.Addr().String(), "remote": devB.Addr().String(), "qpn": qpn(a.QP), "reason": reason})
	want(recB.Wait(t, evRejectedRequest), slog.LevelWarn, map[string]string{"local": devB.Addr().String(), "remote": devA.Addr().String(), "remote_qpn": qpn(a.QP), "reason": reason})

	ca, _ := handshake(t, a, b, p, nil)
	want(recA.Wait(t, evEstablished), slog.LevelInfo, map[string]string{"local": devA.Addr().String(), "remote": devB.Addr().String(), "qpn": qpn(a.QP), "remote_qpn": qpn(b.QP)})
	want(recB.Wait(t, evEstablished), slog.LevelInfo, map[string]string{"local": devB.Addr().String(), "remote": devA.Addr().String(), "qpn": qpn(b.QP), "remote_qpn": qpn(a.QP)})
	if err := ca.Disconnect(); err != nil {
		t.Fatal(err)
	}
	want(recA.Wait(t, evClosed), slog.LevelInfo, map[string]string{"qpn": qpn(a.QP), "reason": "disconnected by this side"})
	want(recB.Wait(t, evClosed), slog.LevelInfo, map[string]string{"qpn": qpn(b.QP), "reason": "disconnected by the peer"})
}

// TestLogDialParamsLogger checks that DialParams.Logger takes the place of the device's
// for the connection's events.
func TestLogDialParamsLogger(t *testing.T) {
	recDev, recDial := testutil.NewLogRecorder(), testutil.NewLogRecorder()
	devA := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{Logger: recDev.Logger()})
	devB := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	a, b := newEndpoint(t, devA, 1), newEndpoint(t, devB, 1)
	p := fast(nil)
	p.Logger = recDial.Logger()
	handshake(t, a, b, p, nil)
	recDial.Wait(t, evEstablished)
	if rs := recDev.Records(); len(rs) != 0 {
		t.Errorf("the device's logger got %v, want nothing", rs)
	}
}
