package verbs_test

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
	"github.com/softrnic/softrnic/verbs"
)

// forgedSend sends, from src (an address and port of the test's choosing), a valid RoCEv2
// SEND ONLY packet with payload to qp on dev at psn: what an attacker who knows the QP
// number and PSN can send from an ordinary UDP socket.
func forgedSend(t *testing.T, src netip.AddrPort, dev *verbs.Device, qp *verbs.QP, psn uint32, payload []byte) {
	t.Helper()
	uc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(src))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	op := wire.OpSendOnly
	pkt := make([]byte, op.Info().HdrLen, 64)
	bth := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: qp.QPNum(), PSN: wire.PSN(psn), AckReq: true,
		PadCnt: uint8(wire.PadFor(len(payload)))}
	bth.Put(pkt)
	pkt = append(pkt, payload...)
	pkt = append(pkt, make([]byte, wire.PadFor(len(payload)))...)
	sendRaw(t, uc, dev, pkt)
}

// sendRaw appends the ICRC to pkt (headers, payload and pad) as uc's address and port
// make it, and sends it from uc to dev.
func sendRaw(t testing.TB, uc *net.UDPConn, dev *verbs.Device, pkt []byte) {
	t.Helper()
	local := uc.LocalAddr().(*net.UDPAddr).AddrPort()
	f := wire.Flow{Src: local.Addr(), Dst: dev.Addr().Addr(), SrcPort: local.Port(), DstPort: dev.Addr().Port(), DF: true}
	var icrc [4]byte
	wire.PutICRC(icrc[:], f.ICRC(pkt))
	if _, err := uc.WriteToUDPAddrPort(append(pkt, icrc[:]...), dev.Addr()); err != nil {
		t.Error(err)
	}
}

// A connected QP accepts packets only from its peer's address and UDP port: a packet from
// the peer's IP address but another port — with the right QP number, PSN and ICRC — is
// dropped and counted (WrongSource), and the peer's own SEND then takes the receive.
func TestSourcePortChecked(t *testing.T) {
	a, b := newPair(t, pairConfig{PSNA: 0x100, PSNB: 0x200})
	dst := mustReg(t, a.pd, make([]byte, 64), verbs.AccessLocalWrite)
	mustPostRecv(t, a.qp, verbs.RecvWR{WRID: 1, SGList: sge(dst, 0, 64)})
	forgedSend(t, netip.AddrPortFrom(b.ctx.Addr().Addr(), 0), a.ctx, a.qp, 0x200, []byte("forged"))
	waitUntil(t, "the forged packet to arrive", func() bool {
		k := a.qp.Counters()
		return k.WrongSource+k.RxPackets > 0
	})
	if k := a.qp.Counters(); k.WrongSource != 1 {
		t.Errorf("forged packet from the peer's address and another port: WrongSource %d, RxPackets %d", k.WrongSource, k.RxPackets)
	}
	expectEmpty(t, a.rcq, "receive CQ after the forged SEND")

	src := mustReg(t, b.pd, []byte("genuine"), verbs.AccessLocalWrite)
	mustPostSend(t, b.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 7)})
	if wc := pollOne(t, a.rcq); wc.Status != verbs.WCSuccess || wc.ByteLen != 7 {
		t.Fatalf("receive completion %+v, want the genuine 7-byte SEND", wc)
	}
	settle(a.ctx)
	checkBytes(t, "receive buffer", dst.Buf()[:7], []byte("genuine"))
}

// ConnectOptions can ask for 0 where 0 means something (ZeroFields): no RNR retries makes
// the first RNR NAK fail the SEND, and QueryQP reports the zeros as given.
func TestConnectOptionsZero(t *testing.T) {
	a, b := newSides(t, pairConfig{CQE: 64})
	epA, epB := a.qp.Endpoint(verbs.RandomPSN()), b.qp.Endpoint(verbs.RandomPSN())
	o := verbs.ConnectOptions{MinRNRTimer: 1, Zero: verbs.ZeroTimeout | verbs.ZeroRNRRetry | verbs.ZeroRetryCnt}
	if err := a.qp.Connect(epA.PSN, epB, o); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(epB.PSN, epA, verbs.ConnectOptions{MinRNRTimer: 1}); err != nil {
		t.Fatal(err)
	}
	if attr, _ := a.qp.QueryQP(); attr.Timeout != 0 || attr.RNRRetry != 0 || attr.RetryCnt != 0 || attr.MaxRdAtomic != 16 {
		t.Errorf("QueryQP: timeout %d, rnr_retry %d, retry_cnt %d, max_rd_atomic %d; want 0, 0, 0 and the default 16",
			attr.Timeout, attr.RNRRetry, attr.RetryCnt, attr.MaxRdAtomic)
	}
	src := mustReg(t, a.pd, make([]byte, 8), verbs.AccessLocalWrite)
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 8)})
	wantStatus(t, pollOne(t, a.scq), 1, verbs.WCRNRRetryExcErr, a.qp) // b has no receive posted
	if got := a.qp.Counters().RNRNAKsReceived; got != 1 {
		t.Errorf("%d RNR NAKs received, want 1 (no retries)", got)
	}
}

