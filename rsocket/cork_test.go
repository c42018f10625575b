package rsocket

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// corkedWrites writes a message and then two small ones while the first is on its way
// (nothing polls the writer's completions in between, so it is still outstanding), and
// returns what was written.
func corkedWrites(t *testing.T, c *Conn) []byte {
	t.Helper()
	want := bytes.Repeat([]byte("0123456789abcdef"), 100)
	for _, b := range [][]byte{want[:1000], want[1000:1300], want[1300:]} {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	return want
}

// readFull reads len(want) bytes from s, failing the test after a generous deadline
// rather than hanging if they never come, and compares them.
func readFull(t *testing.T, s *Conn, want []byte) {
	t.Helper()
	s.SetReadDeadline(time.Now().Add(30 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(s, got); err != nil {
		t.Fatalf("reading what was written: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes read differ from those written")
	}
}

// Bytes written while an earlier message is on its way go out together as one message;
// with NoDelay each Write is a message of its own.
func TestCorkMerges(t *testing.T) {
	for _, tc := range []struct {
		noDelay  bool
		messages uint64
	}{{false, 2}, {true, 3}} {
		c, s := connectedPair(t, Options{}, Options{NoDelay: tc.noDelay})
		c.corkWait = time.Hour // only CloseWrite sends what waits
		want := corkedWrites(t, c)
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		readFull(t, s, want)
		if n, err := s.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("after the bytes: %d, %v; want io.EOF", n, err)
		}
		if got := s.Stats().Messages; got != tc.messages {
			t.Errorf("NoDelay %v: %d data messages, want %d", tc.noDelay, got, tc.messages)
		}
	}
}

// What waits goes out when the writer reads: a request written in pieces is answered.
func TestCorkFlushedByRead(t *testing.T) {
	c, s := connectedPair(t, Options{}, Options{})
	c.corkWait = time.Hour
	done := make(chan error, 1)
	go func() {
		got := make([]byte, 1600)
		s.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadFull(s, got); err != nil {
			done <- err
			return
		}
		_, err := s.Write([]byte("ok"))
		done <- err
	}()
	corkedWrites(t, c)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	answer := make([]byte, 2)
	if _, err := io.ReadFull(c, answer); err != nil {
		t.Fatalf("no answer to a request whose last bytes waited: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// What waits goes out when the writer's earlier message completes and another call of
// the connection polls: here a Read that waits in another goroutine.
func TestCorkFlushedByCompletion(t *testing.T) {
	c, s := connectedPair(t, Options{}, Options{})
	c.corkWait = time.Hour
	reading := make(chan error, 1)
	go func() {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := io.ReadFull(c, make([]byte, 2))
		reading <- err
	}()
	want := corkedWrites(t, c)
	readFull(t, s, want)
	if _, err := s.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	if err := <-reading; err != nil {
		t.Fatal(err)
	}
}

// What waits goes out after corkTimeout when no call of the connection polls.
func TestCorkFlushedByTimer(t *testing.T) {
	c, s := connectedPair(t, Options{}, Options{})
	want := corkedWrites(t, c)
	readFull(t, s, want)
}

// Close sends what waits before it disconnects.
func TestCorkFlushedByClose(t *testing.T) {
	c, s := connectedPair(t, Options{}, Options{})
	c.corkWait = time.Hour
	want := corkedWrites(t, c)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	readFull(t, s, want)
}
