// Package pages makes memory resident before the data path needs it. A page of fresh
// anonymous memory costs a fault when it is first written: a fraction of a microsecond on
// bare metal, 10-20 µs in this project's virtual machines (go test -run NONE -bench
// FirstTouch ./verbs/), where faulting pages in with one system call costs about 0.4 µs
// each. Registration (ibv_reg_mr pins a region's pages) and the device's send batches
// use it, so that a post does not pay for its buffers' pages one fault at a time.
package pages

import "unsafe"

// Size is the page size Populate rounds to.
const Size = 4096

// Prepare makes bufs, memory the caller owns and that holds nothing yet, ready for use: it
// populates the pages, then writes a zero to each from the process itself, then has the
// kernel read each (KernelTouch). In this project's virtual machines the process's first
// access to a page costs another 3-4 µs even after the kernel populated it (against 13-20
// µs for a page neither has touched), and the kernel's first access as much again, which
// this pays here rather than in the data path.
func Prepare(bufs ...[]byte) {
	for _, buf := range bufs {
		Populate(buf)
		for i := 0; i < len(buf); i += Size {
			buf[i] = 0
		}
	}
	KernelTouch(bufs...)
}

// PopulateSlice is Populate over the backing array of s, to its capacity.
func PopulateSlice[T any](s []T) {
	var zero T
	Populate(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), cap(s)*int(unsafe.Sizeof(zero))))
}

// PrepareSlice is Prepare over the backing array of s, to its capacity, for a slice that
// holds only zero values yet: it writes the zero value of T once a page.
func PrepareSlice[T any](s []T) {
	PopulateSlice(s)
	s = s[:cap(s)]
	var zero T
	step := max(1, Size/max(1, int(unsafe.Sizeof(zero))))
	for i := 0; i < len(s); i += step {
		s[i] = zero
	}
}
