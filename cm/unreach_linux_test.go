package cm

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// closedPort returns a UDP port on 127.0.0.1 where no socket is bound: one the system
// just gave a socket that is closed again.
func closedPort(t testing.TB) uint16 {
	t.Helper()
	uc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	port := uc.LocalAddr().(*net.UDPAddr).Port
	uc.Close()
	return uint16(port)
}

// Dial to an address where no device runs (its UDP port closed: loopback answers with
// ICMP port unreachable) fails with ErrPeerUnreachable after the first request, not with
// ErrTimeout after the retries (default: 15, one second each); the QP stays in INIT.
func TestDialClosedPort(t *testing.T) {
	da := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	a := newEndpoint(t, da, 0)
	before := DeviceCounters(da)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	remote := netip.MustParseAddrPort("127.0.0.1:7471")
	start := time.Now()
	_, err := Dial(ctx, da, remote, a.QP, &DialParams{DevicePort: closedPort(t)})
	t.Logf("Dial to a closed port: %v after %v", err, time.Since(start))
	if !errors.Is(err, ErrPeerUnreachable) {
		t.Fatalf("Dial: %v, want ErrPeerUnreachable", err)
	}
	if !strings.HasPrefix(err.Error(), "cm: Dial: ") || !strings.Contains(err.Error(), "127.0.0.1:7471") {
		t.Errorf("error %q does not name the call and the address", err)
	}
	if r := DeviceCounters(da).REQRetries - before.REQRetries; r >= DefaultMaxRetries {
		t.Errorf("%d retries: the report was not heeded", r)
	}
	if s := a.QP.State(); s != verbs.StateInit {
		t.Errorf("QP in %v after the failed Dial, want INIT", s)
	}
}

// ResolveUD to a closed port fails the same way.
func TestResolveUDClosedPort(t *testing.T) {
	da := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := ResolveUD(ctx, da, netip.MustParseAddrPort("127.0.0.1:7174"), &ResolveParams{DevicePort: closedPort(t)})
	if !errors.Is(err, ErrPeerUnreachable) || !strings.HasPrefix(err.Error(), "cm: ResolveUD: ") || !strings.Contains(err.Error(), "127.0.0.1:7174") {
		t.Fatalf("ResolveUD: %v, want ErrPeerUnreachable", err)
	}
}

// The peer process is killed: the keep-alive's next probe gets ICMP port unreachable (the
// process's socket is gone with it), and the connection ends with ErrPeerUnreachable at
// once, before KeepAliveMisses probes went unanswered.
func TestPeerKilledPortClosed(t *testing.T) {
	cmd, peer, lines := startPeer(t, "hang")
	a, c := dialPeer(t, peer, lines)
	probes := DeviceCounters(a.Ctx).KeepAliveProbes
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait() // the process and its socket are gone
	killed := time.Now()
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("the connection did not end within a minute of the peer's death")
	}
	t.Logf("connection ended %v after the peer's death (keep-alive every 50 ms): %v", time.Since(killed), c.Err())
	if !errors.Is(c.Err(), ErrPeerUnreachable) {
		t.Errorf("Err() = %v, want ErrPeerUnreachable", c.Err())
	}
	if n := DeviceCounters(a.Ctx).KeepAliveProbes - probes; n >= KeepAliveMisses {
		t.Errorf("%d probes after the kill: the report was not heeded", n)
	}
	if s := c.QP().State(); s != verbs.StateErr {
		t.Errorf("QP in %v", s)
	}
}

// A report that does not quote a MAD this side waits on changes nothing: another
// transaction ID, another address, a quote shorter than a MAD header.
func TestUnreachableReportChecked(t *testing.T) {
	da := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	a := newEndpoint(t, da, 0)
	m, err := managerFor(da)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	port := uint16(sink.LocalAddr().(*net.UDPAddr).Port)
	dev := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	done := make(chan error, 1)
	go func() {
		_, err := Dial(context.Background(), da, netip.MustParseAddrPort("127.0.0.1:7471"), a.QP,
			&DialParams{DevicePort: port, ResponseTimeout: time.Hour})
		done <- err
	}()
	buf := make([]byte, 2048)
	n, err := sink.Read(buf) // the request: BTH, DETH, then the MAD
	if err != nil {
		t.Fatal(err)
	}
	req := append([]byte(nil), buf[20:n]...)
	other := append([]byte(nil), req...)
	other[15] ^= 1 // another transaction ID
	for _, r := range []struct {
		what string
		dst  netip.AddrPort
		q    []byte
	}{
		{"another transaction ID", dev, other},
		{"another port", netip.AddrPortFrom(dev.Addr(), port+1), req},
		{"a short quote", dev, req[:20]},
	} {
		m.PortUnreachable(r.dst, r.q)
		select {
		case err := <-done:
			t.Fatalf("a report with %s ended Dial: %v", r.what, err)
		default:
		}
	}
	m.PortUnreachable(dev, req)
	if err := <-done; !errors.Is(err, ErrPeerUnreachable) {
		t.Fatalf("Dial: %v, want ErrPeerUnreachable", err)
	}
}
