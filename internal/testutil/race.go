//go:build race

package testutil

// Race reports whether the race detector is on: it slows the engine down about tenfold,
// so a test that moves much data moves less, or leaves out what the detector cannot
// follow.
const Race = true
