package rsocket_test

import (
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// tcpPair is a connected pair of Go TCP sockets over loopback, the baseline.
func tcpPair(b *testing.B) (net.Conn, net.Conn) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		s, _ := l.Accept()
		accepted <- s
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s := <-accepted
	b.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

func benchPairs(b *testing.B, run func(b *testing.B, c, s net.Conn)) {
	b.Run("rsocket", func(b *testing.B) {
		c, s := pair(b, benchOptions, benchDevice)
		run(b, c, s)
	})
	b.Run("tcp", func(b *testing.B) {
		c, s := tcpPair(b)
		run(b, c, s)
	})
}

// BenchmarkPingPong is an 8-byte request and reply: one op is a round trip.
func BenchmarkPingPong(b *testing.B) {
	benchPairs(b, func(b *testing.B, c, s net.Conn) {
		go func() {
			buf := make([]byte, 8)
			for {
				if _, err := io.ReadFull(s, buf); err != nil {
					return
				}
				if _, err := s.Write(buf); err != nil {
					return
				}
			}
		}()
		buf := make([]byte, 8)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStream writes 64 KiB or 1 MiB at a time one way, with rstream's buffers (1 MiB
// rings); the reader reads as much at a time. "rsocket-buffer" writes from a registered
// Buffer (no copy into the send buffer).
func BenchmarkStream(b *testing.B) {
	o := benchOptions
	if o.RecvBuffer == 0 {
		o.RecvBuffer, o.SendBuffer = 1<<20, 1<<20
	}
	for _, size := range []int{64 << 10, 1 << 20} {
		name := fmt.Sprintf("%dKiB", size>>10)
		b.Run(name+"/rsocket", func(b *testing.B) {
			c, s := pair(b, o, benchDevice)
			stream(b, c, s, size, func(buf []byte) error { _, err := c.Write(buf); return err })
		})
		b.Run(name+"/rsocket-buffer", func(b *testing.B) {
			c, s := pair(b, o, benchDevice)
			rb, err := c.RegisterBuffer(make([]byte, size))
			if err != nil {
				b.Fatal(err)
			}
			stream(b, c, s, size, func([]byte) error { _, err := c.WriteBuffer(rb, 0, size); return err })
		})
		b.Run(name+"/rsocket-zerocopy", func(b *testing.B) {
			// No copy either side: WriteBuffer from registered memory, WriteTo
			// (io.Copy's path) straight out of the ring.
			c, s := pair(b, o, benchDevice)
			rb, err := c.RegisterBuffer(make([]byte, size))
			if err != nil {
				b.Fatal(err)
			}
			streamTo(b, c, s, size, func([]byte) error { _, err := c.WriteBuffer(rb, 0, size); return err },
				func() { s.WriteTo(io.Discard) })
		})
		b.Run(name+"/tcp", func(b *testing.B) {
			c, s := tcpPair(b)
			stream(b, c, s, size, func(buf []byte) error { _, err := c.Write(buf); return err })
		})
	}
}

// stream runs b.N writes of size bytes from c while s reads them.
func stream(b *testing.B, c, s net.Conn, size int, write func([]byte) error) {
	streamTo(b, c, s, size, write, func() {
		buf := make([]byte, size)
		for {
			if _, err := s.Read(buf); err != nil {
				return
			}
		}
	})
}

// streamTo runs b.N writes of size bytes from c while read consumes them at s.
func streamTo(b *testing.B, c, s net.Conn, size int, write func([]byte) error, read func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		read()
	}()
	buf := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := write(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	c.Close()
	<-done
}

var (
	benchOptions = rsocket.Options{}
	benchDevice  verbs.DeviceConfig
)
