//go:build !linux

package netio

// RecvFD receives up to one datagram per slot of b from fd, one non-blocking recvmsg each
// (this system has no recvmmsg that Listen uses). It returns the number of datagrams (0
// when none are queued) and a non-nil error only for real failures.
func (b *RecvBatch) RecvFD(fd int) (int, error) { return b.recvEach(fd) }

// groSegment returns 0: there is no UDP GRO here, and the portable path asks for no
// control messages.
func groSegment([]byte) int { return 0 }
