package pages

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Populate faults in the pages of buf, writable, without changing its contents (madvise
// MADV_POPULATE_WRITE, Linux 5.14 and later). The range is rounded out to whole pages:
// the neighbours' contents are not changed either. On kernels without
// MADV_POPULATE_WRITE the pages fault in on first use, as without it.
func Populate(buf []byte) {
	if len(buf) == 0 {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(buf))) &^ (Size - 1)
	end := (uintptr(unsafe.Pointer(unsafe.SliceData(buf))) + uintptr(len(buf)) + Size - 1) &^ (Size - 1)
	_, _, _ = unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_POPULATE_WRITE)
}
