package verbs_test

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// udRig is two devices with a PD and a CQ each.
type udRig struct {
	ctx [2]*verbs.Device
	pd  [2]*verbs.PD
	cq  [2]*verbs.CQ
}

func newUDRig(t *testing.T) *udRig {
	r := &udRig{}
	for i, ip := range []netip.Addr{verbstest.IPA, verbstest.IPB} {
		r.ctx[i] = verbstest.OpenDevice(t, ip, verbs.DeviceConfig{})
		var err error
		if r.pd[i], err = r.ctx[i].AllocPD(); err != nil {
			t.Fatal(err)
		}
		r.cq[i] = verbstest.MustCQ(t, r.ctx[i], 256, nil)
	}
	return r
}

func (r *udRig) ah(t *testing.T, from, to int) *verbs.AH {
	t.Helper()
	a := r.ctx[to].Addr()
	ah, err := r.pd[from].CreateAH(&verbs.AHAttr{DGID: verbs.GIDFromAddr(a.Addr()), DestPort: a.Port(), PortNum: 1})
	if err != nil {
		t.Fatal(err)
	}
	return ah
}

// One UD QP sends datagrams to two QPs on another device through one address handle;
// each arrives after the 40-byte GRH area, names the sender's QP and device (ParseGRH and
// SrcPort),
// carries its immediate; a datagram with the wrong Q_Key is dropped and counted.
func TestUDSendRecv(t *testing.T) {
	r := newUDRig(t)
	sender := verbstest.NewUDQP(t, r.pd[0], r.cq[0], 0x11)
	recv := []*verbs.QP{verbstest.NewUDQP(t, r.pd[1], r.cq[1], 0x22), verbstest.NewUDQP(t, r.pd[1], r.cq[1], 0x33)}
	src := verbstest.MustReg(t, r.pd[0], testutil.Pattern(4096, 7), 0)
	dst := verbstest.MustReg(t, r.pd[1], make([]byte, 4*8192), verbs.AccessLocalWrite)
	for i, q := range recv {
		verbstest.MustPostRecv(t, q, verbs.RecvWR{WRID: uint64(100 + i), SGList: verbstest.SGL(dst, i*8192, 8192)})
	}
	ah := r.ah(t, 0, 1)
	for i, q := range recv {
		verbstest.MustPostSend(t, sender, verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSendWithImm, SendFlags: verbs.SendSignaled, ImmData: uint32(0xabc0 + i),
			SGList: verbstest.SGL(src, 0, 1000+i), AH: ah, RemoteQPN: q.QPNum(), RemoteQKey: []uint32{0x22, 0x33}[i]})
	}
	for i := range recv {
		verbstest.WantSendWC(t, verbstest.PollOne(t, r.cq[0]), uint64(i), verbs.WCSend, sender)
	}
	for _, wc := range verbstest.PollN(t, r.cq[1], 2) {
		i := int(wc.WRID) - 100
		if wc.Status != verbs.WCSuccess || wc.SrcQP != sender.QPNum() || wc.QPNum != recv[i].QPNum() || wc.ByteLen != uint32(verbs.GRHLen+1000+i) ||
			wc.WCFlags != verbs.WCGRH|verbs.WCWithImm || wc.ImmData != uint32(0xabc0+i) {
			t.Fatalf("datagram %d: %+v", i, wc)
		}
		buf := dst.Buf()[i*8192:]
		if gid, ok := verbs.ParseGRH(buf[:verbs.GRHLen]); !ok || gid != verbs.GIDFromAddr(verbstest.IPA) {
			t.Errorf("datagram %d: GRH source %v %v", i, gid, ok)
		}
		if wc.SrcPort != r.ctx[0].Addr().Port() {
			t.Errorf("datagram %d: source port %d, want the sending device's %d", i, wc.SrcPort, r.ctx[0].Addr().Port())
		}
		if !bytes.Equal(buf[verbs.GRHLen:verbs.GRHLen+1000+i], src.Buf()[:1000+i]) {
			t.Errorf("datagram %d: payload differs", i)
		}
	}
	// The wrong Q_Key: dropped; the WQE waits for the next datagram.
	verbstest.MustPostRecv(t, recv[0], verbs.RecvWR{WRID: 200, SGList: verbstest.SGL(dst, 2*8192, 8192)})
	for _, qkey := range []uint32{0x33, 0x22} {
		verbstest.MustPostSend(t, sender, verbs.SendWR{WRID: 9, Opcode: verbs.WRSend, SGList: verbstest.SGL(src, 0, 8), AH: ah, RemoteQPN: recv[0].QPNum(), RemoteQKey: qkey})
	}
	if wc := verbstest.PollOne(t, r.cq[1]); wc.WRID != 200 || wc.ByteLen != verbs.GRHLen+8 {
		t.Fatalf("after a Q_Key error: %+v", wc)
	}
	if n := recv[0].Counters().QKeyErrors; n != 1 {
		t.Fatalf("QKeyErrors %d, want 1", n)
	}
}

