package netio

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// setup sets the socket's options on Linux: forced buffer sizes, don't-fragment, ICMP
// reports (IP_RECVERR: see askForReports), and unless cfg says otherwise,
// recvmmsg/sendmmsg with GSO and GRO. It runs in Listen, with
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
	if !cfg.sendOnly {
		c.askForReports()
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

// CanSteer reports whether SteerByQP can work here (Linux: classic BPF reuse-port
// programs, since 4.5).
const CanSteer = true

// SteerByQP attaches to c's reuse-port group (Conns bound to one address and port with
// Config.ReusePort) a classic BPF program that hands each datagram to the group's socket
// number DestQP mod queues, DestQP being the 24-bit destination QP of the RoCEv2 base
// transport header that starts the UDP payload (bytes 5-7): a NIC's receive-side steering
// by QP. Sockets are numbered in the order they were bound; a datagram too short to hold
// a BTH goes to socket 0. It reports an error where the kernel lacks reuse-port programs.
func (c *Conn) SteerByQP(queues int) error {
	if queues < 1 || queues > 1<<16 {
		return fmt.Errorf("netio: %d queues", queues)
	}
	// The program runs with the packet's data starting at the UDP payload.
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4},         // A = BTH bytes 4-7 (big-endian)
		{Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: 0xFFFFFF}, // A = DestQP
		{Code: unix.BPF_ALU | unix.BPF_MOD | unix.BPF_K, K: uint32(queues)},
		{Code: unix.BPF_RET | unix.BPF_A},
	}
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if !c.acquire() {
		return ErrClosed
	}
	defer c.release()
	if err := unix.SetsockoptSockFprog(c.fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &fp); err != nil {
		return fmt.Errorf("netio: steering by QP (SO_ATTACH_REUSEPORT_CBPF): %w", err)
	}
	return nil
}
