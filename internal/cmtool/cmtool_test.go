package cmtool

import (
	"context"
	"flag"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

func TestExpandArgs(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Bool("s", false, "")
	fs.Bool("v", false, "")
	fs.Bool("V", false, "")
	fs.Int("C", 0, "")
	fs.String("a", "", "")
	fs.Bool("json", false, "")
	fs.String("dev-addr", "", "")
	cases := []struct{ in, want string }{
		{"-s -v -V -C 10 -a 1.2.3.4", "-s -v -V -C 10 -a 1.2.3.4"},
		{"-svV -C10 -a1.2.3.4", "-s -v -V -C 10 -a 1.2.3.4"},
		{"-svC10", "-s -v -C 10"},
		{"-svC 10", "-s -v -C 10"},
		{"-a -vV", "-a -vV"}, // a value, whatever it looks like
		{"--json --dev-addr -x -json", "--json --dev-addr -x -json"},
		{"-C=3 --dev-addr=1.2.3.4", "-C=3 --dev-addr=1.2.3.4"},
		{"-vx -- -vV", "-vx -- -vV"}, // unknown letters: left for flag to report
		{"word -vV", "word -v -V"},
	}
	for _, c := range cases {
		if got := ExpandArgs(fs, strings.Fields(c.in)); !slices.Equal(got, strings.Fields(c.want)) {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
	}
}

func TestLocalAddrFor(t *testing.T) {
	a, err := LocalAddrFor(netip.MustParseAddr("127.0.0.2"))
	if err != nil || !a.IsLoopback() {
		t.Errorf("%v %v", a, err)
	}
	if a, err := ResolveAddr("::ffff:10.0.0.1"); err != nil || a != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("%v %v", a, err)
	}
	if a, err := ResolveAddr("localhost"); err != nil || !a.IsLoopback() {
		t.Errorf("localhost: %v %v", a, err)
	}
}

// The Waiter sleeps on the channel and wakes for a completion that comes later, and
// hands out a batch one at a time.
func TestWaiter(t *testing.T) {
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr("127.0.0.1"), Port: verbs.AnyPort, Faults: &verbs.Faults{}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	ch, _ := dev.CreateCompChannel()
	cq, err := dev.CreateCQ(16, ch, 0)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cm.InitQP(qp, 0); err != nil {
		t.Fatal(err)
	}
	if err := qp.PostRecv([]verbs.RecvWR{{WRID: 1}, {WRID: 2}, {WRID: 3}}); err != nil {
		t.Fatal(err)
	}
	w := NewWaiter(cq)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := make(chan uint64, 3)
	go func() {
		for range 3 {
			wc, err := w.Next(ctx)
			if err != nil {
				close(got)
				return
			}
			got <- wc.WRID
		}
	}()
	// Moving the QP to ERR flushes the three receives while Next sleeps (or polls).
	if err := qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	for want := uint64(1); want <= 3; want++ {
		if id, ok := <-got; !ok || id != want {
			t.Fatalf("WRID %d (%v), want %d", id, ok, want)
		}
	}
	short, stop := context.WithCancel(ctx)
	stop()
	if _, err := w.Next(short); err == nil {
		t.Error("Next on an empty CQ with a cancelled context returned no error")
	}
}

func TestErrors(t *testing.T) {
	if m := Errors(verbs.Counters{Retransmits: 3, Duplicates: 2, Dropped: 1, NAKsReceived: 1}, cm.Counters{REQRetries: 1}); m != nil {
		t.Errorf("%v", m)
	}
	m := Errors(verbs.Counters{ICRCErrors: 1, NAKsReceived: 2, UnknownQP: 4}, cm.Counters{Dropped: 3})
	if got := ErrorsLine(m); got != "cm.Dropped=3 device.ICRCErrors=1 device.UnknownQP=4" {
		t.Errorf("%q", got)
	}
	m = Loss(verbs.Counters{ICRCErrors: 1, NAKsReceived: 2, Timeouts: 5}, cm.Counters{DREQRetries: 3})
	if got := ErrorsLine(m); got != "cm.DREQRetries=3 device.NAKsReceived=2 device.Timeouts=5" {
		t.Errorf("%q", got)
	}
	if got := ErrorsLine(nil); got != "none" {
		t.Errorf("%q", got)
	}
	if got := NonZero(cm.Counters{REQSent: 2, DREPSent: 1}); got != "REQSent=2 DREPSent=1" {
		t.Errorf("%q", got)
	}
}
