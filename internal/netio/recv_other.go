//go:build !linux

package netio

import "golang.org/x/sys/unix"

// RecvFD receives up to one datagram per slot of b from fd, one non-blocking recvmsg each
// (this system has no recvmmsg that Listen uses). It returns the number of datagrams (0
// when none are queued) and a non-nil error only for real failures.
func (b *RecvBatch) RecvFD(fd int) (int, error) { return b.recvEach(fd) }

// peekFD reports whether a datagram is queued on fd: a zero-length recvfrom with MSG_PEEK
// that does not wait. An error other than "nothing queued" reports true: the receive
// that follows reports it.
func peekFD(fd int) bool {
	_, _, err := unix.Recvfrom(fd, nil, unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return err != unix.EAGAIN && err != unix.EWOULDBLOCK
}

// groSegment returns 0: there is no UDP GRO here, and the portable path asks for no
// control messages.
func groSegment([]byte) int { return 0 }
