package netio

import (
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

// sendMmsg transmits b (not empty, and without resetting it) with sendmmsg, consecutive
// equal-sized datagrams to the same destination as one GSO message.
func (c *Conn) sendMmsg(b *SendBatch) error {
	nm := 0
	runStart, runSrc := 0, uint8(0) // the messages gathered for one socket, and which
	gso := c.gso
	for i := 0; i < len(b.pkts); {
		p := &b.pkts[i]
		j := i + 1
		if gso {
			seg, total := p.length, p.length
			for j < len(b.pkts) && j-i < maxGSOSegments {
				q := &b.pkts[j]
				if q.dst != p.dst || q.src != p.src || q.length > seg || total+q.length > maxGSOBytes ||
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
			c.tapped(b, i, j)
		}
		if nm > runStart && p.src != runSrc {
			// Another socket: what was gathered for the previous one goes first.
			if err := c.source(runSrc).sendMsgs(b.msgs[runStart:nm]); err != nil {
				return err
			}
			runStart = nm
		}
		runSrc = p.src
		h := &b.msgs[nm].hdr
		h.Name = (*byte)(unsafe.Pointer(&p.dst.raw))
		h.Namelen = p.dst.rawLn
		h.Iov = &b.iovs[p.iov0]
		h.SetIovlen(b.pkts[j-1].iov1 - p.iov0)
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
	err := c.source(runSrc).sendMsgs(b.msgs[runStart:nm])
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

// sendMsgs sends msgs with sendmmsg, waiting for buffer space on EAGAIN and skipping a
// message the kernel refuses. The socket does not block (EAGAIN instead), so the call is
// made without the scheduler's bookkeeping (RawSyscall6; see RecvBatch.RecvFD).
//
// A refusal may be the socket's pending error instead of the message's own: an ICMP
// report about an earlier datagram (Linux, unreach_linux.go), which the kernel returns
// once, to the first call that looks, sending nothing. The message is then sent again
// (once), and the doorbell wakes the receive path to read the report.
func (c *Conn) sendMsgs(msgs []mmsghdr) error {
	again := false // the message at i was refused once, by what may have been a report's error
	for i := 0; i < len(msgs); {
		if !c.acquire() {
			return ErrClosed
		}
		r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(c.fd), uintptr(unsafe.Pointer(&msgs[i])),
			uintptr(len(msgs)-i), 0, 0, 0)
		c.release()
		switch {
		case e == 0:
			c.SendCalls.Add(1)
			i += int(r)
			again = false
		case e == unix.EINTR:
		case isAgain(e):
			c.WriteBlocked.Add(1)
			if err := c.waitWritable(); err != nil {
				return err
			}
		case !again && c.queuedSendError(e):
			again = true
			c.Doorbell(0)
		default:
			c.SendErrors.Add(1)
			i++
			again = false
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
