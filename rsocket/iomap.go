package rsocket

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/softrnic/softrnic/verbs"
)

// Direct writes into mapped buffers: librdmacm's riomap and riowrite. A side maps a
// buffer of its own (IOMap) into an entry of the peer's iomap table, under an offset of
// its choosing; the peer then writes into it with IOWrite at that offset, as plain RDMA
// WRITEs that go around the stream and its credits. Nothing tells the mapping side that
// bytes arrived: as with rsockets, the program watches the memory (riostream waits for
// a marker in the last byte), or says so through the stream, whose data arrives after
// every write posted before it. Only ordered mode lands a write's bytes in order.

// ioEntry is an entry of an iomap table: librdmacm's struct rs_iomap, 24 bytes
// (offset, then address, key and length) in the byte order its reader announced.
type ioEntry struct {
	Offset uint64
	sge
	valid bool
}

func putIOEntry(b []byte, e ioEntry, bigEndian bool) {
	var o binary.ByteOrder = binary.LittleEndian
	if bigEndian {
		o = binary.BigEndian
	}
	o.PutUint64(b[0:], e.Offset)
	putSGE(b[8:], e.sge, bigEndian)
}

func getIOEntry(b []byte) ioEntry {
	return ioEntry{Offset: binary.LittleEndian.Uint64(b), sge: getSGE(b[8:]), valid: true}
}

// onIOMap takes an entry the peer wrote into index of this side's table (mu held).
func (c *Conn) onIOMap(index, byteLen uint32) bool {
	if byteLen != iomapLen || int(index) >= len(c.iomaps) {
		return c.violation("an iomap entry of %d bytes at index %d of %d", byteLen, index, len(c.iomaps))
	}
	off := grantSlots*sgeLen + iomapLen*int(index)
	c.iomaps[index] = getIOEntry(c.target.Buf()[off:])
	return false
}

// Mapping is a buffer of this side mapped into the peer's iomap table: what the peer's
// IOWrite at an offset in [Offset, Offset+len(Bytes())) writes lands in it.
type Mapping struct {
	c      *Conn
	mr     *verbs.MR
	index  int
	offset int64
}

// Bytes is the mapped buffer.
func (m *Mapping) Bytes() []byte { return m.mr.Buf() }

// Offset is the offset the peer writes at to reach the buffer's first byte.
func (m *Mapping) Offset() int64 { return m.offset }

// IOMap maps buf into the next free entry of the peer's iomap table under offset (as
// riomap with PROT_WRITE): the buffer is registered for the peer to write, and the
// entry is sent to the peer, spending a credit. It fails if the peer offered no free
// entry (its IOMapSize), and in weakly-ordered mode.
func (c *Conn) IOMap(buf []byte, offset int64) (*Mapping, error) {
	if len(buf) == 0 || offset < 0 {
		return nil, c.opError("iomap", errors.New("an empty buffer or a negative offset"))
	}
	if c.Ordering() == verbs.OrderingWeak {
		return nil, c.opError("iomap", errors.New("direct writes need ordered mode: weak mode lands a write's bytes in any order"))
	}
	c.wlock.Lock()
	defer c.wlock.Unlock()
	c.flushPending() // what Write left waiting goes first
	index := -1
	for i, m := range c.peerIOMap {
		if m == nil {
			index = i
			break
		}
	}
	if index < 0 {
		return nil, c.opError("iomap", fmt.Errorf("no free entry in the peer's iomap table of %d", len(c.peerIOMap)))
	}
	mr, err := c.pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return nil, c.opError("iomap", err)
	}
	m := &Mapping{c: c, mr: mr, index: index, offset: offset}
	for {
		ready, err := c.canPost(true, false, c.wdl.wait())
		if err != nil {
			mr.DeregMR()
			return nil, err
		}
		if ready {
			break
		}
	}
	c.mu.Lock()
	t := &c.tx
	t.sqe--
	t.seq++
	c.inflight++
	c.mu.Unlock()
	scratch := c.o.SendBuffer + sgeLen
	putIOEntry(c.sbuf.Buf()[scratch:], ioEntry{Offset: uint64(offset), sge: sge{Addr: mr.Addr(), Key: mr.RKey(), Len: uint32(len(buf))}}, c.peerBE)
	c.dataSGE[0] = c.sbuf.SGE(scratch, iomapLen)
	c.dataWR[0] = verbs.SendWR{WRID: wrIOMap, SGList: c.dataSGE[:], Opcode: verbs.WRRDMAWriteWithImm,
		SendFlags: verbs.SendSignaled | verbs.SendInline, ImmData: imm(opIOMapSGL, uint32(index)),
		RemoteAddr: c.peerTarget.Addr + uint64(sgeLen)*uint64(c.peerTarget.Len) + uint64(iomapLen*index), RKey: c.peerTarget.Key}
	if err := c.qp.PostSend(c.dataWR[:]); err != nil {
		c.fail(fmt.Errorf("post an iomap entry: %w", err))
		mr.DeregMR()
		return nil, c.opError("iomap", err)
	}
	c.peerIOMap[index] = m
	return m, nil
}

