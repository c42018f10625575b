package netio

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/pages"
)

// RecvBatch holds preallocated buffers and headers for one recvmmsg call (on the portable
// path, for as many recvmsg calls).
type RecvBatch struct {
	msgs  []mmsghdr
	iovs  []unix.Iovec
	bufs  [][]byte
	names []unix.RawSockaddrInet6
	cmsg  []byte
	n     int
	v6    bool
	// dirty is how many headers from the first the last receive wrote (received
	// datagrams' lengths, flags, address and control lengths): RecvFD restores those
	// before the next call, and only those (an empty poll writes none).
	dirty int
}

const cmsgSlot = 64 // room for one UDP_GRO control message (and slack)

// NewRecvBatch allocates room for n datagrams. With GRO each buffer holds a coalesced
// datagram of up to 64 KiB; otherwise bufSize bytes.
func (c *Conn) NewRecvBatch(n, bufSize int) *RecvBatch {
	if c.gro {
		bufSize = 65536
	}
	b := &RecvBatch{
		msgs:  make([]mmsghdr, n),
		iovs:  make([]unix.Iovec, n),
		bufs:  make([][]byte, n),
		names: make([]unix.RawSockaddrInet6, n),
		cmsg:  make([]byte, n*cmsgSlot),
		v6:    c.v6,
		dirty: n, // the first RecvFD sets every header up
	}
	mem := make([]byte, n*bufSize)
	// The kernel writes received datagrams here: a page it writes for the first time costs
	// a fault on the data path (13-20 µs each in this project's virtual machines), which made
	// a device's first large message 20-60 µs slower one way than the next. The first
	// preparedBytes of each slot (a message of a few packets) are prepared now; the rest,
	// which only GRO batches of bulk traffic reach, fault in on first use.
	slots := make([][]byte, n)
	for i := range slots {
		slots[i] = mem[i*bufSize : i*bufSize+min(bufSize, preparedBytes)]
	}
	pages.Prepare(slots...) // one pass, one pipe for the kernel's touch
	for i := range b.msgs {
		b.bufs[i] = mem[i*bufSize : (i+1)*bufSize : (i+1)*bufSize]
		b.iovs[i].Base = &b.bufs[i][0]
		b.iovs[i].SetLen(bufSize)
		h := &b.msgs[i].hdr
		h.Iov = &b.iovs[i]
		h.Iovlen = 1
		h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		h.Control = &b.cmsg[i*cmsgSlot]
	}
	return b
}

// preparedBytes is how much of each receive slot NewRecvBatch prepares.
const preparedBytes = 16 << 10

// Len returns how many datagrams the last receive filled.
func (b *RecvBatch) Len() int { return b.n }

// Datagram returns datagram i of the last receive: its bytes, the GRO segment size (0 if
// it is a single datagram) and the sender.
func (b *RecvBatch) Datagram(i int) (data []byte, segSize int, from netip.AddrPort) {
	m := &b.msgs[i]
	data = b.bufs[i][:m.n]
	if m.hdr.Controllen >= unix.SizeofCmsghdr {
		segSize = groSegment(b.cmsg[i*cmsgSlot : i*cmsgSlot+int(m.hdr.Controllen)])
	}
	sa := &b.names[i]
	if !b.v6 {
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		from = netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), htons(s4.Port))
	} else {
		from = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), htons(sa.Port))
	}
	if segSize >= len(data) {
		segSize = 0
	}
	return data, segSize, from
}

// recvEach receives up to one datagram per slot of b from fd, one non-blocking recvmsg
// each, until nothing is queued: the portable path. It fills the slots as recvmmsg would
// (length, flags, sender; no control messages), so that Datagram reads them the same way.
// It returns the number of datagrams and the error that stopped it, nil if it stopped
// because nothing more was queued or b is full.
func (b *RecvBatch) recvEach(fd int) (int, error) {
	n := 0
	var stop error
	for n < len(b.msgs) {
		r, _, flags, from, err := unix.Recvmsg(fd, b.bufs[n], nil, unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if err != unix.EAGAIN && err != unix.EWOULDBLOCK {
				stop = err
			}
			break
		}
		m := &b.msgs[n]
		m.n = uint32(r)
		m.hdr.Flags = int32(flags)
		m.hdr.SetControllen(0)
		b.setSender(n, from)
		n++
	}
	b.n = n
	return n, stop
}

