package rsocket_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// pair opens two devices, listens on one and returns a connected pair of streams.
func pair(t testing.TB, o rsocket.Options, cfg verbs.DeviceConfig) (client, server *rsocket.Conn) {
	t.Helper()
	devS := verbstest.OpenDevice(t, verbstest.IPB, cfg)
	devC := verbstest.OpenDevice(t, verbstest.IPA, cfg)
	return pairOn(t, devC, devS, o)
}

// pairOn listens on devS and returns a stream from devC connected to it.
func pairOn(t testing.TB, devC, devS *verbs.Device, o rsocket.Options) (client, server *rsocket.Conn) {
	t.Helper()
	lc := rsocket.ListenConfig{Options: o}
	l, err := lc.Listen(devS, 7471)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), testutil.WaitLimit)
	defer cancel()
	d := rsocket.Dialer{Options: o, DevicePort: devS.Addr().Port()}
	c, err := d.Dial(ctx, devC, netip.AddrPortFrom(devS.Addr().Addr(), 7471))
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.AcceptRsocket()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

func TestEcho(t *testing.T) {
	c, s := pair(t, rsocket.Options{}, verbs.DeviceConfig{})
	go func() { io.Copy(s, s); s.CloseWrite() }()
	msg := testutil.Pattern(1<<20, 7)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		if err == nil {
			err = c.CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echoed %d bytes, want %d (equal prefix %d)", len(got), len(msg), commonPrefix(got, msg))
	}
	var _ net.Conn = c
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
