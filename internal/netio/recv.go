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
// It returns the number of datagrams and a non-nil error only for a real failure before
// the first one.
func (b *RecvBatch) recvEach(fd int) (int, error) {
	n := 0
	for n < len(b.msgs) {
		r, _, flags, from, err := unix.Recvmsg(fd, b.bufs[n], nil, unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if n > 0 || err == unix.EAGAIN || err == unix.EWOULDBLOCK {
				break
			}
			b.n = 0
			return 0, err
		}
		m := &b.msgs[n]
		m.n = uint32(r)
		m.hdr.Flags = int32(flags)
		m.hdr.SetControllen(0)
		b.setSender(n, from)
		n++
	}
	b.n = n
	return n, nil
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
// queued and ErrClosed after Close.
func (c *Conn) Poll(b *RecvBatch) (int, error) {
	if !c.acquire() {
		return 0, ErrClosed
	}
	var n int
	var err error
	if c.mmsg {
		n, err = b.RecvFD(c.fd)
	} else {
		n, err = b.recvEach(c.fd)
	}
	c.release()
	if n > 0 {
		c.RecvCalls.Add(1)
		c.countTrunc(b)
	}
	return n, err
}

// Pending reports whether a datagram is queued, without receiving it or waiting (a
// zero-length peek). A caller that must take a lock to receive can look first and leave
// the lock alone while nothing is queued. It returns false after Close.
func (c *Conn) Pending() bool {
	if !c.acquire() {
		return false
	}
	p := peekFD(c.fd)
	c.release()
	return p
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
