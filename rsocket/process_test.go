package rsocket_test

import (
	"bufio"
	"errors"
	"io"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// The tests between two OS processes run the test binary again as the peer.
const (
	peerEnv     = "SOFTRNIC_RSOCKET_PEER"      // the peer's role: dial or listen
	peerAddrEnv = "SOFTRNIC_RSOCKET_PEER_ADDR" // dial: the listener's device address
)

// keepAlive is the connection manager's probe period in these tests: a killed peer's
// host answers the next probe with ICMP port unreachable (Linux), or the probes go
// unanswered.
const keepAlive = 50 * time.Millisecond

// TestPeerProcess is the peer (only when run by TestPeerKilled): it connects (dialling
// the address it is given, or listening and printing its device's address), says
// "streaming", and writes until it is killed.
func TestPeerProcess(t *testing.T) {
	role := os.Getenv(peerEnv)
	if role == "" {
		t.Skip("run by TestPeerKilled")
	}
	fail := func(err error) { os.Stdout.WriteString("error: " + err.Error() + "\n"); os.Exit(1) }
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: verbstest.IPB, Port: verbs.AnyPort, Faults: &verbs.Faults{}})
	if err != nil {
		fail(err)
	}
	o := rsocket.Options{KeepAlive: keepAlive}
	var c *rsocket.Conn
	if role == "dial" {
		addr, err := netip.ParseAddrPort(os.Getenv(peerAddrEnv))
		if err != nil {
			fail(err)
		}
		d := rsocket.Dialer{Options: o, DevicePort: addr.Port()}
		if c, err = d.Dial(testutil.Context(t), dev, netip.AddrPortFrom(addr.Addr(), 7471)); err != nil {
			fail(err)
		}
	} else {
		lc := rsocket.ListenConfig{Options: o}
		l, err := lc.Listen(dev, 7471)
		if err != nil {
			fail(err)
		}
		os.Stdout.WriteString("listening " + dev.Addr().String() + "\n")
		if c, err = l.AcceptRsocket(); err != nil {
			fail(err)
		}
	}
	os.Stdout.WriteString("streaming\n")
	buf := make([]byte, 64<<10)
	for {
		if _, err := c.Write(buf); err != nil {
			fail(err)
		}
	}
}

// TestPeerKilled kills the peer process while it streams, as client and as server: this
// side's blocked Read and Write (the peer reads nothing) each end with an error, not
// io.EOF and not a hang.
func TestPeerKilled(t *testing.T) {
	for _, role := range []string{"dial", "listen"} {
		t.Run("peer "+role+"s", func(t *testing.T) {
			dev := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
			o := rsocket.Options{KeepAlive: keepAlive, RecvBuffer: 16 << 10}
			var c *rsocket.Conn
			var lines *bufio.Scanner
			if role == "dial" {
				lc := rsocket.ListenConfig{Options: o}
				l, err := lc.Listen(dev, 7471)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				child, out := testutil.StartChild(t, "TestPeerProcess", peerEnv+"=dial", peerAddrEnv+"="+dev.Addr().String())
				lines = out
				if c, err = l.AcceptRsocket(); err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				expectLine(t, lines, "streaming")
				killWhileBlocked(t, c, child.Process)
			} else {
				child, out := testutil.StartChild(t, "TestPeerProcess", peerEnv+"=listen")
				lines = out
				addr, err := netip.ParseAddrPort(strings.TrimPrefix(expectLine(t, lines, "listening "), "listening "))
				if err != nil {
					t.Fatal(err)
				}
				d := rsocket.Dialer{Options: o, DevicePort: addr.Port()}
				if c, err = d.Dial(testutil.Context(t), dev, netip.AddrPortFrom(addr.Addr(), 7471)); err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				expectLine(t, lines, "streaming")
				killWhileBlocked(t, c, child.Process)
			}
		})
	}
}

// killWhileBlocked blocks a Write (the peer reads nothing, so its ring fills) and a
// Read after the stream's bytes, kills the peer and checks how both calls end.
func killWhileBlocked(t *testing.T, c *rsocket.Conn, p *os.Process) {
	t.Helper()
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 1<<20))
		werr <- err
	}()
	rerr := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, c)
		rerr <- err
	}()
	verbstest.WaitUntil(t, "a Write asleep", func() bool { return rsocket.Sleepers(c) >= 1 })
	start := time.Now()
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]chan error{"Write": werr, "Read": rerr} {
		err := <-ch
		if err == nil || errors.Is(err, io.EOF) {
			t.Errorf("%s after the peer was killed: %v, want an error", name, err)
		}
		t.Logf("%s: %v (%v after the kill)", name, err, time.Since(start).Round(time.Millisecond))
	}
}

// expectLine reads the child's output up to a line starting with prefix.
func expectLine(t *testing.T, lines *bufio.Scanner, prefix string) string {
	t.Helper()
	for lines.Scan() {
		if l := lines.Text(); strings.HasPrefix(l, prefix) {
			return l
		} else if strings.HasPrefix(l, "error: ") {
			t.Fatalf("peer: %s", l)
		}
	}
	t.Fatalf("peer ended its output before %q: %v", prefix, lines.Err())
	return ""
}
