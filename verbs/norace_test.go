//go:build !race

package verbs_test

// raceEnabled reports whether the race detector is on.
const raceEnabled = false
