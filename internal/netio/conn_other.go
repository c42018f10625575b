//go:build !linux

package netio

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// setup sets the socket's options where Linux's are missing: socket buffers as large as
// the system accepts up to bufsz, and don't-fragment where the system has a socket option
// for it (a refusal is ignored). Datagrams then go one recvmsg or sendmsg each (c.mmsg
// stays false), without GSO or GRO. It runs in Listen, with c.fd valid.
func (c *Conn) setup(_ Config, bufsz int) error {
	c.rcvbuf = setBuffer(c.fd, unix.SO_RCVBUF, bufsz)
	c.sndbuf = setBuffer(c.fd, unix.SO_SNDBUF, bufsz)
	if c.v6 {
		_ = unix.SetsockoptInt(c.fd, unix.IPPROTO_IPV6, unix.IPV6_DONTFRAG, 1)
	} else if ipDontFrag >= 0 {
		_ = unix.SetsockoptInt(c.fd, unix.IPPROTO_IP, ipDontFrag, 1)
	}
	return nil
}

// minSocketBuffer is where setBuffer stops asking for less and leaves the system's
// default.
const minSocketBuffer = 64 << 10

// setBuffer sets the socket buffer option opt (SO_RCVBUF or SO_SNDBUF) to the largest
// size up to want that the system accepts, within a quarter (darwin and the BSDs refuse a
// size above kern.ipc.maxsockbuf rather than capping it, as Linux does), and returns the
// size in effect.
func setBuffer(fd, opt, want int) int {
	for n := want; n >= minSocketBuffer; n -= n / 4 {
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, opt, n) == nil {
			break
		}
	}
	got, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, opt)
	return got
}

// CanSteer reports whether SteerByQP can work here: not on this system.
const CanSteer = false

// SteerByQP is Linux's (a classic BPF reuse-port program); elsewhere a device keeps one
// receive queue.
func (c *Conn) SteerByQP(queues int) error {
	return fmt.Errorf("netio: steering by QP on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}
