package cm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// The tests between two OS processes run the test binary again as the listening peer.

const peerEnv = "SOFTRNIC_CM_PEER"

// peerReport is a line the peer prints on stdout.
type peerReport struct {
	Addr string `json:"addr,omitempty"` // its device, once it listens
	Data string `json:"data,omitempty"` // the dialer's private data, once connected
	Err  string `json:"err,omitempty"`  // how its connection ended
}

// TestPeerProcess is the peer (only when run by the tests below): it listens, accepts
// one connection with private data, echoes one message back, then waits for the
// connection to end and reports why (or, in mode "hang", waits to be killed).
func TestPeerProcess(t *testing.T) {
	mode := os.Getenv(peerEnv)
	if mode == "" {
		t.Skip("run by TestTwoProcesses and TestPeerKilled")
	}
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) { out.Encode(peerReport{Err: "peer: " + err.Error()}); os.Exit(1) }
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: verbstest.IPB, Port: verbs.AnyPort, Faults: &verbs.Faults{}})
	if err != nil {
		fail(err)
	}
	defer dev.Close()
	b := newEndpoint(t, dev, 1)
	l, err := Listen(dev, testPort)
	if err != nil {
		fail(err)
	}
	out.Encode(peerReport{Addr: dev.Addr().String()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := l.Accept(ctx)
	if err != nil {
		fail(err)
	}
	c, err := r.Accept(b.QP, &AcceptParams{PrivateData: []byte("welcome"), KeepAlive: 50 * time.Millisecond})
	if err != nil {
		fail(err)
	}
	out.Encode(peerReport{Data: strings.TrimRight(string(c.PrivateData()), "\x00")})
	// Echo one message.
	wc := verbstest.PollOne(t, b.RCQ)
	if wc.Status != verbs.WCSuccess {
		fail(fmt.Errorf("receive: %v", wc.Status))
	}
	copy(b.buf, b.buf[2048:2048+wc.ByteLen])
	verbstest.MustPostSend(t, b.QP, verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: verbstest.SGL(b.mr, 0, int(wc.ByteLen))})
	verbstest.PollOne(t, b.SCQ)
	select {
	case <-c.Done():
		out.Encode(peerReport{Err: c.Err().Error()})
	case <-ctx.Done():
		fail(ctx.Err())
	}
}

// startPeer runs the peer process in mode and returns its device's address and its
// report lines.
func startPeer(t *testing.T, mode string) (*exec.Cmd, netip.AddrPort, *bufio.Scanner) {
	t.Helper()
	cmd, lines := testutil.StartChild(t, "TestPeerProcess", peerEnv+"="+mode)
	r := readReport(t, lines)
	addr, err := netip.ParseAddrPort(r.Addr)
	if err != nil {
		t.Fatalf("peer's first report %+v: %v", r, err)
	}
	return cmd, addr, lines
}

func readReport(t *testing.T, lines *bufio.Scanner) peerReport {
	t.Helper()
	for lines.Scan() {
		if !strings.HasPrefix(lines.Text(), "{") {
			continue // the test framework's own output
		}
		var r peerReport
		if err := json.Unmarshal(lines.Bytes(), &r); err != nil {
			t.Fatalf("peer printed %q: %v", lines.Text(), err)
		}
		if strings.HasPrefix(r.Err, "peer: ") {
			t.Fatalf("%s", r.Err)
		}
		return r
	}
	t.Fatalf("peer ended its output: %v", lines.Err())
	return peerReport{}
}

// dialPeer connects to the peer process and checks one round trip.
func dialPeer(t *testing.T, peer netip.AddrPort, lines *bufio.Scanner) (*endpoint, *Conn) {
	t.Helper()
	da := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	a := newEndpoint(t, da, 1)
	p := &DialParams{PrivateData: []byte("hello"), DevicePort: peer.Port(), ResponseTimeout: 200 * time.Millisecond, KeepAlive: 50 * time.Millisecond}
	c, err := Dial(testutil.Context(t), da, netip.AddrPortFrom(peer.Addr(), testPort), a.QP, p)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	if got := strings.TrimRight(string(c.PrivateData()), "\x00"); got != "welcome" {
		t.Errorf("accept's private data %q", got)
	}
	if r := readReport(t, lines); r.Data != "hello" {
		t.Errorf("peer got private data %q", r.Data)
	}
	copy(a.buf, "ping across processes")
	verbstest.MustPostSend(t, a.QP, verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: verbstest.SGL(a.mr, 0, 21)})
	verbstest.PollOne(t, a.SCQ)
	wc := verbstest.PollOne(t, a.RCQ)
	if wc.Status != verbs.WCSuccess || string(a.buf[2048:2048+wc.ByteLen]) != "ping across processes" {
		t.Fatalf("echo: %v %q", wc.Status, a.buf[2048:2048+wc.ByteLen])
	}
	return a, c
}

// The handshake between two OS processes, data both ways, and a Disconnect that the
// peer process sees.
func TestTwoProcesses(t *testing.T) {
	_, peer, lines := startPeer(t, "disconnect")
	_, c := dialPeer(t, peer, lines)
	if err := c.DisconnectContext(testutil.Context(t)); err != nil {
		t.Fatalf("Disconnect: %v", err)
	}
	if r := readReport(t, lines); r.Err != ErrDisconnected.Error() {
		t.Errorf("the peer's connection ended with %q, want %q", r.Err, ErrDisconnected)
	}
}

// The peer process is killed: nothing is outstanding here, and still the connection
// ends with ErrPeerUnreachable (keep-alive), its QP in ERR.
func TestPeerKilled(t *testing.T) {
	cmd, peer, lines := startPeer(t, "hang")
	_, c := dialPeer(t, peer, lines)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("the connection did not end within a minute of the peer's death")
	}
	if !errors.Is(c.Err(), ErrPeerUnreachable) {
		t.Errorf("Err() = %v, want ErrPeerUnreachable", c.Err())
	}
	if s := c.QP().State(); s != verbs.StateErr {
		t.Errorf("QP in %v", s)
	}
}

// Disconnect from a peer process that was killed: it does not hang (it waits one
// keep-alive period at most), and says the peer is unreachable or did not answer.
func TestDisconnectKilledPeer(t *testing.T) {
	cmd, peer, lines := startPeer(t, "hang")
	_, c := dialPeer(t, peer, lines)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := c.Disconnect()
	t.Logf("Disconnect from a killed peer: %v after %v (keep-alive period 50ms)", err, time.Since(start))
	if !errors.Is(err, ErrPeerUnreachable) && !errors.Is(err, ErrTimeout) {
		t.Errorf("Disconnect from a killed peer: %v, want ErrPeerUnreachable or ErrTimeout", err)
	}
	<-c.Done()
}
