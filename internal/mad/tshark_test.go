package mad

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/wire"
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// gsiPacket is a UD SEND to QP1 carrying mad, as a device's GSI QP sends it.
func gsiPacket(src, dst netip.AddrPort, mad []byte) []byte {
	fl := wiretest.Flow(src, dst)
	return wiretest.Build(&fl, wire.BTH{Opcode: wire.OpUDSendOnly, PKey: wire.DefaultPKey, DestQP: 1, PSN: 7}, func(hdr []byte) {
		d := wire.DETH{QKey: GSIQKey, SrcQP: 1}
		d.Put(hdr[wire.BTHLen:])
	}, mad)
}

// Wireshark's InfiniBand dissector, which nobody here wrote, reads softrnic's CM MADs as
// CM messages: the attribute of each, REQ fields where IBTA puts them, rdma_cm's IP
// addressing header in the REQ's private data, and nothing malformed. (Wireshark 4.0
// names SIDR_REQ and SIDR_REP by their attributes but does not dissect their fields:
// TestSIDRLayout checks those against IBTA's tables.)
func TestTsharkDecodesCM(t *testing.T) {
	src, dst := netip.MustParseAddrPort("127.0.0.1:4791"), netip.MustParseAddrPort("127.0.0.2:4791")
	req := REQ{LocalCommID: 0x11223344, ServiceID: ServiceID(7471), LocalQKey: 0, LocalQPN: 0xABCDE, ResponderResources: 16,
		InitiatorDepth: 16, RemoteCMResponseTimeout: 20, StartingPSN: 0x654321, LocalCMResponseTimeout: 20, RetryCount: 7,
		PKey: 0xFFFF, PathMTU: 3, RNRRetryCount: 7, MaxCMRetries: 15}
	req.Primary = Path{LocalLID: 0xFFFF, RemoteLID: 0xFFFF, LocalGID: GID(src.Addr()), RemoteGID: GID(dst.Addr()), HopLimit: 64, LocalACKTimeout: 14}
	(&CMAHeader{SrcPort: 40000, Src: src.Addr(), Dst: dst.Addr()}).Put(req.PrivateData[:])
	sidrReq := SIDRREQ{RequestID: 0x55667788, PKey: 0xFFFF, ServiceID: UDPServiceID(7174)}
	(&CMAHeader{SrcPort: 40001, Src: src.Addr(), Dst: dst.Addr()}).Put(sidrReq.PrivateData[:])
	msgs := []Message{&req,
		&MRA{LocalCommID: 2, RemoteCommID: 0x11223344, MessageMRAed: MsgREQ, ServiceTimeout: 20},
		&REJ{LocalCommID: 2, RemoteCommID: 0x11223344, MessageRejected: MsgREQ, Reason: RejConsumerReject},
		&REP{LocalCommID: 2, RemoteCommID: 0x11223344, LocalQPN: 0x12345, StartingPSN: 0x111111, ResponderResources: 16, InitiatorDepth: 16, RNRRetryCount: 7},
		&RTU{LocalCommID: 0x11223344, RemoteCommID: 2},
		&DREQ{LocalCommID: 0x11223344, RemoteCommID: 2, RemoteQPN: 0x12345},
		&DREP{LocalCommID: 2, RemoteCommID: 0x11223344},
		&sidrReq,
		&SIDRREP{RequestID: 0x55667788, Status: SIDRSuccess, QPN: 0x12345, ServiceID: UDPServiceID(7174), QKey: UDPQKey},
	}
	var frames [][]byte
	for i, m := range msgs {
		var b [Size]byte
		Put(b[:], uint64(i+1), m)
		frames = append(frames, wiretest.Frame(src, dst, gsiPacket(src, dst, b[:])))
	}
	run := wiretest.Tshark(t, frames)
	wiretest.NoMalformed(t, run)
	attrs := strings.Fields(run("-T", "fields", "-e", "infiniband.mad.attributeid"))
	for i, m := range msgs {
		if i >= len(attrs) || attrs[i] != fmt.Sprintf("0x%04x", uint16(m.Attr())) {
			t.Errorf("frame %d: tshark's attribute IDs %v, want %#04x (%v)", i+1, attrs, uint16(m.Attr()), m.Attr())
		}
	}
	fields := []string{"infiniband.cm.req.localqpn", "infiniband.cm.req.startpsn", "infiniband.cm.req.serviceid.dport",
		"infiniband.cm.req.pppmtu", "infiniband.cm.req.rnrretrcount", "infiniband.cm.req.retrcount", "infiniband.cm.req.responderres",
		"infiniband.cm.req.ip_cm.sport", "infiniband.cm.req.ip_cm.sip4", "infiniband.cm.req.ip_cm.dip4"}
	args := []string{"-Y", "frame.number == 1", "-T", "fields", "-E", "separator=|"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	got := strings.Split(strings.TrimSpace(run(args...)), "|")
	want := []string{"0x000abcde", "0x00654321", "7471", "3", "7", "7", "0x10", "40000", "127.0.0.1", "127.0.0.2"}
	for i := range want {
		if i >= len(got) || !sameNumber(got[i], want[i]) {
			t.Errorf("%s: tshark reads %q, want %q (all: %q)", fields[i], at(got, i), want[i], got)
		}
	}
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "(missing)"
}

// sameNumber compares tshark's rendering with want, as numbers when both are numbers.
func sameNumber(got, want string) bool {
	if got == want {
		return true
	}
	var g, w uint64
	if _, err := fmt.Sscan(got, &g); err != nil {
		return false
	}
	if _, err := fmt.Sscan(want, &w); err != nil {
		return false
	}
	return g == w
}
