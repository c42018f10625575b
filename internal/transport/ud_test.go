package transport

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/wire"
)

// udSide is a device with one UD QP in RTS, Q_Key qkey.
func udSide(t testing.TB, ip string, qkey uint32) *side { return udSideCfg(t, ip, qkey, Config{}) }

// udSideCfg is udSide on a device with configuration cfg.
func udSideCfg(t testing.TB, ip string, qkey uint32, cfg Config) *side {
	t.Helper()
	s := openSide(t, ip, cfg)
	qp, err := s.d.CreateQP(QPConfig{Service: ServiceUD, PD: 1, SendCQ: s.cq, RecvCQ: s.cq, MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2})
	must(t, err)
	s.qp = qp
	udUp(t, qp, qkey)
	return s
}

// udUp brings a UD QP from RESET to RTS with Q_Key qkey.
func udUp(t testing.TB, qp *QP, qkey uint32) {
	t.Helper()
	must(t, qp.Modify(&Attr{State: StateInit, Port: 1, QKey: qkey}, MaskState|MaskPKeyIndex|MaskPort|MaskQKey, lim))
	must(t, qp.Modify(&Attr{State: StateRTR}, MaskState, lim))
	must(t, qp.Modify(&Attr{State: StateRTS, SQPSN: 0x123}, MaskState|MaskSQPSN, lim))
}

// A datagram arrives with the GRH area before its payload, the sender's QP number and the
// immediate; the send completes without an acknowledgement; a wrong Q_Key, a missing
// receive WQE and a buffer too small for GRH + payload are each handled as UD does.
func TestUDSendRecv(t *testing.T) {
	a, b := udSide(t, "127.0.0.1", 0x1111), udSide(t, "127.0.0.2", 0x2222)
	msg := bytes.Repeat([]byte("datagram"), 100) // 800 bytes
	src := make([]byte, 4096)
	copy(src, msg)
	dst := make([]byte, 8192)
	ms, md := reg(t, a.d, src), reg(t, b.d, dst)
	ah, err := a.d.NewAH(b.d.LocalAddr())
	must(t, err)
	post := func(qkey uint32, n int) {
		t.Helper()
		_, err := a.qp.PostSend([]SendWR{{WRID: 7, Opcode: WRSendImm, Imm: 0xfeed, Flags: FlagSignaled, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: qkey,
			SG: []SGE{{Addr: ms.IOVA(), Length: uint32(n), LKey: ms.Key()}}}})
		must(t, err)
		if c := waitCQE(t, a.cq, 1)[0]; c.Status != StatusSuccess || c.WRID != 7 {
			t.Fatalf("send completion %+v", c)
		}
	}
	recv := func(wrid uint64, off, n int) {
		t.Helper()
		_, err := b.qp.PostRecv([]RecvWR{{WRID: wrid, SG: []SGE{{Addr: md.IOVA() + uint64(off), Length: uint32(n), LKey: md.Key()}}}})
		must(t, err)
	}

	recv(1, 0, 4096)
	post(0x2222, len(msg))
	c := waitCQE(t, b.cq, 1)[0]
	if c.Status != StatusSuccess || c.WRID != 1 || c.SrcQP != a.qp.QPN() || c.ByteLen != uint32(GRHLen+len(msg)) ||
		c.Flags != WCFlagGRH|WCFlagWithImm || c.Imm != 0xfeed || c.Opcode != WCRecv {
		t.Fatalf("receive completion %+v", c)
	}
	if !bytes.Equal(dst[GRHLen:GRHLen+len(msg)], msg) {
		t.Fatal("payload not after the GRH area")
	}
	if src, ok := GRHSource(dst[:GRHLen]); !ok || src != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("GRH source %v %v", src, ok)
	}

	// The wrong Q_Key: dropped and counted, the receive WQE stays for the next datagram.
	recv(4, 0, 4096)
	post(0x3333, 16)
	// A controlled Q_Key (high bit) sends the QP's own, 0x1111: wrong for b too.
	post(0x80000000, 16)
	post(0x2222, 32)
	c = waitCQE(t, b.cq, 1)[0]
	if c.Status != StatusSuccess || c.ByteLen != GRHLen+32 {
		t.Fatalf("after Q_Key errors: %+v", c)
	}
	if s := b.qp.Stats(); s.QKeyErrors != 2 {
		t.Fatalf("Q_Key errors %d, want 2", s.QKeyErrors)
	}

	// No receive WQE: the datagram is dropped (then a posted one gets the next).
	dropped := b.qp.Stats().Dropped
	post(0x2222, 16)
	for deadline := time.Now().Add(testutil.WaitLimit); b.qp.Stats().Dropped == dropped; b.cq.Progress() {
		if time.Now().After(deadline) {
			t.Fatal("the datagram with no receive WQE was never dropped")
		}
	}
	recv(2, 0, 4096)
	post(0x2222, 48)
	if c = waitCQE(t, b.cq, 1)[0]; c.WRID != 2 || c.ByteLen != GRHLen+48 {
		t.Fatalf("after a drop: %+v", c)
	}

	// A buffer with no room for GRH + payload: local length error.
	recv(3, 0, GRHLen+10)
	post(0x2222, 11)
	if c = waitCQE(t, b.cq, 1)[0]; c.WRID != 3 || c.Status != StatusLocLenErr {
		t.Fatalf("short buffer: %+v", c)
	}
}

