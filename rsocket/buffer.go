package rsocket

import (
	"errors"
	"fmt"
	"net"

	"github.com/softrnic/softrnic/verbs"
)

// Buffer is memory registered with one connection, which WriteBuffer sends from without
// copying it into the send buffer: the registered-buffer path for large writes.
type Buffer struct {
	c  *Conn
	mr *verbs.MR
}

// RegisterBuffer registers buf for WriteBuffer on c (ibv_reg_mr with local access only:
// the peer cannot reach it). It stays registered until its Close or the connection's.
func (c *Conn) RegisterBuffer(buf []byte) (*Buffer, error) {
	if len(buf) == 0 {
		return nil, c.opError("register", errors.New("an empty buffer"))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return nil, c.opError("register", net.ErrClosed)
	}
	mr, err := c.pd.RegMR(buf, 0)
	if err != nil {
		return nil, c.opError("register", err)
	}
	b := &Buffer{c: c, mr: mr}
	if c.buffers == nil {
		c.buffers = map[*Buffer]struct{}{}
	}
	c.buffers[b] = struct{}{}
	return b, nil
}

// Bytes is the registered memory.
func (b *Buffer) Bytes() []byte { return b.mr.Buf() }

// Close deregisters the buffer. It fails while a WriteBuffer sends from it.
func (b *Buffer) Close() error {
	c := b.c
	c.wlock.Lock() // no WriteBuffer is sending from it
	defer c.wlock.Unlock()
	c.mu.Lock()
	_, ok := c.buffers[b]
	delete(c.buffers, b)
	c.mu.Unlock()
	if !ok {
		return c.opError("close", net.ErrClosed) // closed already, or with the connection
	}
	return b.mr.DeregMR()
}

// WriteBuffer writes b.Bytes()[off:off+n] to the stream straight from the registered
// memory, and returns once the peer has acknowledged every byte, so that the memory may
// be changed again. For large writes (hundreds of KiB and more) it saves Write's copy
// into the send buffer; below that Write is as fast. The write deadline bounds the wait
// for the peer's credits and ring space, not the wait for the acknowledgements: memory
// being sent from is never handed back early.
func (c *Conn) WriteBuffer(b *Buffer, off, n int) (int, error) {
	if b == nil || b.c != c {
		return 0, c.opError("write", errors.New("a buffer registered with another connection"))
	}
	if off < 0 || n < 0 || off > len(b.Bytes())-n {
		return 0, c.opError("write", fmt.Errorf("bytes [%d, %d) outside a buffer of %d", off, off+n, len(b.Bytes())))
	}
	c.wlock.Lock()
	defer c.wlock.Unlock()
	c.mu.Lock()
	_, ok := c.buffers[b]
	c.mu.Unlock()
	if !ok {
		return 0, c.opError("write", fmt.Errorf("the buffer was closed: %w", net.ErrClosed))
	}
	done := 0
	var err error
	for done < n {
		var room uint32
		if _, room, err = c.sendable(n-done, false); err != nil { // posts what Write left waiting first
			break
		}
		if room == 0 {
			continue
		}
		c.mu.Lock()
		c.tx.fromBuffers++
		if err = c.postLocked(b.mr.SGE(off+done, int(room)), wrBuffer|uint64(room)); err != nil {
			break
		}
		done += int(room)
	}
	// Wait for every message posted from the buffer, whatever ended the loop.
	for {
		c.mu.Lock()
		idle := c.tx.fromBuffers == 0 || c.err != nil
		c.mu.Unlock()
		if idle {
			break
		}
		if c.waitUntil(c.wwake, nil, nil) != nil {
			break
		}
	}
	return done, err
}
