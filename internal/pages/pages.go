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

// PopulateSlice is Populate over the backing array of s, to its capacity.
func PopulateSlice[T any](s []T) {
	var zero T
	Populate(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), cap(s)*int(unsafe.Sizeof(zero))))
}
