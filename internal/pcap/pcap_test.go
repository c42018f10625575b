package pcap_test

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
	"github.com/softrnic/softrnic/internal/wire/wiretest"
)

// TestTshark writes RoCEv2 packets over IPv4 (with identifications) and IPv6, each
// payload in pieces of odd lengths, and has tshark read them: every one decodes as
// InfiniBand with no malformed field, and the IP and UDP checksums verify.
func TestTshark(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tap.pcap")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	w, err := pcap.NewWriter(f, 0)
	if err != nil {
		t.Fatal(err)
	}
	v4a, v4b := netip.MustParseAddrPort("127.0.0.1:49153"), netip.MustParseAddrPort("127.0.0.2:4791")
	v6a, v6b := netip.MustParseAddrPort("[::1]:49154"), netip.MustParseAddrPort("[::1]:4791")
	for i, c := range []struct {
		src, dst netip.AddrPort
		id       uint16
	}{{v4a, v4b, 0}, {v4a, v4b, 7}, {v6a, v6b, 0}} {
		fl := wire.Flow{Src: c.src.Addr(), Dst: c.dst.Addr(), SrcPort: c.src.Port(), DstPort: c.dst.Port(), DF: true, IPID: c.id}
		pkt := wiretest.Build(&fl, wire.BTH{Opcode: wire.OpSendOnly, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: wire.PSN(i)}, nil, bytes.Repeat([]byte{0xAB}, 101))
		if err := w.WriteUDP(time.Now(), &pcap.Datagram{Src: c.src, Dst: c.dst, ID: c.id, DF: true}, pkt[:13], pkt[13:50], pkt[50:]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	run := wiretest.TsharkFile(t, file)
	wiretest.NoMalformed(t, run)
	out := run("-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE", "-T", "fields",
		"-e", "ip.id", "-e", "ip.checksum.status", "-e", "udp.checksum.status", "-e", "infiniband.bth.opcode")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{"0x0000\t1\t1\t4", "0x0007\t1\t1\t4", "\t\t1\t4"} // status 1: good
	if len(lines) != len(want) {
		t.Fatalf("tshark read %d packets:\n%s", len(lines), out)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("packet %d: %q, want %q", i, lines[i], want[i])
		}
	}
}

// TestLimit stops at the size limit and counts what it dropped.
func TestLimit(t *testing.T) {
	var buf bytes.Buffer
	w, err := pcap.NewWriter(&buf, 24+3*(16+28+100))
	if err != nil {
		t.Fatal(err)
	}
	d := &pcap.Datagram{Src: netip.MustParseAddrPort("127.0.0.1:1"), Dst: netip.MustParseAddrPort("127.0.0.2:2")}
	for i := 0; i < 5; i++ {
		if err := w.WriteUDP(time.Now(), d, make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != 24+3*(16+28+100) || w.Dropped() != 2 {
		t.Fatalf("%d bytes, %d dropped", buf.Len(), w.Dropped())
	}
	w.Close()
	if err := w.WriteUDP(time.Now(), d, nil); err != pcap.ErrClosed {
		t.Fatalf("after Close: %v", err)
	}
}

// TestReadAll reads back what the Writer wrote.
func TestReadAll(t *testing.T) {
	var buf bytes.Buffer
	w, err := pcap.NewWriter(&buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := &pcap.Datagram{Src: netip.MustParseAddrPort("127.0.0.1:1"), Dst: netip.MustParseAddrPort("127.0.0.2:2"), ID: 9}
	ts := time.Unix(1700000000, 123456789)
	w.WriteUDP(ts, d, []byte("hello"))
	w.WriteUDP(ts, d, []byte("world!"))
	w.Flush()
	recs, lt, err := pcap.ReadAll(&buf)
	if err != nil || lt != pcap.LinkTypeRaw || len(recs) != 2 {
		t.Fatalf("%d records, link type %d, %v", len(recs), lt, err)
	}
	if !recs[0].Time.Equal(ts) || string(recs[1].Data[28:]) != "world!" || recs[0].Data[5] != 9 {
		t.Fatalf("records %+v", recs)
	}
}