// What a UD QP refuses at post time, and what an RC QP refuses of UD.
func TestUDPostChecks(t *testing.T) {
	a := udSide(t, "127.0.0.1", 1)
	src := make([]byte, 8192)
	ms := reg(t, a.d, src)
	ah, err := a.d.NewAH(netip.MustParseAddrPort("127.0.0.2:4791"))
	must(t, err)
	for _, c := range []struct {
		wr   SendWR
		want string
	}{
		{SendWR{Opcode: WRWrite, AH: ah}, "not supported on a UD QP"},
		{SendWR{Opcode: WRSend}, "address handle"},
		{SendWR{Opcode: WRSend, AH: ah, RemoteQPN: 1 << 24}, "24 bits"},
		{SendWR{Opcode: WRSend, AH: ah, SG: []SGE{{Addr: ms.IOVA(), Length: 4097, LKey: ms.Key()}}}, "exceeds the MTU"},
	} {
		if _, err := a.qp.PostSend([]SendWR{c.wr}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.wr, err, c.want)
		}
	}
	rc := openSide(t, "127.0.0.3", Config{})
	b := openSide(t, "127.0.0.4", Config{})
	connectMode(t, rc, b, wire.MTU1024, 1, 2, Ordered)
	if _, err := rc.qp.PostSend([]SendWR{{Opcode: WRSend, AH: ah}}); err == nil || !strings.Contains(err.Error(), "address handle") {
		t.Errorf("RC with an AH: %v", err)
	}
	// The UD state table: RTR needs nothing, INIT needs a Q_Key.
	q, err := a.d.CreateQP(QPConfig{Service: ServiceUD, PD: 1, SendCQ: a.cq, RecvCQ: a.cq, MaxSendWR: 1, MaxRecvWR: 1})
	must(t, err)
	if err := q.Modify(&Attr{State: StateInit, Port: 1}, MaskState|MaskPKeyIndex|MaskPort, lim); err == nil || !strings.Contains(err.Error(), "QKEY") {
		t.Errorf("UD INIT without Q_Key: %v", err)
	}
}

// udRig is a rig whose QP is a UD QP in RTS, Q_Key 0x11111111, first PSN 0x100.
func udRig(t *testing.T) *qpRig {
	cfg := newRigConfig(Ordered)
	cfg.Service = ServiceUD
	return newQPRig(t, cfg)
}

