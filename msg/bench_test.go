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

// BenchmarkEnlargement measures what one enlargement costs, in small round trips. Each
// iteration runs two new jobs of ranks 0 and 1, one with the default phases and one whose
// first phase is 16 KiB already: in each, the ranks exchange small messages, then rank 0
// sends a 4,000-byte message (in the first job it enlarges the connection) and rank 1
// answers with a small one. enlarge_RTTs is the enlarging first round trip less the same
// first round trip without an enlargement, over a small round trip (medians over b.N
// iterations): what a first large message costs anyway (a first GSO send, buffers not
// used before) is in both. extra_RTTs is the enlarging first round trip less the same round
// trip once enlarged. The process is warm: this leaves out what the first enlargement of
// a cold process also pays (bench/enlarge.sh measures that, with fresh processes).
func BenchmarkEnlargement(b *testing.B) {
	ctx := context.Background()
	var extra, firstEnl, firstBig, smalls []float64
	big, sm := make([]byte, 4000), make([]byte, 64)
	for i := range big {
		big[i] = byte(i) // resident before anything is timed
	}
	// job times, in a new job, a small round trip (median), the first round trip of a
	// large message and the same round trip after it (median).
	job := func(cfg Config) (small, first, steady float64) {
		comms := newJob(b, 2, cfg)
		defer func() {
			for _, c := range comms {
				c.Close()
			}
		}()
		in := make([]byte, len(big))
		rt := func(out, back []byte) time.Duration {
			t := time.Now()
			done := make(chan error, 1)
			go func() {
				_, err := comms[1].Recv(ctx, in[:len(out)], 0, 1)
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
			return median(v)
		}
		small = med(func() time.Duration { return rt(sm, sm) })
		first = float64(rt(big, sm))
		steady = med(func() time.Duration { return rt(big, sm) })
		return small, first, steady
	}
	for i := 0; i < b.N; i++ {
		small, first, steady := job(Config{})
		extra, firstEnl, smalls = append(extra, (first-steady)/small), append(firstEnl, first), append(smalls, small)
		small, first, _ = job(Config{Phases: []int{16 << 10, 128 << 10}})
		firstBig, smalls = append(firstBig, first), append(smalls, small)
	}
	b.ReportMetric((median(firstEnl)-median(firstBig))/median(smalls), "enlarge_RTTs")
	b.ReportMetric(median(extra), "extra_RTTs")
}

// median returns the median of v (sorted in place).
func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}
