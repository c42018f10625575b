package verbs

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// populate faults in the pages of buf, writable, without changing its contents
// (madvise MADV_POPULATE_WRITE, Linux 5.14 and later), as ibv_reg_mr pins a region's pages
// at registration. Without it the first remote WRITE into freshly allocated memory takes a
// page fault per 4 KiB page in the device's receive goroutine, which then falls behind the
// socket: drops and retransmissions. On kernels without MADV_POPULATE_WRITE the pages fault
// in on first use, as before.
func populate(buf []byte) {
	const page = 4096
	start := uintptr(unsafe.Pointer(unsafe.SliceData(buf))) &^ (page - 1)
	end := (uintptr(unsafe.Pointer(unsafe.SliceData(buf))) + uintptr(len(buf)) + page - 1) &^ (page - 1)
	// The range is rounded out to whole pages: the neighbours' contents are not changed
	// either.
	_, _, _ = unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_POPULATE_WRITE)
}
