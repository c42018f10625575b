package netio

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
)

// closedPort returns an address on 127.0.0.1 where no socket is bound: a port the system
// just gave a socket that is closed again.
func closedPort(t *testing.T) netip.AddrPort {
	t.Helper()
	uc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	ap := uc.LocalAddr().(*net.UDPAddr).AddrPort()
	uc.Close()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

type report struct {
	dst   netip.AddrPort
	quote []byte
}

// Datagrams to a closed port on loopback come back as ICMP port unreachable: Poll reads
// the reports from the socket's error queue and hands Config.Unreachable the destination
// and the quoted payload, while a datagram queued with them is received as usual. The
// datagrams to the closed port go in one sendmmsg (sizes differ: no GSO), so that the
// kernel, which processes loopback's ICMP inside the call, returns the first report's
// error to the second message: that message is sent again, not dropped, and the report
// still reaches Poll.
func TestPortUnreachable(t *testing.T) {
	paths(t, func(t *testing.T, portable bool) {
		var reports []report
		a, b := pairWith(t, Config{portable: portable, Unreachable: func(dst netip.AddrPort, quote []byte) {
			reports = append(reports, report{dst, append([]byte(nil), quote...)})
		}}, Config{portable: portable})
		if !a.recverr {
			t.Fatal("socket without IP_RECVERR")
		}
		closed := closedPort(t)
		dst, err := a.MakeAddr(closed)
		if err != nil {
			t.Fatal(err)
		}
		sb := NewSendBatch(8, 16, 1024)
		var sent [][]byte
		for i := range 3 {
			d := bytes.Repeat([]byte{byte('a' + i)}, 40+i)
			sent = append(sent, d)
			sb.Begin(&dst)
			sb.Add(d)
			sb.End()
		}
		if err := a.Send(sb); err != nil {
			t.Fatal(err)
		}
		// A datagram from b that waits in a's socket behind the reports.
		toA, _ := b.MakeAddr(a.LocalAddr())
		sb.Begin(&toA)
		sb.Add([]byte("data behind the report"))
		sb.End()
		if err := b.Send(sb); err != nil {
			t.Fatal(err)
		}
		rb := a.NewRecvBatch(4, 2048)
		var data [][]byte
		guard := time.AfterFunc(testutil.WaitLimit, func() { a.Close() })
		defer guard.Stop()
		err = a.Serve(func() bool {
			for {
				n, err := a.Poll(rb)
				if err != nil {
					t.Errorf("Poll: %v", err)
					return true
				}
				for i := range n {
					d, _, from := rb.Datagram(i)
					if !IsDoorbell(d, from, a.LocalAddr()) { // a send that took a report's error rings it
						data = append(data, append([]byte(nil), d...))
					}
				}
				if n == 0 {
					return len(reports) > 0 && len(data) > 0
				}
			}
		})
		if err != nil {
			t.Fatalf("Serve: %v (%d reports, %d datagrams)", err, len(reports), len(data))
		}
		if len(data) != 1 || string(data[0]) != "data behind the report" {
			t.Errorf("received %q", data)
		}
		for _, r := range reports {
			if r.dst != closed {
				t.Errorf("report for %v, want %v", r.dst, closed)
			}
			found := false
			for _, s := range sent {
				found = found || bytes.Equal(r.quote, s)
			}
			if !found {
				t.Errorf("report quotes %q, not a datagram sent", r.quote)
			}
		}
		if got := a.PortUnreachable.Load(); got != uint64(len(reports)) || a.ErrorReports.Load() < got {
			t.Errorf("counters: %d port unreachable, %d reports; %d handed on", got, a.ErrorReports.Load(), len(reports))
		}
		if e := a.SendErrors.Load(); e != 0 {
			t.Errorf("%d send errors: a report's error dropped a datagram", e)
		}
	})
}

// The sockets SourcePorts opens are never read: they do not ask for reports, which would
// fill their error queues.
func TestSourcePortsNoReports(t *testing.T) {
	c, err := Listen(Config{Local: netip.MustParseAddrPort("127.0.0.1:0"), SourcePorts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.recverr || c.srcs[0].recverr {
		t.Errorf("IP_RECVERR: device socket %v, source socket %v; want true, false", c.recverr, c.srcs[0].recverr)
	}
}

// FuzzPortUnreachable: the control messages of an error-queue read, whatever their bytes,
// are read within their bounds.
func FuzzPortUnreachable(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, oob []byte) { portUnreachable(oob) })
}