// Close unmaps the buffer (riounmap): it is deregistered, so the peer's writes into it
// fail from then on; the peer is not told.
func (m *Mapping) Close() error {
	c := m.c
	c.wlock.Lock()
	defer c.wlock.Unlock()
	if c.peerIOMap[m.index] != m {
		return c.opError("close", net.ErrClosed)
	}
	c.peerIOMap[m.index] = nil
	return m.mr.DeregMR()
}

// IOWrite writes b into the peer's mapping at offset (as riowrite): plain RDMA WRITEs
// through the send buffer, outside the stream and its credits. It returns once every
// byte is posted; what the peer has not mapped ends the write with an error.
func (c *Conn) IOWrite(b []byte, offset int64) (int, error) {
	if c.Ordering() == verbs.OrderingWeak {
		return 0, c.opError("iowrite", errors.New("direct writes need ordered mode: weak mode lands a write's bytes in any order"))
	}
	c.wlock.Lock()
	defer c.wlock.Unlock()
	done := 0
	for done < len(b) {
		ready, err := c.canPost(false, true, c.wdl.wait()) // posts what Write left waiting first
		if err != nil {
			return done, err
		}
		if !ready {
			continue
		}
		at := uint64(offset) + uint64(done)
		c.mu.Lock()
		var e ioEntry
		for _, x := range c.iomaps {
			if x.valid && at >= x.Offset && at-x.Offset < uint64(x.Len) {
				e = x
				break
			}
		}
		if !e.valid {
			c.mu.Unlock()
			return done, c.opError("iowrite", fmt.Errorf("offset %d is in no buffer the peer mapped", at))
		}
		t := &c.tx
		size := uint32(c.o.SendBuffer)
		n := min(uint32(len(b)-done), maxMessage, t.avail, size-t.head, uint32(uint64(e.Len)-(at-e.Offset)))
		off := t.head
		t.head = (t.head + n) % size
		t.avail -= n
		t.sqe--
		t.dataOut++
		c.inflight++
		c.mu.Unlock()
		copy(c.sbuf.Buf()[off:], b[done:done+int(n)])
		c.dataSGE[0] = c.sbuf.SGE(int(off), int(n))
		c.dataWR[0] = verbs.SendWR{WRID: wrData | uint64(n), SGList: c.dataSGE[:], Opcode: verbs.WRRDMAWrite,
			SendFlags: verbs.SendSignaled, RemoteAddr: e.Addr + (at - e.Offset), RKey: e.Key}
		if int(n) <= c.o.InlineSize {
			c.dataWR[0].SendFlags |= verbs.SendInline
		}
		if err := c.qp.PostSend(c.dataWR[:]); err != nil {
			c.fail(fmt.Errorf("post a direct write: %w", err))
			return done, c.opError("iowrite", err)
		}
		done += int(n)
	}
	return done, nil
}

// canPost says whether a message may be posted now (wlock held): a send WR free, and a
// credit if it spends one, and send-buffer space if it takes some; if not, it waits
// for a change (false, nil: look again), the deadline dl or the connection's end.
func (c *Conn) canPost(credit, sbuf bool, dl <-chan struct{}) (bool, error) {
	c.mu.Lock()
	t := &c.tx
	if err := c.writeErrLocked(dl); err != nil {
		c.mu.Unlock()
		return false, c.opError("write", err)
	}
	if sbuf && t.pend > 0 {
		// Bytes a Write left waiting hold the send buffer's head: they go first.
		if t.canSend() {
			return false, c.postPendLocked()
		}
	} else if t.sqe > 0 && (!credit || t.seq != t.seqComp) && (!sbuf || t.avail > 0) {
		c.mu.Unlock()
		return true, nil
	}
	c.mu.Unlock()
	if err := c.waitEvent(c.wwake, dl); err != nil {
		return false, c.opError("write", err)
	}
	return false, nil
}
