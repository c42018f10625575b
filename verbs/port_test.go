package verbs_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// The active MTU follows the link's as Linux rxe derives it: 80 bytes of headers off the
// IP MTU, rounded down to a path MTU.
func TestActiveMTU(t *testing.T) {
	for _, c := range []struct {
		link int
		want verbs.MTU
	}{{576, verbs.MTU256}, {1280, verbs.MTU1024}, {1500, verbs.MTU1024}, {2000, verbs.MTU1024}, {2200, verbs.MTU2048},
		{4176, verbs.MTU4096}, {4175, verbs.MTU2048}, {9000, verbs.MTU4096}, {65536, verbs.MTU4096}} {
		if got := verbs.ActiveMTU(c.link); got != c.want {
			t.Errorf("link MTU %d: active MTU %d, want %d", c.link, got.Bytes(), c.want.Bytes())
		}
	}
}

// A device on loopback reports the loopback interface and the largest MTU; QueryPort
// knows only port 1; a closed device's port is down.
func TestQueryPort(t *testing.T) {
	dev := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	a, err := dev.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	if a.State != verbs.PortActive || a.ActiveMTU != verbs.MTU4096 || a.MaxMTU != verbs.MTU4096 || a.LinkLayer != "Ethernet" {
		t.Errorf("loopback port: %+v", a)
	}
	if a.LinkMTU < 4176 || a.Interface == "" {
		t.Errorf("loopback port: link %q of MTU %d", a.Interface, a.LinkMTU)
	}
	if _, err := dev.QueryPort(2); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("QueryPort(2): %v", err)
	}
	dev.Close()
	if a, _ := dev.QueryPort(1); a.State != verbs.PortDown {
		t.Errorf("closed device's port is %v", a.State)
	}
}

// A path MTU above the port's active MTU is refused with an error that names the link;
// the active MTU itself is taken.
func TestPathMTUAboveLink(t *testing.T) {
	a, b := verbstest.NewSides(t, verbstest.PairConfig{})
	verbs.SetLink(a.Ctx, "eth-test", 1500)
	err := a.QP.Connect(1, b.QP.Endpoint(2), verbs.ConnectOptions{MTU: verbs.MTU2048})
	if !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), "path MTU 2048 is above the port's active MTU 1024 (link MTU 1500 on eth-test)") {
		t.Fatalf("Connect at MTU 2048 over a 1500-byte link: %v", err)
	}
	if s := a.QP.State(); s != verbs.StateInit {
		t.Errorf("QP in %v after the refused RTR", s)
	}
	if err := a.QP.Connect(1, b.QP.Endpoint(2), verbs.ConnectOptions{MTU: verbs.MTU1024}); err != nil {
		t.Fatalf("Connect at the active MTU: %v", err)
	}
}
