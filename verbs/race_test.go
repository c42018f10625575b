//go:build race

package verbs_test

// raceEnabled reports whether the race detector is on (it slows the engine down about
// tenfold, so the soak test moves less data and waits longer for acknowledgements).
const raceEnabled = true
