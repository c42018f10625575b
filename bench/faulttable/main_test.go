package main

import "testing"

// TestRatioPairsRounds checks that a ratio is taken within each round, then the median
// over rounds: a machine twice as fast in one round must not show as a fault's cost.
func TestRatioPairsRounds(t *testing.T) {
	clean := key{"write_bw", "none", "weak", 65536}
	faulty := key{"write_bw", "reorder=0.05", "weak", 65536}
	byRound := map[key]map[int]float64{
		clean:  {1: 1000, 2: 2000, 3: 1000},
		faulty: {1: 900, 2: 1800, 3: 950},
	}
	if got := ratio(byRound, faulty, clean); got != 0.9 {
		t.Errorf("ratio %v, want 0.9 (the median of 0.9, 0.9, 0.95)", got)
	}
	// A ratio of medians would say 950/1000 here; a round missing on one side is left out.
	delete(byRound[clean], 3)
	if got := ratio(byRound, faulty, clean); got != 0.9 {
		t.Errorf("ratio with a round missing %v, want 0.9", got)
	}
	if got := ratio(byRound, key{}, clean); got != 0 {
		t.Errorf("ratio of nothing %v, want 0", got)
	}
}
