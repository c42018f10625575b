package msg

import (
	"context"
	"testing"
)

// BenchmarkPingPong is osu_latency in one process: ranks 0 and 1 on their own devices,
// over the wire; ns/op is one round trip of an 8-byte message.
func BenchmarkPingPong(b *testing.B) {
	comms := newJob(b, 2, Config{})
	ctx := context.Background()
	buf0, buf1 := make([]byte, 8), make([]byte, 8)
	done := make(chan error, 1)
	go func() {
		for i := 0; i < b.N; i++ {
			if _, err := comms[1].Recv(ctx, buf1, 0, 1); err != nil {
				done <- err
				return
			}
			if err := comms[1].Send(ctx, buf1, 0, 1); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := comms[0].Send(ctx, buf0, 1, 1); err != nil {
			b.Fatal(err)
		}
		if _, err := comms[0].Recv(ctx, buf0, 1, 1); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
