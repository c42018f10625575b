package netio

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RecvBatch holds preallocated buffers and headers for one recvmmsg call.
type RecvBatch struct {
	msgs  []mmsghdr
	iovs  []unix.Iovec
	bufs  [][]byte
	names []unix.RawSockaddrInet6
	cmsg  []byte
	n     int
	v6    bool
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
	}
	mem := make([]byte, n*bufSize)
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

// Len returns how many datagrams the last receive filled.
func (b *RecvBatch) Len() int { return b.n }

// Datagram returns datagram i of the last receive: its bytes, the GRO segment size (0 if
// it is a single datagram) and the sender.
func (b *RecvBatch) Datagram(i int) (data []byte, segSize int, from netip.AddrPort) {
	m := &b.msgs[i]
	data = b.bufs[i][:m.n]
	if m.hdr.Controllen >= unix.SizeofCmsghdr {
		cm := b.cmsg[i*cmsgSlot : i*cmsgSlot+int(m.hdr.Controllen)]
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

// RecvFD performs one non-blocking recvmmsg on fd. It returns the number of datagrams
// (0 when none are queued) and a non-nil error only for real failures.
func (b *RecvBatch) RecvFD(fd int) (int, error) {
	for i := range b.msgs {
		h := &b.msgs[i].hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(cmsgSlot)
		h.Flags = 0
	}
	r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.msgs[0])),
		uintptr(len(b.msgs)), unix.MSG_DONTWAIT, 0, 0)
	runtime.KeepAlive(b)
	if e != 0 {
		b.n = 0
		if isAgain(e) || e == unix.EINTR {
			return 0, nil
		}
		return 0, e
	}
	b.n = int(r)
	return b.n, nil
}

// Poll receives what is queued without waiting. It returns 0, nil when nothing is
// queued and ErrClosed after Close.
func (c *Conn) Poll(b *RecvBatch) (int, error) {
	if !c.acquire() {
		return 0, ErrClosed
	}
	n, err := b.RecvFD(c.fd)
	c.release()
	if n > 0 {
		c.RecvCalls.Add(1)
		c.countTrunc(b)
	}
	return n, err
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
