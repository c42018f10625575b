package verbstest

import (
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/verbs"
)

// FanIn is N connections from a sending device (index 0, IPA) to a receiving device
// (index 1, IPB) whose QPs share one SRQ; each device has one PD and one CQ that all its
// QPs use for sends and receives.
type FanIn struct {
	Ctx  [2]*verbs.Device
	PD   [2]*verbs.PD
	CQ   [2]*verbs.CQ
	SRQ  *verbs.SRQ
	RQPs []*verbs.QP // on the SRQ (device 1)
	SQPs []*verbs.QP // their peers (device 0)
}

// FanInConfig says how NewFanIn builds a fan-in; every field is used as is.
type FanInConfig struct {
	N                int // connections
	SRQ              verbs.SRQInitAttr
	CQE              int // entries of each device's CQ
	Sender, Receiver verbs.DeviceConfig
	SendCap, RecvCap verbs.QPCap
	// Options connect both ends of every connection (QP.Connect); both Endpoints offer
	// Options.Ordering.
	Options verbs.ConnectOptions
	// PSN returns the first send PSNs of connection i's sender and receiver.
	PSN func(i int) (send, recv uint32)
}

// NewFanIn opens the two devices and connects cfg.N QP pairs.
func NewFanIn(t testing.TB, cfg FanInConfig) *FanIn {
	t.Helper()
	r := &FanIn{}
	for i, dc := range []verbs.DeviceConfig{cfg.Sender, cfg.Receiver} {
		r.Ctx[i] = OpenDevice(t, []netip.Addr{IPA, IPB}[i], dc)
		pd, err := r.Ctx[i].AllocPD()
		if err != nil {
			t.Fatalf("AllocPD: %v", err)
		}
		r.PD[i] = pd
		r.CQ[i] = MustCQ(t, r.Ctx[i], cfg.CQE, nil)
	}
	srq := cfg.SRQ
	var err error
	if r.SRQ, err = r.PD[1].CreateSRQ(&srq); err != nil {
		t.Fatalf("CreateSRQ: %v", err)
	}
	for i := 0; i < cfg.N; i++ {
		rq, err := r.PD[1].CreateQP(&verbs.QPInitAttr{SendCQ: r.CQ[1], RecvCQ: r.CQ[1], SRQ: r.SRQ, Cap: cfg.RecvCap})
		if err != nil {
			t.Fatalf("CreateQP (receiver %d): %v", i, err)
		}
		sq, err := r.PD[0].CreateQP(&verbs.QPInitAttr{SendCQ: r.CQ[0], RecvCQ: r.CQ[0], Cap: cfg.SendCap})
		if err != nil {
			t.Fatalf("CreateQP (sender %d): %v", i, err)
		}
		sp, rp := cfg.PSN(i)
		se, re := sq.Endpoint(sp), rq.Endpoint(rp)
		se.Ordering, re.Ordering = cfg.Options.Ordering, cfg.Options.Ordering
		if err := sq.Connect(sp, re, cfg.Options); err != nil {
			t.Fatalf("Connect (sender %d): %v", i, err)
		}
		if err := rq.Connect(rp, se, cfg.Options); err != nil {
			t.Fatalf("Connect (receiver %d): %v", i, err)
		}
		r.RQPs, r.SQPs = append(r.RQPs, rq), append(r.SQPs, sq)
	}
	return r
}
