package netio

import (
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ICMP reports on Linux.
//
// With IP_RECVERR (IPV6_RECVERR) set, the kernel answers an ICMP error about a datagram
// the socket sent in two ways: it queues a report on the socket's error queue (read with
// recvmsg and MSG_ERRQUEUE: the datagram's destination as the address, what the ICMP
// message quotes of its UDP payload as the data, and a sock_extended_err control message
// with the ICMP type and code, the errno they mean and the address of the host that sent
// them), and it sets the socket's pending error, which the next receive, send or peek on
// the socket returns once instead of doing its work (the epoll readiness it raises wakes
// the receive goroutine). Without the option the kernel drops such errors for an
// unconnected socket.
//
// Poll reads the queue when a receive returns the pending error, and before receiving
// when errq says that a send or a peek took the pending error instead (a send then
// rings the doorbell, so that a sleeping receive goroutine looks). With no report queued
// the receive path does what it did without the option: a load of errq per Poll.

// askForReports sets IP_RECVERR (and IPV6_RECVERR on an IPv6 socket) and makes room to
// read the error queue (in Listen, c.fd valid). A refusal leaves the socket without
// reports.
func (c *Conn) askForReports() {
	err := unix.SetsockoptInt(c.fd, unix.IPPROTO_IP, unix.IP_RECVERR, 1)
	if c.v6 {
		err = unix.SetsockoptInt(c.fd, unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1)
	}
	if err != nil {
		return
	}
	c.recverr = true
	c.errBuf = make([]byte, errQuoteMax)
	c.errOOB = make([]byte, 128)
}

// errQuoteMax is the most of a datagram a report is read with: Linux's ICMP messages
// quote at most 576 bytes of IP datagram (RFC 1812), less the headers.
const errQuoteMax = 576

// maxErrorReads bounds how many reports one readErrors reads: a flood of ICMP errors
// must not keep the receive path from its datagrams. What is left is read by the next
// Poll.
const maxErrorReads = 256

// readErrors reads the reports waiting in the socket's error queue, up to maxErrorReads,
// and hands each port unreachable to c.unreachable (c acquired). Other reports (host or
// network unreachable, fragmentation needed) are counted and dropped: a datagram to a
// host that is down or a path that is broken may get through later, which the layers
// above find out by their timeouts. Reading a queue that is empty costs one system call.
func (c *Conn) readErrors() {
	if !c.recverr || !c.errMu.TryLock() {
		return // another goroutine is reading them
	}
	defer c.errMu.Unlock()
	c.errq.Store(false)
	for range maxErrorReads {
		n, oobn, _, from, err := unix.Recvmsg(c.fd, c.errBuf, c.errOOB, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return // EAGAIN: the queue is empty
		}
		c.ErrorReports.Add(1)
		if !portUnreachable(c.errOOB[:oobn]) {
			continue
		}
		dst, ok := addrPortOf(from)
		if !ok {
			continue
		}
		c.PortUnreachable.Add(1)
		if c.unreachable != nil {
			c.unreachable(dst, c.errBuf[:n])
		}
	}
	c.errq.Store(true) // more may wait: the next Poll reads on
}

// portUnreachable reports whether the control messages of an error-queue read carry an
// ICMP (ICMPv6) report of a closed port: type 3 code 3 (type 1 code 4), which the kernel
// reports as ECONNREFUSED.
func portUnreachable(oob []byte) bool {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		ln := int(h.Len)
		if ln < unix.SizeofCmsghdr || ln > len(oob) {
			return false
		}
		if (h.Level == unix.IPPROTO_IP && h.Type == unix.IP_RECVERR) ||
			(h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_RECVERR) {
			if ln < unix.SizeofCmsghdr+int(unsafe.Sizeof(unix.SockExtendedErr{})) {
				return false
			}
			var ee unix.SockExtendedErr
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&ee)), unsafe.Sizeof(ee)), oob[unix.SizeofCmsghdr:])
			if ee.Errno != uint32(unix.ECONNREFUSED) {
				return false
			}
			switch ee.Origin {
			case unix.SO_EE_ORIGIN_ICMP:
				return ee.Type == 3 && ee.Code == 3
			case unix.SO_EE_ORIGIN_ICMP6:
				return ee.Type == 1 && ee.Code == 4
			}
			return false
		}
		oob = oob[min((ln+7)&^7, len(oob)):]
	}
	return false
}

// addrPortOf returns sa's address (IPv4 unmapped) and port.
func addrPortOf(sa unix.Sockaddr) (netip.AddrPort, bool) {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), true
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port)), true
	}
	return netip.AddrPort{}, false
}

// queuedSendError reports whether err, which a send on c returned, may be the pending
// error an ICMP report set rather than the datagram's own: the errno an ICMP error is
// reported as, on a socket that asks for reports. The report then waits in the error
// queue for a receive that will not see the error: errq tells Poll to read it.
func (c *Conn) queuedSendError(err error) bool {
	if !c.recverr {
		return false
	}
	e, ok := err.(syscall.Errno)
	if !ok {
		return false
	}
	switch e {
	case unix.ECONNREFUSED, unix.EHOSTUNREACH, unix.ENETUNREACH, unix.EHOSTDOWN, unix.EMSGSIZE,
		unix.EPROTO, unix.ENOPROTOOPT, unix.EACCES:
		c.errq.Store(true)
		return true
	}
	return false
}