// setSender writes from into slot i's raw address, as recvmmsg would have.
func (b *RecvBatch) setSender(i int, from unix.Sockaddr) {
	sa := &b.names[i]
	*sa = unix.RawSockaddrInet6{}
	switch f := from.(type) {
	case *unix.SockaddrInet4:
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		s4.Family = unix.AF_INET
		s4.Port = htons(uint16(f.Port))
		s4.Addr = f.Addr
	case *unix.SockaddrInet6:
		sa.Family = unix.AF_INET6
		sa.Port = htons(uint16(f.Port))
		sa.Addr = f.Addr
	}
}

// Poll receives what is queued without waiting. It returns 0, nil when nothing is
// queued and ErrClosed after Close. On Linux it also reads the socket's ICMP reports when
// there are any (see unreach_linux.go), and calls Config.Unreachable for each closed port.
func (c *Conn) Poll(b *RecvBatch) (int, error) {
	if !c.acquire() {
		return 0, ErrClosed
	}
	if c.errq.Load() {
		c.readErrors()
	}
	n, err := c.recv(b)
	// A receive that returns the socket's pending error has received nothing: the error
	// says an ICMP report waits in the error queue. Read it and receive again (a few
	// times: more reports may come meanwhile; a real failure persists).
	for i := 0; err != nil && c.recverr && i < errorRounds; i++ {
		c.readErrors()
		n, err = c.recv(b)
	}
	c.release()
	if n > 0 {
		c.RecvCalls.Add(1)
		c.countTrunc(b)
	}
	return n, err
}

// errorRounds bounds the receives Poll makes after reading ICMP reports.
const errorRounds = 4

// recv receives what is queued into b (c acquired): with recvmmsg, or one recvmsg per
// datagram on the portable path. The error is nil when something was received; one that
// stopped the portable path after the first datagram was the socket's pending error
// (recvmmsg keeps such an error for the next call), whose report errq leaves for the
// next Poll.
func (c *Conn) recv(b *RecvBatch) (int, error) {
	if c.mmsg {
		return b.RecvFD(c.fd)
	}
	n, err := b.recvEach(c.fd)
	if n > 0 && err != nil {
		if c.recverr {
			c.errq.Store(true)
		}
		err = nil
	}
	return n, err
}

// Pending reports whether a datagram is queued, without receiving it or waiting (a
// zero-length peek). A caller that must take a lock to receive can look first and leave
// the lock alone while nothing is queued. It returns false after Close. An error (the
// socket's pending error, which the peek takes: an ICMP report, see Poll) reports true,
// so that the caller polls.
func (c *Conn) Pending() bool {
	if !c.acquire() {
		return false
	}
	e := peekFD(c.fd)
	c.release()
	if e == 0 {
		return true
	}
	if e == unix.EAGAIN || e == unix.EWOULDBLOCK {
		return false
	}
	if c.recverr {
		c.errq.Store(true)
	}
	return true
}

func (c *Conn) countTrunc(b *RecvBatch) {
	for i := 0; i < b.n; i++ {
		if b.msgs[i].hdr.Flags&unix.MSG_TRUNC != 0 {
			c.RecvTrunc.Add(1)
		}
	}
}

// Serve blocks in the runtime's network poller until the socket is readable and then calls
// ready; it repeats until ready returns true or the Conn is closed. ready should receive
// with Poll until nothing is queued (the poller is edge-triggered) before returning false.
func (c *Conn) Serve(ready func() (stop bool)) error {
	err := c.rc.Read(func(uintptr) bool { return c.closed.Load() || ready() })
	if c.closed.Load() {
		return ErrClosed
	}
	return err
}
