package msg

import (
	"context"
	"slices"
	"testing"
	"time"
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

// BenchmarkEnlargement measures what one enlargement costs, in small round trips: in a
// new job each time, ranks 0 and 1 exchange small messages, then rank 0 sends a message
// too large for the first phase (the connection toward rank 1 is enlarged) and rank 1
// answers with a small one; that first round trip, less the same round trip once
// enlarged, divided by a small round trip, is the extra_RTTs metric (median over b.N
// jobs). Each job is new, but the process is warm: this leaves out what a first message
// costs in a cold process (page faults, code not yet run).
func BenchmarkEnlargement(b *testing.B) {
	ctx := context.Background()
	var extra []float64
	for i := 0; i < b.N; i++ {
		comms := newJob(b, 2, Config{})
		big, sm := make([]byte, 4000), make([]byte, 64)
		rt := func(out, back []byte) time.Duration {
			t := time.Now()
			done := make(chan error, 1)
			go func() {
				_, err := comms[1].Recv(ctx, make([]byte, len(out)), 0, 1)
				if err == nil {
					err = comms[1].Send(ctx, back, 0, 1)
				}
				done <- err
			}()
			if err := comms[0].Send(ctx, out, 1, 1); err != nil {
				b.Fatal(err)
			}
			if _, err := comms[0].Recv(ctx, back, 1, 1); err != nil {
				b.Fatal(err)
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			return time.Since(t)
		}
		med := func(f func() time.Duration) float64 {
			var v []float64
			for range 21 {
				v = append(v, float64(f()))
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		small := med(func() time.Duration { return rt(sm, sm) })
		first := float64(rt(big, sm))
		steady := med(func() time.Duration { return rt(big, sm) })
		extra = append(extra, (first-steady)/small)
		for _, c := range comms {
			c.Close()
		}
	}
	slices.Sort(extra)
	b.ReportMetric(extra[len(extra)/2], "extra_RTTs")
}
