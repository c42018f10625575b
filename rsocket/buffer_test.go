package rsocket_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// TestWriteBuffer sends from registered memory, between copied writes, in both ordering
// modes and on a lossy link: the peer reads every byte in order, and the memory is the
// caller's again when WriteBuffer returns (changing it then changes nothing sent).
func TestWriteBuffer(t *testing.T) {
	for _, ord := range []verbs.Ordering{verbs.OrderingOrdered, verbs.OrderingWeak} {
		for _, lossy := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/lossy=%v", ord, lossy), func(t *testing.T) {
				faults := verbs.Faults{}
				if lossy {
					faults = verbs.Faults{Loss: 0.02, Reorder: 0.05, Seed: 3}
				}
				c, s := pair(t, rsocket.Options{Ordering: ord, RecvBuffer: 256 << 10, ACKTimeout: lossyACK}, verbs.DeviceConfig{Faults: &faults})
				const size = 1 << 20
				buf, err := c.RegisterBuffer(make([]byte, size))
				if err != nil {
					t.Fatal(err)
				}
				var want bytes.Buffer
				errc := make(chan error, 1)
				go func() {
					for i := range 4 {
						copy(buf.Bytes(), testutil.Pattern(size, uint64(i)))
						want.Write(buf.Bytes()[i*1000:])
						if n, err := c.WriteBuffer(buf, i*1000, size-i*1000); err != nil || n != size-i*1000 {
							errc <- fmt.Errorf("WriteBuffer = %d, %v", n, err)
							return
						}
						clear(buf.Bytes()) // the caller's again: this must not reach the peer
						small := testutil.Pattern(333, uint64(i)+10)
						want.Write(small)
						if _, err := c.Write(small); err != nil {
							errc <- err
							return
						}
					}
					errc <- c.CloseWrite()
				}()
				got, err := io.ReadAll(s)
				if err != nil {
					t.Fatal(err)
				}
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want.Bytes()) {
					t.Fatalf("read %d bytes, want %d (equal for %d)", len(got), want.Len(), commonPrefix(got, want.Bytes()))
				}
				if err := buf.Close(); err != nil {
					t.Fatal(err)
				}
				if _, err := c.WriteBuffer(buf, 0, 1); !errors.Is(err, net.ErrClosed) {
					t.Fatalf("WriteBuffer from a closed buffer: %v", err)
				}
			})
		}
	}
}

// TestWriteBufferRefused checks the calls that must fail at once.
func TestWriteBufferRefused(t *testing.T) {
	c, s := pair(t, rsocket.Options{}, verbs.DeviceConfig{})
	buf, err := c.RegisterBuffer(make([]byte, 100))
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.RegisterBuffer(make([]byte, 100))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		b      *rsocket.Buffer
		off, n int
	}{
		{"past the end", buf, 50, 51},
		{"negative offset", buf, -1, 10},
		{"negative length", buf, 0, -1},
		{"another connection's buffer", other, 0, 10},
	} {
		if n, err := c.WriteBuffer(tc.b, tc.off, tc.n); err == nil || n != 0 {
			t.Errorf("%s: %d, %v; want an error", tc.name, n, err)
		}
	}
	if _, err := c.RegisterBuffer(nil); err == nil {
		t.Error("RegisterBuffer(nil) succeeded")
	}
	c.Close()
	if _, err := c.RegisterBuffer(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("RegisterBuffer after Close: %v", err)
	}
	if err := buf.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a buffer's Close after its connection's: %v", err)
	}
}
