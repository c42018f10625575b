package transport

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/wire"
)

// Pacing asks the requester to wait until its share has earned it a WQE again: never
// less than the QP's minimum RNR timer, never more than maxPace.
func TestPaceTimer(t *testing.T) {
	q := &QP{lq: &limitQueue{}}
	q.attr.MinRNRTimer = 1 // 10 µs
	for _, c := range []struct {
		share, tokens float64
		want          time.Duration
	}{
		{0, -3, 10 * time.Microsecond},         // no share: the minimum
		{1e6, -0.5, 10 * time.Microsecond},     // 1.5 µs: the minimum
		{100, -0.5, 15360 * time.Microsecond},  // 15 ms → 15.36 ms
		{1000, 0, 1280 * time.Microsecond},     // 1 ms → 1.28 ms
		{0.01, -10, 122880 * time.Microsecond}, // capped at 100 ms → 122.88 ms
	} {
		q.share, q.lq.tokens = c.share, c.tokens
		if got := wire.RNRTimer(q.paceTimer()); got != c.want {
			t.Errorf("share %v tokens %v: timer %v, want %v", c.share, c.tokens, got, c.want)
		}
	}
	q.attr.MinRNRTimer = 0 // 655 ms: already longer than any pace
	q.share, q.lq.tokens = 100, -0.5
	if got := q.paceTimer(); got != 0 {
		t.Errorf("min timer 0: code %d", got)
	}
}
