package netio

import (
	"net/netip"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Limits of one GSO super-datagram.
const (
	maxGSOSegments = 64
	maxGSOBytes    = 65000
	maxIovPerMsg   = 1024
)

// SendBatch collects outgoing datagrams, each described by a list of byte slices (headers
// from the batch's own arena, payload straight from registered memory), and sends them with
// as few system calls as possible. A SendBatch is used by one goroutine at a time.
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
}

type outPkt struct {
	dst        *Addr
	iov0, iov1 int
	length     int
}

// NewSendBatch allocates a batch for up to maxPkts datagrams, maxIovs slices in all and an
// arena of arenaBytes for headers.
func NewSendBatch(maxPkts, maxIovs, arenaBytes int) *SendBatch {
	return &SendBatch{
		pkts:  make([]outPkt, 0, maxPkts),
		iovs:  make([]unix.Iovec, 0, maxIovs),
		arena: make([]byte, arenaBytes),
		msgs:  make([]mmsghdr, maxPkts),
		cmsg:  make([]byte, maxPkts*cmsgSlot),
		segs:  make([]byte, 8*maxPkts),
	}
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
func (b *SendBatch) Begin(dst *Addr) {
	b.cur = outPkt{dst: dst, iov0: len(b.iovs)}
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
// the kernel accepts them. Datagrams the kernel refuses are counted and dropped, as a
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
	nm := 0
	gso := c.gso
	for i := 0; i < len(b.pkts); {
		p := &b.pkts[i]
		j := i + 1
		if gso {
			seg, total := p.length, p.length
			for j < len(b.pkts) && j-i < maxGSOSegments {
				q := &b.pkts[j]
				if q.dst != p.dst || q.length > seg || total+q.length > maxGSOBytes ||
					q.iov1-p.iov0 > maxIovPerMsg || b.pkts[j-1].length != seg {
					break
				}
				total += q.length
				j++
			}
		}
		if j-i > 1 && c.segID != nil && p.dst.v4 {
			b.segmentIDs(c.segID, i, j)
		}
		if c.tap != nil {
			b.tapped(c.tap, i, j)
		}
		h := &b.msgs[nm].hdr
		h.Name = (*byte)(unsafe.Pointer(&p.dst.raw))
		h.Namelen = p.dst.rawLn
		h.Iov = &b.iovs[p.iov0]
		h.Iovlen = uint64(b.pkts[j-1].iov1 - p.iov0)
		h.Flags = 0
		if j-i > 1 {
			cm := b.cmsg[nm*cmsgSlot : nm*cmsgSlot+unix.CmsgSpace(2)]
			ch := (*unix.Cmsghdr)(unsafe.Pointer(&cm[0]))
			ch.Level = unix.IPPROTO_UDP
			ch.Type = unix.UDP_SEGMENT
			ch.SetLen(unix.CmsgLen(2))
			*(*uint16)(unsafe.Pointer(&cm[unix.SizeofCmsghdr])) = uint16(p.length)
			h.Control = &cm[0]
			h.SetControllen(len(cm))
			c.GSOSends.Add(1)
		} else {
			h.Control = nil
			h.Controllen = 0
		}
		nm++
		i = j
	}
	err := c.sendMsgs(b.msgs[:nm])
	runtime.KeepAlive(b)
	return err
}

// segmentIDs lets fix adjust datagrams i+1..j-1, which go out as segments 1.. of one GSO
// send. Each one's last iovec (the trailer: pad and ICRC, at most 8 bytes) is copied to the
// batch's own room, adjusted there and sent from there: the datagram's memory is left as it
// was, so that a duplicate the fault injector made of it (sharing it) is adjusted for its
// own place.
func (b *SendBatch) segmentIDs(fix func([]byte, int, uint16), i, j int) {
	for k := i + 1; k < j; k++ {
		q := &b.pkts[k]
		v := &b.iovs[q.iov1-1]
		n := int(v.Len)
		if n < 4 || n > 8 {
			continue // not a trailer as softrnic builds them
		}
		last := b.segs[8*k : 8*k+n]
		copy(last, unsafe.Slice(v.Base, n))
		fix(last[n-4:], q.length, uint16(k-i))
		v.Base = &last[0]
	}
}

// tapped hands datagrams i..j-1, which go out as one message (segments 0.. of a GSO send
// if more than one), to tap.
func (b *SendBatch) tapped(tap func(netip.AddrPort, uint16, [][]byte), i, j int) {
	for k := i; k < j; k++ {
		q := &b.pkts[k]
		b.tapPieces = b.tapPieces[:0]
		for _, v := range b.iovs[q.iov0:q.iov1] {
			b.tapPieces = append(b.tapPieces, unsafe.Slice(v.Base, int(v.Len)))
		}
		tap(q.dst.AP, uint16(k-i), b.tapPieces)
	}
	clear(b.tapPieces)
}

// sendMsgs sends msgs with sendmmsg, waiting for buffer space on EAGAIN and skipping a
// message the kernel refuses.
func (c *Conn) sendMsgs(msgs []mmsghdr) error {
	for i := 0; i < len(msgs); {
		if !c.acquire() {
			return ErrClosed
		}
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(c.fd), uintptr(unsafe.Pointer(&msgs[i])),
			uintptr(len(msgs)-i), 0, 0, 0)
		c.release()
		switch {
		case e == 0:
			c.SendCalls.Add(1)
			i += int(r)
		case e == unix.EINTR:
		case isAgain(e):
			c.WriteBlocked.Add(1)
			if err := c.waitWritable(); err != nil {
				return err
			}
		default:
			c.SendErrors.Add(1)
			i++
		}
	}
	return nil
}

// waitWritable parks in the network poller until the socket is writable.
func (c *Conn) waitWritable() error {
	first := true
	err := c.rc.Write(func(fd uintptr) bool {
		if first {
			first = false
			return false
		}
		return true
	})
	if c.closed.Load() {
		return ErrClosed
	}
	return err
}
