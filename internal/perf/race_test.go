//go:build race

package perf

// raceEnabled: the race detector is on (see raceSkips).
const raceEnabled = true
