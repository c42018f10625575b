package netio

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// setup sets the socket's options on Linux: forced buffer sizes, don't-fragment, and
// unless cfg says otherwise, recvmmsg/sendmmsg with GSO and GRO. It runs in Listen, with
// c.fd valid.
func (c *Conn) setup(cfg Config, bufsz int) error {
	// Large buffers: bursts of a window of packets per QP must not be dropped by the
	// kernel. FORCE needs CAP_NET_ADMIN; fall back to the capped form.
	if unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bufsz) != nil {
		_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, bufsz)
	}
	if unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, bufsz) != nil {
		_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, bufsz)
	}
	c.rcvbuf, _ = unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	c.sndbuf, _ = unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
	var err error
	if !c.v6 {
		// DF on every datagram; on an unconnected socket Linux then writes IP ID 0,
		// which the ICRC covers.
		err = unix.SetsockoptInt(c.fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	} else {
		err = unix.SetsockoptInt(c.fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
	}
	if cfg.portable {
		return err // one recvmsg or sendmsg per datagram, as elsewhere
	}
	c.mmsg = true
	if !cfg.DisableGSO {
		// Probe: reading the socket's default segment size works where GSO exists.
		if _, e := unix.GetsockoptInt(c.fd, unix.IPPROTO_UDP, unix.UDP_SEGMENT); e == nil {
			c.gso = true
		}
	}
	if !cfg.DisableGRO {
		if unix.SetsockoptInt(c.fd, unix.IPPROTO_UDP, unix.UDP_GRO, 1) == nil {
			c.gro = true
		}
	}
	return err
}

// isAgain reports whether the raw calls' errno means that nothing is queued or that the
// buffer is full.
func isAgain(e syscall.Errno) bool { return e == unix.EAGAIN || e == unix.EWOULDBLOCK }
