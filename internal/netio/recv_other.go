//go:build !linux

package netio

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// RecvFD receives up to one datagram per slot of b from fd, one non-blocking recvmsg each
// (this system has no recvmmsg that Listen uses). It returns the number of datagrams (0
// when none are queued) and a non-nil error only for real failures.
func (b *RecvBatch) RecvFD(fd int) (int, error) {
	n, err := b.recvEach(fd)
	if n > 0 {
		return n, nil
	}
	return 0, err
}

// peekFD looks for a datagram queued on fd: a zero-length recvfrom with MSG_PEEK that does
// not wait. It returns 0 if one is queued, EAGAIN if none, or the error the peek returned.
func peekFD(fd int) syscall.Errno {
	_, _, err := unix.Recvfrom(fd, nil, unix.MSG_PEEK|unix.MSG_DONTWAIT)
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return unix.EIO
}

// groSegment returns 0: there is no UDP GRO here, and the portable path asks for no
// control messages.
func groSegment([]byte) int { return 0 }
