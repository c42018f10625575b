package cm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/verbs"
)

// The restarted-client test runs the test binary again as the client, twice on the same
// address and port, killing the first with SIGKILL.

const (
	clientEnv     = "SOFTRNIC_CM_CLIENT"      // the server's device address
	clientPortEnv = "SOFTRNIC_CM_CLIENT_PORT" // the client's device port (empty: any)
)

// TestClientProcess is the client (only when run by TestClientRestarted): it opens a
// device, dials the server, sends "ping", reports, and waits to be killed.
func TestClientProcess(t *testing.T) {
	server := os.Getenv(clientEnv)
	if server == "" {
		t.Skip("run by TestClientRestarted")
	}
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) { out.Encode(peerReport{Err: "peer: " + err.Error()}); os.Exit(1) }
	srv, err := netip.ParseAddrPort(server)
	if err != nil {
		fail(err)
	}
	port := verbs.AnyPort
	if s := os.Getenv(clientPortEnv); s != "" {
		if port, err = strconv.Atoi(s); err != nil {
			fail(err)
		}
	}
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: verbstest.IPA, Port: port, Faults: &verbs.Faults{}})
	if err != nil {
		fail(err)
	}
	defer dev.Close()
	out.Encode(peerReport{Addr: dev.Addr().String()})
	a := newEndpoint(t, dev, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := Dial(ctx, dev, netip.AddrPortFrom(srv.Addr(), testPort), a.QP, &DialParams{DevicePort: srv.Port()}); err != nil {
		fail(err)
	}
	copy(a.buf, "ping")
	verbstest.MustPostSend(t, a.QP, verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: verbstest.SGL(a.mr, 0, 4)})
	if wc := verbstest.PollOne(t, a.SCQ); wc.Status != verbs.WCSuccess {
		fail(fmt.Errorf("send: %v", wc.Status))
	}
	out.Encode(peerReport{Data: "connected"})
	<-ctx.Done()
}

// startClient runs the client process with its device on port (0: any) and returns its
// device's address and its report lines.
func startClient(t *testing.T, server netip.AddrPort, port uint16) (*exec.Cmd, netip.AddrPort, *bufio.Scanner) {
	t.Helper()
	env := []string{clientEnv + "=" + server.String()}
	if port != 0 {
		env = append(env, clientPortEnv+"="+strconv.Itoa(int(port)))
	}
	cmd, lines := testutil.StartChild(t, "TestClientProcess", env...)
	r := readReport(t, lines)
	addr, err := netip.ParseAddrPort(r.Addr)
	if err != nil {
		t.Fatalf("client's first report %+v: %v", r, err)
	}
	return cmd, addr, lines
}

// A client process is killed with SIGKILL and another starts on the same address and
// port (as every client on 127.0.0.1:4791 would): the server's connection to the dead one
// ends with ErrPeerRestarted as soon as the new one shows itself (its keep-alive answer or
// its request, whichever comes first; both within one keep-alive period), its QP in ERR,
// while the new client's connection works.
func TestClientRestarted(t *testing.T) {
	db := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	l, err := Listen(db, testPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	serve := func(lines *bufio.Scanner) (*endpoint, *Conn) {
		t.Helper()
		b := newEndpoint(t, db, 1)
		r, err := l.Accept(testutil.Context(t))
		if err != nil {
			t.Fatalf("Accept: %v", err)
		}
		c, err := r.Accept(b.QP, nil) // the default keep-alive, 1 s
		if err != nil {
			t.Fatalf("Accept: %v", err)
		}
		wc := verbstest.PollOne(t, b.RCQ)
		if wc.Status != verbs.WCSuccess || string(b.buf[2048:2048+wc.ByteLen]) != "ping" {
			t.Fatalf("receive: %v %q", wc.Status, b.buf[2048:2048+wc.ByteLen])
		}
		if r := readReport(t, lines); r.Data != "connected" {
			t.Fatalf("client reported %+v", r)
		}
		return b, c
	}
	cmd, addr, lines := startClient(t, db.Addr(), 0)
	_, old := serve(lines)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	_, addr2, lines2 := startClient(t, db.Addr(), addr.Port())
	opened := time.Now()
	if addr2 != addr {
		t.Fatalf("the second client opened %v, not %v", addr2, addr)
	}
	done := make(chan time.Duration, 1)
	go func() {
		<-old.Done()
		done <- time.Since(opened)
	}()
	_, nc := serve(lines2)
	waitEnded(t, "the dead client's connection", old, ErrPeerRestarted)
	t.Logf("the dead client's connection ended %v after the new client's device opened: %v", <-done, old.Err())
	if nc.Err() != nil {
		t.Errorf("the new client's connection: %v", nc.Err())
	}
	if n := DeviceCounters(db).PeerRestarts; n != 1 {
		t.Errorf("PeerRestarts = %d, want 1", n)
	}
}
