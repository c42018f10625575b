package netio

import (
	"encoding/binary"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RecvFD performs one non-blocking recvmmsg on fd. It returns the number of datagrams
// (0 when none are queued) and a non-nil error only for real failures.
//
// The call is made without telling the scheduler (RawSyscall6, as for sendmmsg in
// Conn.sendMsgs): with MSG_DONTWAIT it never sleeps, and a busy poller makes it several
// times per message, where the runtime's entry and exit bookkeeping cost about 2 % of a
// send_lat round trip (perf: exitsyscall and reentersyscall).
func (b *RecvBatch) RecvFD(fd int) (int, error) {
	// The kernel writes a header back only for a datagram it delivered (a receive that
	// fails writes nothing), so only the last call's need their sizes restored.
	for i := range b.msgs[:b.dirty] {
		h := &b.msgs[i].hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(cmsgSlot)
		h.Flags = 0
	}
	b.dirty = 0
	r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.msgs[0])),
		uintptr(len(b.msgs)), unix.MSG_DONTWAIT, 0, 0)
	runtime.KeepAlive(b)
	if e != 0 {
		b.n = 0
		if isAgain(e) || e == unix.EINTR {
			return 0, nil
		}
		return 0, e
	}
	b.n, b.dirty = int(r), int(r)
	return b.n, nil
}

// peekFD looks for a datagram queued on fd: a zero-length recvfrom with MSG_PEEK, made
// without telling the scheduler as RecvFD's is (with MSG_DONTWAIT it never sleeps). It
// returns 0 if one is queued, EAGAIN if none, or the error the peek returned.
func peekFD(fd int) syscall.Errno {
	_, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), 0, 0, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return e
}

// groSegment returns the segment size in a datagram's control messages cm (its UDP_GRO
// message), or 0 if there is none.
func groSegment(cm []byte) (segSize int) {
	for len(cm) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&cm[0]))
		ln := int(h.Len)
		if ln < unix.SizeofCmsghdr || ln > len(cm) {
			break
		}
		if h.Level == unix.IPPROTO_UDP && h.Type == unix.UDP_GRO && ln >= unix.SizeofCmsghdr+2 {
			d := cm[unix.SizeofCmsghdr:ln]
			if len(d) >= 4 {
				segSize = int(binary.NativeEndian.Uint32(d))
			} else {
				segSize = int(binary.NativeEndian.Uint16(d))
			}
		}
		step := (ln + 7) &^ 7
		if step > len(cm) {
			break
		}
		cm = cm[step:]
	}
	return segSize
}
