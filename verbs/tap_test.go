package verbs_test

import (
	"encoding/binary"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
	"github.com/softrnic/softrnic/verbs"
)

// TestPcapTap captures device A's link (DeviceConfig.PcapFile) while it SENDs, WRITEs
// 256 KiB (GSO batches), READs and runs an atomic, and checks the capture three ways:
// every packet's ICRC verifies, exactly, over the IPv4 header it carries (GSO segments
// carry identifications 1, 2, ...); tshark's InfiniBand dissector finds nothing
// malformed; scapy's ICRC agrees on every packet. (Without UDP GSO, as on systems other
// than Linux, every packet goes alone, with identification 0.)
func TestPcapTap(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a.pcap")
	a, b := verbstest.NewPair(t, verbstest.PairConfig{
		Options: &verbs.ConnectOptions{MTU: verbs.MTU4096},
		DevA:    verbs.DeviceConfig{Port: verbs.AnyPort, PcapFile: file},
		DevB:    verbs.DeviceConfig{Port: verbs.AnyPort},
	})
	src, dst := make([]byte, 256<<10), make([]byte, 256<<10)
	for i := range src {
		src[i] = byte(i * 7)
	}
	acc := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	ms, md := verbstest.MustReg(t, a.PD, src, acc), verbstest.MustReg(t, b.PD, dst, acc)
	if err := b.QP.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{md.SGE(0, 4096)}}}); err != nil {
		t.Fatal(err)
	}
	wrs := []verbs.SendWR{
		{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: []verbs.SGE{ms.SGE(0, 100)}},
		{WRID: 2, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled, SGList: []verbs.SGE{ms.SGE(0, len(src))},
			RemoteAddr: md.Addr(), RKey: md.RKey()},
		{WRID: 3, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled, SGList: []verbs.SGE{ms.SGE(0, 64<<10)},
			RemoteAddr: md.Addr(), RKey: md.RKey()},
		{WRID: 4, Opcode: verbs.WRAtomicFetchAndAdd, SendFlags: verbs.SendSignaled, SGList: []verbs.SGE{ms.SGE(0, 8)},
			RemoteAddr: md.Addr() + 8, RKey: md.RKey(), CompareAdd: 1},
	}
	if err := a.QP.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	for _, wc := range verbstest.PollN(t, a.SCQ, len(wrs)) {
		if wc.Status != verbs.WCSuccess {
			t.Fatalf("completion %+v", wc)
		}
	}
	verbstest.PollN(t, b.RCQ, 1)
	portA, portB := a.Ctx.Addr().Port(), b.Ctx.Addr().Port()
	gsoSends := a.Ctx.Counters().GSOSends // none where the system has no UDP GSO
	if err := a.Ctx.Close(); err != nil { // flushes the capture
		t.Fatal(err)
	}

	recs := wiretest.ReadCapture(t, file)
	sent, received, segments := 0, 0, 0
	for i, r := range recs {
		ip := r.Data
		if len(ip) < 28 || ip[0] != 0x45 || ip[9] != 17 {
			t.Fatalf("record %d is not IPv4/UDP", i)
		}
		id := binary.BigEndian.Uint16(ip[4:])
		srcAP := netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(ip[20:]))
		dstAP := netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(ip[22:]))
		fl := wire.Flow{Src: srcAP.Addr(), Dst: dstAP.Addr(), SrcPort: srcAP.Port(), DstPort: dstAP.Port(), DF: ip[6]&0x40 != 0, IPID: id}
		if !fl.VerifyICRC(ip[28:]) {
			t.Errorf("record %d (%v -> %v, identification %d): the ICRC does not verify over the header it carries", i, srcAP, dstAP, id)
		}
		switch {
		case srcAP == a.Ctx.Addr():
			sent++
		case dstAP == a.Ctx.Addr():
			received++
		}
		if id != 0 {
			segments++
		}
	}
	if sent < 64 || received < 16 || (segments > 0) != (gsoSends > 0) {
		t.Errorf("%d packets sent, %d received, %d with a nonzero identification (GSO segments) in %d GSO sends", sent, received, segments, gsoSends)
	}
	t.Logf("%d packets sent, %d received, %d of them with a nonzero identification (GSO segments)", sent, received, segments)
	run := wiretest.TsharkFile(t, file, portA, portB)
	wiretest.NoMalformed(t, run)
	if n := wiretest.ScapyICRC(t, file, portA, portB); n != len(recs) {
		t.Errorf("scapy checked %d of %d packets", n, len(recs))
	}
}

// A QP connected to a peer that takes any source port (a standard RoCEv2 peer:
// Endpoint.AnySourcePort) sends every packet from a UDP port of its own, one of the
// device's SourcePorts, as the capture shows; a QP of the same device connected to a
// softrnic peer (which checks the port) sends from the device's port.
func TestSourcePortPerQP(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a.pcap")
	a, b := newSides(t, pairConfig{CQE: 64, DevA: verbs.DeviceConfig{Port: verbs.AnyPort, PcapFile: file}})
	epA, epB := a.qp.Endpoint(0x100), b.qp.Endpoint(0x200)
	epA.AnySourcePort, epB.AnySourcePort = true, true
	if err := a.qp.Connect(epA.PSN, epB, verbs.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(epB.PSN, epA, verbs.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	srcPort := a.qp.SourcePort()
	if srcPort == a.ctx.Addr().Port() {
		t.Fatalf("QP %#x sends from the device's port %d", a.qp.QPNum(), srcPort)
	}
	dst := mustReg(t, b.pd, make([]byte, 64), verbs.AccessLocalWrite)
	mustPostRecv(t, b.qp, verbs.RecvWR{WRID: 1, SGList: sge(dst, 0, 64)})
	src := mustReg(t, a.pd, []byte("entropy"), verbs.AccessLocalWrite)
	mustPostSend(t, a.qp, verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: sge(src, 0, 7)})
	if wc := pollOne(t, b.rcq); wc.Status != verbs.WCSuccess || wc.ByteLen != 7 {
		t.Fatalf("receive completion %+v", wc)
	}
	if wc := pollOne(t, a.scq); wc.Status != verbs.WCSuccess {
		t.Fatalf("send completion %+v", wc)
	}
	if err := a.ctx.Close(); err != nil {
		t.Fatal(err)
	}
	recs := wiretest.ReadCapture(t, file)
	sent := 0
	for _, r := range recs {
		if netip.AddrFrom4([4]byte(r.Data[12:16])) != a.ctx.Addr().Addr() {
			continue // received
		}
		var p wire.Packet
		if p.Decode(r.Data[28:]) != nil || p.BTH.DestQP != b.qp.QPNum() {
			continue
		}
		sent++
		if port := binary.BigEndian.Uint16(r.Data[20:]); port != srcPort {
			t.Errorf("a packet of QP %#x from port %d, want its source port %d", a.qp.QPNum(), port, srcPort)
		}
	}
	if sent == 0 {
		t.Error("no packet of the QP in the capture")
	}

	c, d := newSides(t, pairConfig{CQE: 64}) // softrnic peers: the device's port
	epC, epD := c.qp.Endpoint(0x100), d.qp.Endpoint(0x200)
	if err := c.qp.Connect(epC.PSN, epD, verbs.ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	if c.qp.SourcePort() != c.ctx.Addr().Port() {
		t.Errorf("QP connected to a softrnic peer sends from port %d, not the device's %d", c.qp.SourcePort(), c.ctx.Addr().Port())
	}
}
