package rsocket_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/verbstest"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// writeRandomly writes b to w in pieces of random sizes (1 byte to 200 KiB).
func writeRandomly(w io.Writer, b []byte, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 1))
	for len(b) > 0 {
		n := min(len(b), 1+rng.IntN(200<<10))
		if rng.IntN(4) == 0 {
			n = min(len(b), 1+rng.IntN(64))
		}
		if _, err := w.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// exchange writes a pattern each way at once, half-closes, and checks that each side
// reads exactly what the other wrote, then io.EOF.
func exchange(t *testing.T, c, s *rsocket.Conn, size int) {
	t.Helper()
	var wg sync.WaitGroup
	check := func(name string, from, to *rsocket.Conn, seed uint64) {
		defer wg.Done()
		want := testutil.Pattern(size, seed)
		errc := make(chan error, 1)
		go func() {
			err := writeRandomly(from, want, seed)
			if err == nil {
				err = from.CloseWrite()
			}
			errc <- err
		}()
		got, err := io.ReadAll(to)
		if err != nil {
			t.Errorf("%s: read: %v", name, err)
		}
		if err := <-errc; err != nil {
			t.Errorf("%s: write: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: read %d bytes, want %d (equal for %d)", name, len(got), len(want), commonPrefix(got, want))
		}
	}
	wg.Add(2)
	go check("client to server", c, s, 1)
	go check("server to client", s, c, 2)
	wg.Wait()
	for _, x := range []*rsocket.Conn{c, s} {
		if st := x.Stats(); st.Violations != 0 {
			t.Errorf("%v: %+v", x.LocalAddr(), st)
		}
	}
}

// lossyACK is the local ACK timeout of the tests on lossy links: a lost last packet is
// sent again after it (the default, 2.1 s, is for slow standard peers).
const lossyACK = 20 * time.Millisecond

// TestStream moves streams both ways at once over small rings (grants cycle many
// times), in both ordering modes, on a clean link and on one that loses, duplicates,
// reorders and corrupts datagrams: every byte arrives once, in order.
func TestStream(t *testing.T) {
	links := []struct {
		name   string
		faults verbs.Faults
	}{
		{"clean", verbs.Faults{}},
		{"lossy", verbs.Faults{Loss: 0.02, Dup: 0.02, Reorder: 0.05, Corrupt: 0.01, Seed: 5}},
	}
	for _, ord := range []verbs.Ordering{verbs.OrderingOrdered, verbs.OrderingWeak} {
		for _, link := range links {
			t.Run(fmt.Sprintf("%v/%s", ord, link.name), func(t *testing.T) {
				faults := link.faults
				c, s := pair(t, rsocket.Options{Ordering: ord, RecvBuffer: 32 << 10, SendBuffer: 16 << 10, QueueSize: 32, ACKTimeout: lossyACK},
					verbs.DeviceConfig{Faults: &faults})
				if c.Ordering() != ord {
					t.Fatalf("ordering %v, want %v", c.Ordering(), ord)
				}
				size := 4 << 20
				if link.faults.Loss > 0 || testing.Short() {
					size = 1 << 20
				}
				exchange(t, c, s, size)
			})
		}
	}
}

// TestHalfClose checks CloseWrite as TCP's: the peer reads io.EOF after the data and may
// go on writing, which this side still reads; writing after CloseWrite fails.
func TestHalfClose(t *testing.T) {
	c, s := pair(t, rsocket.Options{}, verbs.DeviceConfig{})
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("more")); err == nil {
		t.Fatal("Write after CloseWrite succeeded")
	}
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "request" {
		t.Fatalf("server read %q, %v; want the request and io.EOF", got, err)
	}
	if _, err := s.Write([]byte("reply")); err != nil {
		t.Fatalf("server's Write after the client's CloseWrite: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got, err = io.ReadAll(c)
	if err != nil || string(got) != "reply" {
		t.Fatalf("client read %q, %v; want the reply and io.EOF", got, err)
	}
}

// TestCloseWakes checks that Close wakes a blocked Read and a blocked Write (whose peer
// reads nothing) with net.ErrClosed, and that every later call fails the same way.
func TestCloseWakes(t *testing.T) {
	c, _ := pair(t, rsocket.Options{RecvBuffer: 8 << 10, SendBuffer: 8 << 10}, verbs.DeviceConfig{})
	errs := make(chan error, 2)
	go func() {
		_, err := c.Read(make([]byte, 10))
		errs <- err
	}()
	go func() {
		_, err := c.Write(make([]byte, 1<<20)) // more than the peer's ring
		errs <- err
	}()
	// Both calls must be blocked before Close for the test to mean something: the Write
	// cannot finish, and nothing is sent to the Read.
	verbstest.WaitUntil(t, "a Read and a Write asleep", func() bool { return rsocket.Sleepers(c) == 2 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, net.ErrClosed) {
			t.Errorf("blocked call after Close: %v, want net.ErrClosed", err)
		}
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close: %v", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

// TestManyConns opens 1,000 streams between two devices at once, each moving a message
// each way.
func TestManyConns(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 100
	}
	devS := verbstest.OpenDevice(t, verbstest.IPB, verbs.DeviceConfig{})
	devC := verbstest.OpenDevice(t, verbstest.IPA, verbs.DeviceConfig{})
	o := rsocket.Options{RecvBuffer: 8 << 10, SendBuffer: 4 << 10, QueueSize: 16}
	lc := rsocket.ListenConfig{Options: o}
	l, err := lc.Listen(devS, 7471)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			s, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer s.Close()
				io.Copy(s, s)
			}()
		}
	}()
	d := rsocket.Dialer{Options: o, DevicePort: devS.Addr().Port()}
	conns := make([]*rsocket.Conn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := d.Dial(testutil.Context(t), devC, netip.AddrPortFrom(verbstest.IPB, 7471))
			if err != nil {
				errs <- fmt.Errorf("dial %d: %w", i, err)
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Every connection is open at once; now each carries a message each way.
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			msg := fmt.Appendf(nil, "message %d", i)
			if _, err := c.Write(msg); err != nil {
				t.Errorf("conn %d: write: %v", i, err)
				return
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
				t.Errorf("conn %d: read %q, %v", i, got, err)
			}
		}()
	}
	wg.Wait()
}

// TestDeadlineWakes checks that a deadline set while a Read waits wakes it with an error
// satisfying os.ErrDeadlineExceeded and net.Error's Timeout, and that a moved deadline
// lets the next Read wait again.
func TestDeadlineWakes(t *testing.T) {
	c, s := pair(t, rsocket.Options{}, verbs.DeviceConfig{})
	errc := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		errc <- err
	}()
	verbstest.WaitUntil(t, "a Read asleep", func() bool { return rsocket.Sleepers(c) == 1 })
	c.SetReadDeadline(time.Now())
	err := <-errc
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read woken by its deadline: %v", err)
	}
	c.SetReadDeadline(time.Time{})
	if _, err := s.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatalf("Read after the deadline was lifted: %v", err)
	}
}
