package pages

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// touchBatch is how many pages one writev reads a byte of (IOV_MAX is 1024).
const touchBatch = 1024

// KernelTouch has the kernel read one byte of each page of bufs through the path a send
// system call reads user memory by (writev into a pipe, then the bytes read back out and
// dropped). In this project's virtual machines (PVM guests) the kernel's first access to a
// page of the process costs a fault of its own, 3-4 µs, even after the process and
// MADV_POPULATE_WRITE touched it: a region that sends read from pays it once a page on
// its first pass otherwise (write_bw -s 1M from a fresh 128 MiB buffer: 1,350-1,520
// MiB/s for its first 300 MiB, 3,400-3,580 with the pages touched so). bufs are only
// read. Where a pipe cannot be made, it does nothing: the pages fault in on first use.
func KernelTouch(bufs ...[]byte) {
	var p [2]int
	if unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK) != nil {
		return
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	for _, buf := range bufs {
		if !touchThrough(p, buf) {
			return
		}
	}
}

// touchThrough is KernelTouch of buf through pipe p; false if the pipe failed.
func touchThrough(p [2]int, buf []byte) bool {
	var iov [touchBatch]unix.Iovec
	var sink [touchBatch]byte
	base := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	for off := 0; off < len(buf); {
		n := 0
		for ; n < touchBatch && off < len(buf); n++ {
			iov[n].Base = &buf[off]
			iov[n].SetLen(1)
			// The next page's first byte (or buf's last page's, if buf starts mid-page).
			off += Size - int((base+uintptr(off))&(Size-1))
		}
		w, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(p[1]), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
		if e != 0 {
			return false
		}
		for r := int(w); r > 0; {
			k, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(p[0]), uintptr(unsafe.Pointer(&sink[0])), uintptr(min(r, len(sink))))
			if e != 0 || k == 0 {
				return false
			}
			r -= int(k)
		}
	}
	runtime.KeepAlive(buf)
	return true
}
