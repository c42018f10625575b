//go:build !linux

package pages

// Populate does nothing where the kernel offers no way to fault pages in without
// touching them: they fault in on first use.
func Populate([]byte) {}

// KernelTouch does nothing here: the pages fault in on first use.
func KernelTouch(...[]byte) {}