// What UD refuses: verbs that need a peer, RC operations, datagrams larger than the MTU,
// posts without or with a destroyed address handle; the UD state table; QP0 and QP1
// are never handed out.
func TestUDErrors(t *testing.T) {
	r := newUDRig(t)
	qp := verbstest.NewUDQP(t, r.pd[0], r.cq[0], 1)
	src := verbstest.MustReg(t, r.pd[0], make([]byte, 8192), 0)
	ah := r.ah(t, 0, 1)
	cases := []struct {
		wr   verbs.SendWR
		want string
	}{
		{verbs.SendWR{Opcode: verbs.WRRDMAWrite, AH: ah}, "not supported on a UD QP"},
		{verbs.SendWR{Opcode: verbs.WRSend}, "address handle"},
		{verbs.SendWR{Opcode: verbs.WRSend, AH: ah, SGList: verbstest.SGL(src, 0, 4097)}, "exceeds the MTU"},
	}
	for _, c := range cases {
		if err := qp.PostSend([]verbs.SendWR{c.wr}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.wr, err, c.want)
		}
	}
	other, err := r.ctx[0].AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	ah2, err := other.CreateAH(&verbs.AHAttr{DGID: verbs.GIDFromAddr(verbstest.IPB)})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, AH: ah2}}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("AH of another PD: %v", err)
	}
	if err := ah.DestroyAH(); err != nil {
		t.Fatal(err)
	}
	if err := qp.PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, AH: ah}}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("destroyed AH: %v", err)
	}
	if err := ah.DestroyAH(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("DestroyAH twice: %v", err)
	}
	if _, err := r.pd[0].CreateAH(&verbs.AHAttr{}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("AH without a GID: %v", err)
	}
	if err := qp.Connect(1, verbs.Endpoint{}, verbs.ConnectOptions{}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("Connect on UD: %v", err)
	}
	q2, err := r.pd[0].CreateQP(&verbs.QPInitAttr{QPType: verbs.QPTypeUD, SendCQ: r.cq[0], RecvCQ: r.cq[0], Cap: verbstest.DefaultCap})
	if err != nil {
		t.Fatal(err)
	}
	if q2.QPNum() < 2 || qp.QPNum() < 2 {
		t.Errorf("QP numbers %d, %d: QP0 and QP1 are reserved", q2.QPNum(), qp.QPNum())
	}
	if err := q2.ModifyQP(&verbs.QPAttr{QPState: verbs.StateInit, PortNum: 1}, verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort); err == nil || !strings.Contains(err.Error(), "QKEY") {
		t.Errorf("UD INIT without a Q_Key: %v", err)
	}
	if err := q2.ModifyQP(&verbs.QPAttr{QPState: verbs.StateInit, PortNum: 1, QKey: 5, QPAccessFlags: verbs.AccessRemoteWrite},
		verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrQKey|verbs.QPAttrAccessFlags); err == nil {
		t.Error("UD INIT took access flags")
	}
	if _, err := r.pd[0].CreateQP(&verbs.QPInitAttr{QPType: 3, SendCQ: r.cq[0], RecvCQ: r.cq[0], Cap: verbstest.DefaultCap}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("QP type 3: %v", err)
	}
	// An RC QP takes no address handle.
	a, _ := newPair(t, pairConfig{})
	ah3, err := a.pd.CreateAH(&verbs.AHAttr{DGID: verbs.GIDFromAddr(verbstest.IPB)})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.WRSend, AH: ah3}}); err == nil || !strings.Contains(err.Error(), "address handle") {
		t.Errorf("RC with an AH: %v", err)
	}
}