// TestUDDatagramPacketization: each UD work request is one datagram to its address
// handle's address and QP, with the next PSN, a DETH with the Q_Key (the QP's own for a
// controlled one) and this QP's number, the immediate and the solicited bit; the send
// completes once the datagram was handed to the socket, with nothing to acknowledge it.
func TestUDDatagramPacketization(t *testing.T) {
	rg := udRig(t)
	src, ms := rg.mem(4096)
	copy(src, testutil.Pattern(4096, 8))
	to := netip.MustParseAddrPort("192.0.2.77:4791")
	ah, err := rg.d.NewAH(to)
	must(t, err)
	rg.post(SendWR{WRID: 1, Opcode: WRSendImm, Imm: 0xAB, Flags: FlagSignaled | FlagSolicited, AH: ah, RemoteQPN: 0x42, RemoteQKey: 0x7777, SG: []SGE{sge(ms, 0, 1000)}},
		SendWR{WRID: 2, Opcode: WRSend, Flags: FlagSignaled, AH: ah, RemoteQPN: 0x43, RemoteQKey: 0x80000000, SG: []SGE{sge(ms, 0, 3), sge(ms, 100, 2)}})
	p := rg.sent()
	wantSent(t, p, 0x100, wire.OpUDSendOnlyImm, wire.OpUDSendOnly)
	if p[0].to != to || p[0].BTH.DestQP != 0x42 || p[0].DETH != (wire.DETH{QKey: 0x7777, SrcQP: rg.qp.QPN()}) || p[0].Imm != 0xAB ||
		!p[0].BTH.SE || !bytes.Equal(p[0].Payload, src[:1000]) {
		t.Fatalf("first datagram to %v QP %#x, DETH %+v, imm %#x, SE %v", p[0].to, p[0].BTH.DestQP, p[0].DETH, p[0].Imm, p[0].BTH.SE)
	}
	if p[1].BTH.DestQP != 0x43 || p[1].DETH.QKey != 0x11111111 || !bytes.Equal(p[1].Payload, append(src[:3:3], src[100:102]...)) {
		t.Fatalf("second datagram QP %#x, Q_Key %#x (want the QP's own), payload %x", p[1].BTH.DestQP, p[1].DETH.QKey, p[1].Payload)
	}
	c := polled(rg.scq)
	wantStatuses(t, c, [2]uint64{1, 0}, [2]uint64{2, 0})
	if c[0].Opcode != WCSend || c[0].ByteLen != 1000 {
		t.Fatalf("send completion %+v", c[0])
	}
	// A work request whose memory failed its check at post time fails the QP, without a
	// datagram.
	rg.post(SendWR{WRID: 3, Opcode: WRSend, Flags: FlagSignaled, AH: ah, RemoteQPN: 0x42, RemoteQKey: 1,
		SG: []SGE{{Addr: ms.IOVA(), Length: 8, LKey: ms.Key() ^ 0x100}}})
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("sent %v for a work request with a bad key", p)
	}
	wantCQE(t, polled(rg.scq), 3, StatusLocProtErr, WCSend)
	if rg.qp.State() != StateErr {
		t.Fatalf("state %v", rg.qp.State())
	}
}

// TestUDReceiveErrors: what a UD QP makes of packets it does not take: an RC request or
// a response is the wrong service (counted), a response for a PSN never sent dropped;
// and a receive that fails locally (a buffer too small for GRH and payload) completes
// with its error and moves the QP to ERR, as RC does.
func TestUDReceiveErrors(t *testing.T) {
	rg := udRig(t)
	_, mb := rg.mem(4096)
	ah, err := rg.d.NewAH(rigPeer)
	must(t, err)
	rg.post(SendWR{WRID: 1, Opcode: WRSend, AH: ah, RemoteQPN: 0x42, RemoteQKey: 1})
	rg.sent()
	rg.postRecv(5, sge(mb, 0, GRHLen+4))
	rg.deliver(rigPkt{Op: wire.OpSendOnly, PSN: 1, Payload: []byte("rc")}, okAck(0x100), okAck(0x300))
	if s := rg.qp.Stats(); s.WrongMode != 2 || s.Dropped != 1 {
		t.Fatalf("RC request, response, response never sent: %+v", s)
	}
	udSend := func(n int) rigPkt {
		return rigPkt{Op: wire.OpUDSendOnly, PSN: 7, DETH: wire.DETH{QKey: 0x11111111, SrcQP: 0x99}, Payload: make([]byte, n)}
	}
	rg.deliver(udSend(5))
	c := wantCQE(t, polled(rg.rcq), 5, StatusLocLenErr, WCRecv)
	if c.VendorErr != VendorLength || c.SrcQP != 0x99 || c.SrcPort != rigPeer.Port() || rg.qp.State() != StateErr {
		t.Fatalf("receive completion %+v, state %v", c, rg.qp.State())
	}
}
