package pages

import (
	"bytes"
	"testing"
)

// Populate leaves the contents as they were, including the bytes that share its first
// and last pages; Prepare and PrepareSlice leave fresh memory zero.
func TestPopulateKeepsContents(t *testing.T) {
	buf := make([]byte, 5*Size)
	for i := range buf {
		buf[i] = byte(i*7 + 3)
	}
	want := bytes.Clone(buf)
	Populate(buf[100 : 3*Size+5])
	Populate(buf[:0])
	if !bytes.Equal(buf, want) {
		t.Fatal("Populate changed the memory")
	}
	type rec struct {
		P *int
		N [40]byte
	}
	PopulateSlice(make([]rec, 0, 300))
	fresh := make([]byte, 3*Size+17)
	Prepare(fresh)
	if !bytes.Equal(fresh, make([]byte, len(fresh))) {
		t.Fatal("Prepare wrote something other than zeros")
	}
	recs := make([]rec, 0, 300)
	PrepareSlice(recs)
	for _, r := range recs[:cap(recs)] {
		if r != (rec{}) {
			t.Fatal("PrepareSlice wrote something other than zero values")
		}
	}
}

// KernelTouch reads only: the contents stay as they were, whatever buf's alignment and
// length (empty, within one page, across many, more pages than one writev takes).
func TestKernelTouchKeepsContents(t *testing.T) {
	buf := make([]byte, 1100*Size+300)
	for i := range buf {
		buf[i] = byte(i*13 + 5)
	}
	want := bytes.Clone(buf)
	for _, r := range [][2]int{{0, 0}, {5, 6}, {100, 200}, {Size - 1, Size + 1}, {7, 3*Size + 9}, {0, len(buf)}, {333, len(buf) - 1}} {
		KernelTouch(buf[r[0]:r[1]])
	}
	if !bytes.Equal(buf, want) {
		t.Fatal("KernelTouch changed the memory")
	}
}