// With Endpoint.AnySourcePort (a standard RoCEv2 peer, which sends each QP's packets from a
// source port of its own), the QP takes packets from any port of the peer's address.
func TestAnySourcePort(t *testing.T) {
	a, b := newSides(t, pairConfig{CQE: 64})
	epA, epB := a.qp.Endpoint(0x100), b.qp.Endpoint(0x200)
	epB.AnySourcePort = true
	if err := a.qp.Connect(epA.PSN, epB, verbs.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(epB.PSN, epA, verbs.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	if attr, _ := a.qp.QueryQP(); attr.AHAttr.SrcPort != 0 {
		t.Fatalf("AHAttr.SrcPort %d, want 0 (any)", attr.AHAttr.SrcPort)
	}
	dst := mustReg(t, a.pd, make([]byte, 64), verbs.AccessLocalWrite)
	mustPostRecv(t, a.qp, verbs.RecvWR{WRID: 1, SGList: sge(dst, 0, 64)})
	forgedSend(t, netip.AddrPortFrom(b.ctx.Addr().Addr(), 0), a.ctx, a.qp, 0x200, []byte("hashed"))
	if wc := pollOne(t, a.rcq); wc.Status != verbs.WCSuccess || wc.ByteLen != 6 {
		t.Fatalf("receive completion %+v, want the 6-byte SEND from another port of the peer's address", wc)
	}
	settle(a.ctx)
	checkBytes(t, "receive buffer", dst.Buf()[:6], []byte("hashed"))
	if k := a.qp.Counters(); k.WrongSource != 0 {
		t.Errorf("WrongSource %d", k.WrongSource)
	}
}

// An independent peer's requests: scapy builds RC SENDs whose ICRCs cover IPv4 headers
// with random nonzero identifications (as Linux rxe sends them); sent from an ordinary UDP
// socket to a QP connected to a standard peer at that socket's address, every one is
// accepted and delivered.
func TestScapyRequestsAnyIdentification(t *testing.T) {
	a, b := newSides(t, pairConfig{CQE: 64})
	uc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.ctx.Addr().Addr(), 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	peer := uc.LocalAddr().(*net.UDPAddr).AddrPort()
	epA, epB := a.qp.Endpoint(0x100), b.qp.Endpoint(0x200)
	epB.AnySourcePort = true // a standard peer: packets come from the socket's own port
	if err := a.qp.Connect(epA.PSN, epB, verbs.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	const n = 16
	dst := mustReg(t, a.pd, make([]byte, n*64), verbs.AccessLocalWrite)
	for i := 0; i < n; i++ {
		mustPostRecv(t, a.qp, verbs.RecvWR{WRID: uint64(i), SGList: sge(dst, i*64, 64)})
	}
	pkts := wiretest.ScapySends(t, peer, a.ctx.Addr(), a.qp.QPNum(), 0x200, n)
	nonzero := 0
	for _, p := range pkts {
		if p.IPID != 0 {
			nonzero++
		}
		if _, err := uc.WriteToUDPAddrPort(p.Payload, a.ctx.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	if nonzero == 0 {
		t.Fatal("scapy gave every packet identification 0")
	}
	for i := 0; i < n; i++ {
		wc := pollOne(t, a.rcq)
		if wc.Status != verbs.WCSuccess || wc.ByteLen != 32 || wc.WRID != uint64(i) {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	settle(a.ctx)
	for i := 0; i < n; i++ {
		checkBytes(t, "receive buffer", dst.Buf()[i*64:i*64+32], bytes.Repeat([]byte{byte(i + 1)}, 32))
	}
	if k := a.ctx.Counters(); k.ICRCErrors != 0 {
		t.Errorf("%d ICRC errors", k.ICRCErrors)
	}
}

// Datagrams shorter than any RoCEv2 packet (BTH and ICRC: 16 bytes), empty ones and
// doorbell-sized ones included, from another socket are malformed, not ICRC errors, and
// none of them wakes or disturbs the device: a real packet after them is taken.
func TestShortDatagramsMalformed(t *testing.T) {
	a, b := defaultPair(t)
	uc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ipA, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	before := b.ctx.Counters()
	const short = wire.BTHLen + wire.ICRCLen
	for n := 0; n < short; n++ {
		if _, err := uc.WriteToUDPAddrPort(bytes.Repeat([]byte{0xA5}, n), b.ctx.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the short datagrams counted", func() bool {
		driveProgress()
		return b.ctx.Counters().Malformed-before.Malformed >= short
	})
	if k := b.ctx.Counters(); k.Malformed-before.Malformed != short || k.ICRCErrors != before.ICRCErrors {
		t.Fatalf("malformed %d (want %d), ICRC errors %d", k.Malformed-before.Malformed, short, k.ICRCErrors-before.ICRCErrors)
	}
	src := mustReg(t, a.pd, pattern(32, 1), verbs.AccessLocalWrite)
	dst := mustReg(t, b.pd, make([]byte, 32), verbs.AccessLocalWrite)
	mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 7, SGList: sge(dst, 0, 32)})
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 8, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 32)})
	if wc := pollOne(t, b.rcq); wc.Status != verbs.WCSuccess || wc.WRID != 7 {
		t.Fatalf("receive after the short datagrams: %+v", wc)
	}
	checkBytes(t, "received", dst.Buf(), src.Buf())
}
