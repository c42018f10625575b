//go:build !linux

package verbs

// populate is a no-op where the kernel offers no way to fault in pages without touching
// them: they fault in on first use.
func populate([]byte) {}
