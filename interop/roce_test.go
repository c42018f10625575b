package interop

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/pcap"
	"github.com/softrnic/softrnic/internal/wire"
)

// CheckCapture verifies the ICRC over the IP header as captured (a non-zero
// identification, as rxe sends, included), finds a corrupted packet, and flags a RoCEv2
// packet sent to a port other than 4791. It needs no VM.
func TestCheckCapture(t *testing.T) {
	var buf bytes.Buffer
	w, err := pcap.NewWriter(&buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	host := netip.MustParseAddrPort("10.77.1.1:4791")
	guest := netip.MustParseAddrPort("10.77.1.2:55410")
	put := func(d pcap.Datagram, corrupt bool) {
		// RC SEND_ONLY to QP 0x11, PSN 7, AckReq, with 8 bytes of payload.
		pkt := []byte{0x04, 0, 0xFF, 0xFF, 0, 0, 0, 0x11, 0x80, 0, 0, 7, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0}
		f := wire.Flow{Src: d.Src.Addr(), Dst: d.Dst.Addr(), SrcPort: d.Src.Port(), DstPort: d.Dst.Port(), IPID: d.ID, DF: d.DF}
		wire.PutICRC(pkt[len(pkt)-4:], f.ICRC(pkt[:len(pkt)-4]))
		if corrupt {
			pkt[13] ^= 1
		}
		if err := w.WriteUDP(time.Unix(1, 0), &d, pkt); err != nil {
			t.Fatal(err)
		}
	}
	put(pcap.Datagram{Src: guest, Dst: host, ID: 3847, DF: true}, false)                                                          // rxe's way
	put(pcap.Datagram{Src: netip.AddrPortFrom(host.Addr(), 49152), Dst: netip.AddrPortFrom(guest.Addr(), 4791), DF: true}, false) // softrnic's
	put(pcap.Datagram{Src: guest, Dst: host, ID: 3848, DF: true}, true)
	put(pcap.Datagram{Src: host, Dst: guest, DF: true}, false) // to the peer's source port
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "x.pcap")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := CheckCapture(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Packets != 4 || len(r.BadICRC) != 1 || !strings.Contains(r.BadICRC[0], "packet 3 ") {
		t.Errorf("%d packets, bad ICRCs %q; want 4 and packet 3", r.Packets, r.BadICRC)
	}
	if r.ByKind["10.77.1.2->10.77.1.1 RC_SEND_ONLY"] != 2 {
		t.Errorf("kinds: %v", r.ByKind)
	}
	err = r.Err()
	if err == nil || !strings.Contains(err.Error(), "1 packets to UDP port 55410") {
		t.Errorf("Err: %v", err)
	}
}
