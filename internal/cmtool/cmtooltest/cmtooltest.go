// Package cmtooltest holds what the tests of softrnic's counterparts of the RDMA example
// programs (cmd/rping, cmd/ucmatose, cmd/udaddy, cmd/pingpong) share: loopback devices,
// a buffer that several goroutines write, and a server and a client of one tool run
// against each other in the test's process.
package cmtooltest

import (
	"bytes"
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/verbs"
)

// OpenDevice opens a device at ip on an ephemeral UDP port, with fault injection
// available and off, closed when the test ends.
func OpenDevice(t testing.TB, ip string) *verbs.Device {
	t.Helper()
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: netip.MustParseAddr(ip), Port: verbs.AnyPort, Faults: &verbs.Faults{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// Buffer is a bytes.Buffer that several goroutines may write and read.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *Buffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String returns what was written.
func (w *Buffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// Bytes returns a copy of what was written.
func (w *Buffer) Bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.b.Bytes())
}

// Pair runs a tool's server and client against each other, on devices at srvIP and cliIP
// (ephemeral UDP ports), within 20 seconds. server runs on a goroutine and calls
// listening once it listens; then client runs, told the listener's address and the
// server device's UDP port. A client that fails ends the server's context (the server
// would wait for a client that is not coming). Pair returns both errors; a server that
// ends before it listens fails the test.
func Pair(t testing.TB, srvIP, cliIP string,
	server func(ctx context.Context, dev *verbs.Device, listening func(netip.AddrPort)) error,
	client func(ctx context.Context, dev *verbs.Device, listener netip.AddrPort, peerPort int) error) (serr, cerr error) {
	t.Helper()
	ds, dc := OpenDevice(t, srvIP), OpenDevice(t, cliIP)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	listening := make(chan netip.AddrPort, 1)
	srvErr := make(chan error, 1)
	go func() { srvErr <- server(ctx, ds, func(a netip.AddrPort) { listening <- a }) }()
	var la netip.AddrPort
	select {
	case la = <-listening:
	case err := <-srvErr:
		t.Fatalf("server: %v", err)
	}
	cerr = client(ctx, dc, la, int(ds.Addr().Port()))
	if cerr != nil {
		cancel()
	}
	return <-srvErr, cerr
}
