package rsocket_test

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// TestIOMap maps a buffer on each side (riomap) and writes into the other's with IOWrite
// (riowrite), as riostream does, on a clean and a lossy link: what the stream says after
// the writes arrives after them, so the mapped bytes are there once it is read.
func TestIOMap(t *testing.T) {
	for _, lossy := range []bool{false, true} {
		faults := verbs.Faults{}
		if lossy {
			faults = verbs.Faults{Loss: 0.02, Reorder: 0.05, Seed: 9}
		}
		c, s := pair(t, rsocket.Options{IOMapSize: 1, RecvBuffer: 64 << 10, ACKTimeout: lossyACK}, verbs.DeviceConfig{Faults: &faults})
		const size = 300 << 10
		ms, err := s.IOMap(make([]byte, size), 4096)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.IOMap(make([]byte, 10), 0); err == nil {
			t.Fatal("a second IOMap into a table of one succeeded")
		}
		mc, err := c.IOMap(make([]byte, size), 0)
		if err != nil {
			t.Fatal(err)
		}
		// The entries travel as messages: a byte of the stream after each says they came.
		sync := func(from, to *rsocket.Conn) {
			if _, err := from.Write([]byte{1}); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(to, make([]byte, 1)); err != nil {
				t.Fatal(err)
			}
		}
		sync(s, c)
		sync(c, s)
		want := testutil.Pattern(size-100, 3)
		if n, err := c.IOWrite(want, 4096+100); err != nil || n != len(want) {
			t.Fatalf("IOWrite = %d, %v", n, err)
		}
		sync(c, s)
		if !bytes.Equal(ms.Bytes()[100:], want) {
			t.Fatalf("the mapped buffer holds %d bytes as written, want %d", commonPrefix(ms.Bytes()[100:], want), len(want))
		}
		back := testutil.Pattern(1000, 4)
		if _, err := s.IOWrite(back, 50); err != nil {
			t.Fatal(err)
		}
		sync(s, c)
		if !bytes.Equal(mc.Bytes()[50:1050], back) {
			t.Fatal("the client's mapped buffer does not hold the server's write")
		}
		// Offsets nobody mapped, and past a mapping's end.
		if _, err := c.IOWrite([]byte{1}, 0); err == nil {
			t.Error("IOWrite below the peer's mapping succeeded")
		}
		if n, err := c.IOWrite(make([]byte, 200), 4096+size-100); err == nil || n != 100 {
			t.Errorf("IOWrite across the mapping's end = %d, %v; want 100 and an error", n, err)
		}
		if err := ms.Close(); err != nil {
			t.Fatal(err)
		}
		if err := ms.Close(); err == nil {
			t.Error("a second Mapping.Close succeeded")
		}
	}
}

// TestIOMapRefused checks what IOMap and IOWrite refuse: a peer that offered no table,
// weak mode, and a peer's iomap entry outside this side's table (a protocol violation).
func TestIOMapRefused(t *testing.T) {
	c, s := pair(t, rsocket.Options{}, verbs.DeviceConfig{})
	if _, err := c.IOMap(make([]byte, 10), 0); err == nil {
		t.Error("IOMap towards a peer with no iomap table succeeded")
	}
	if _, err := c.IOWrite([]byte{1}, 0); err == nil {
		t.Error("IOWrite with nothing mapped succeeded")
	}
	_ = s
	w, _ := pair(t, rsocket.Options{Ordering: verbs.OrderingWeak, IOMapSize: 1}, verbs.DeviceConfig{})
	if _, err := w.IOMap(make([]byte, 10), 0); err == nil || errors.Is(err, io.EOF) {
		t.Errorf("IOMap in weak mode: %v, want an error", err)
	}
}
