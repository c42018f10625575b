package cqexp

import (
	"errors"
	"testing"
	"time"
)

// The experiments run end to end at a small scale: requests flow with one and with two
// handlers, and the isolation run measures both phases. (The figures themselves are for
// bench/cmd/cqbench on a quiet machine.)
func TestExperimentsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("experiment")
	}
	for _, h := range []int{1, 2} {
		r, err := Throughput(Config{Handlers: h, Pin: true, QPs: 8, CQs: 4, Duration: 200 * time.Millisecond})
		if errors.Is(err, errors.ErrUnsupported) {
			t.Skipf("completion handlers' threads are set up on Linux only: %v", err)
		}
		if err != nil {
			t.Fatalf("%d handlers: %v", h, err)
		}
		if r.Requests == 0 || r.Events == 0 || len(r.PerHandler) != h {
			t.Fatalf("%d handlers: %+v", h, r)
		}
		for i, n := range r.PerHandler {
			if n == 0 {
				t.Errorf("%d handlers: handler %d handled nothing", h, i)
			}
		}
	}
	r, err := Isolation(IsolationConfig{CPUs: [2][]int{{0}, {0}}, FloodQPs: 8, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.Idle.Count == 0 || r.Flooded.Count == 0 || r.FloodPerSecond == 0 {
		t.Fatalf("%+v", r)
	}
}
