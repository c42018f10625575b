package netio

import (
	"errors"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/pages"
)

// SendBatch collects outgoing datagrams, each described by a list of byte slices (headers
// from the batch's own arena, payload straight from registered memory), and sends them with
// as few system calls as possible (on the portable path, one per datagram). A SendBatch is
// used by one goroutine at a time.
type SendBatch struct {
	pkts      []outPkt
	iovs      []unix.Iovec
	arena     []byte
	used      int
	msgs      []mmsghdr
	cmsg      []byte
	segs      []byte   // the adjusted last iovecs of GSO segments (Config.SegmentID), 8 bytes per datagram
	tapPieces [][]byte // a datagram's pieces for Config.Tap
	open      bool
	cur       outPkt
	flat      []byte // the portable path's copy of a datagram in several pieces
}

type outPkt struct {
	dst        *Addr
	iov0, iov1 int
	length     int
	src        uint8 // the Conn's source (socket) it leaves from
}

// NewSendBatch allocates a batch for up to maxPkts datagrams, maxIovs slices in all and an
// arena of arenaBytes for headers. Its memory is resident from the start (pages.Prepare):
// otherwise the first send of each size faults in the pages it reaches, in a post.
func NewSendBatch(maxPkts, maxIovs, arenaBytes int) *SendBatch {
	b := &SendBatch{
		pkts:  make([]outPkt, 0, maxPkts),
		iovs:  make([]unix.Iovec, 0, maxIovs),
		arena: make([]byte, arenaBytes),
		msgs:  make([]mmsghdr, maxPkts),
		cmsg:  make([]byte, maxPkts*cmsgSlot),
		segs:  make([]byte, 8*maxPkts),
	}
	pages.PrepareSlice(b.pkts)
	pages.PrepareSlice(b.iovs)
	pages.PrepareSlice(b.msgs)
	pages.Prepare(b.arena)
	pages.Prepare(b.cmsg)
	pages.Prepare(b.segs)
	return b
}

// Len returns the number of complete datagrams in the batch.
func (b *SendBatch) Len() int { return len(b.pkts) }

// Room reports whether one more datagram of up to iovs slices and arena bytes fits.
func (b *SendBatch) Room(iovs, arena int) bool {
	return len(b.pkts) < cap(b.pkts) && len(b.iovs)+iovs <= cap(b.iovs) && b.used+(arena+7)&^7 <= len(b.arena)
}

// Alloc returns n bytes from the arena, valid until Reset. It panics if Room was not
// checked, which is a programming error.
func (b *SendBatch) Alloc(n int) []byte {
	p := b.arena[b.used : b.used+n : b.used+n]
	b.used += (n + 7) &^ 7
	return p
}

// Begin starts a datagram to dst. dst must stay valid until the batch is sent.
func (b *SendBatch) Begin(dst *Addr) { b.BeginFrom(dst, 0) }

// BeginFrom starts a datagram to dst that leaves from the Conn's source src (0: its own
// socket; see Config.SourcePorts).
func (b *SendBatch) BeginFrom(dst *Addr, src int) {
	b.cur = outPkt{dst: dst, iov0: len(b.iovs), src: uint8(src)}
	b.open = true
}

// Add appends p to the current datagram. Empty slices are skipped.
func (b *SendBatch) Add(p []byte) {
	if len(p) == 0 {
		return
	}
	var v unix.Iovec
	v.Base = &p[0]
	v.SetLen(len(p))
	b.iovs = append(b.iovs, v)
	b.cur.length += len(p)
}

// End completes the current datagram.
func (b *SendBatch) End() {
	b.cur.iov1 = len(b.iovs)
	b.pkts = append(b.pkts, b.cur)
	b.open = false
}

// Reset empties the batch (it also drops references to payload memory).
func (b *SendBatch) Reset() {
	b.pkts = b.pkts[:0]
	clear(b.iovs[:len(b.iovs)])
	b.iovs = b.iovs[:0]
	b.used = 0
}

// packet returns datagram i as a flat copy (used by the fault injector only).
func (b *SendBatch) packet(i int, dst []byte) []byte {
	p := &b.pkts[i]
	dst = dst[:0]
	for _, v := range b.iovs[p.iov0:p.iov1] {
		dst = append(dst, unsafe.Slice(v.Base, int(v.Len))...)
	}
	return dst
}

// Send transmits every datagram in b and resets it. Consecutive equal-sized datagrams to
// the same destination go out as one GSO message; all messages go in one sendmmsg where
// the kernel accepts them (on the portable path, one sendmsg per datagram). Datagrams the kernel refuses are counted and dropped, as a
// network would drop them; the only error returned is ErrClosed. With fault injection the
// datagrams pass through the injector first.
func (c *Conn) Send(b *SendBatch) error {
	defer b.Reset()
	if len(b.pkts) == 0 {
		return nil
	}
	if c.faults != nil {
		return c.faults.send(b)
	}
	return c.send(b)
}

// addIov appends an iovec (a piece of a datagram) as it is.
func (b *SendBatch) addIov(v unix.Iovec) {
	b.iovs = append(b.iovs, v)
	b.cur.length += int(v.Len)
}

// send transmits b (without resetting it).
func (c *Conn) send(b *SendBatch) error {
	if len(b.pkts) == 0 {
		return nil
	}
	if !c.mmsg {
		return c.sendEach(b)
	}
	return c.sendMmsg(b)
}

// sendEach transmits b one datagram at a time, each with one sendmsg through the net
// package (which waits in the poller for buffer space): the portable path. A datagram in
// several pieces is gathered into the batch's flat buffer first. Datagrams the kernel
// refuses are counted and dropped; the only error returned is ErrClosed.
func (c *Conn) sendEach(b *SendBatch) error {
	for i := range b.pkts {
		if c.closed.Load() {
			return ErrClosed
		}
		if c.tap != nil {
			c.tapped(b, i, i+1)
		}
		p := &b.pkts[i]
		var d []byte
		if p.iov1-p.iov0 == 1 {
			v := b.iovs[p.iov0]
			d = unsafe.Slice(v.Base, int(v.Len))
		} else {
			b.flat = b.packet(i, b.flat)
			d = b.flat
		}
		s := c.source(p.src)
		_, _, err := s.uc.WriteMsgUDPAddrPort(d, nil, p.dst.AP)
		if err != nil && s.queuedSendError(unwrapErrno(err)) {
			// An ICMP report's error, not the datagram's (see sendMsgs): send it again.
			s.Doorbell(0)
			_, _, err = s.uc.WriteMsgUDPAddrPort(d, nil, p.dst.AP)
		}
		switch {
		case err == nil:
			c.SendCalls.Add(1)
		case errors.Is(err, net.ErrClosed):
			return ErrClosed
		default:
			c.SendErrors.Add(1)
		}
	}
	return nil
}

// tapped hands datagrams i..j-1, which go out as one message (segments 0.. of a GSO send
// if more than one), to tap.
func (c *Conn) tapped(b *SendBatch, i, j int) {
	for k := i; k < j; k++ {
		q := &b.pkts[k]
		b.tapPieces = b.tapPieces[:0]
		for _, v := range b.iovs[q.iov0:q.iov1] {
			b.tapPieces = append(b.tapPieces, unsafe.Slice(v.Base, int(v.Len)))
		}
		c.tap(c.source(q.src).local, q.dst.AP, uint16(k-i), b.tapPieces)
	}
	clear(b.tapPieces)
}

// unwrapErrno returns the system call's errno in err, a net package error, or err.
func unwrapErrno(err error) error {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return err
}
