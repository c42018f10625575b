package msg

import (
	"fmt"
	"unsafe"

	"github.com/softrnic/softrnic/verbs"
)

// Rendezvous: a message above the largest eager phase is not copied. Its sender asks
// (RTS, through the eager slots, with the message's length); once a receive matches, the
// receiver registers the receive buffer (through the cache) and answers clear-to-send
// (CTS) with its address and key; the sender RDMA-WRITEs the message straight from its
// buffer (registered through the cache too) and follows it with FIN, which completes the
// receive: FIN's completion comes after the WRITE's data is placed, in either ordering
// mode. WRITE, not READ: it is softrnic's faster direction.

// startRendezvous answers a matched rendezvous request with CTS (progress lock held).
func (c *Comm) startRendezvous(r *Request, m *inMsg) {
	p := c.peers[m.src]
	// The peer may not be up yet here (its messages can arrive before our Accept
	// returns): CTS waits in the send vector until it is.
	if p == nil || p.state == psDead {
		err := fmt.Errorf("%w: rank %d", ErrPeerGone, m.src)
		if p != nil && p.err != nil {
			err = p.err
		}
		r.complete(err)
		return
	}
	r.rndvFrom, r.rndvID = m.src, m.id
	r.status.Count = m.total
	r.buf = r.buf[:min(len(r.buf), m.total)]
	if len(r.buf) > 0 {
		e, err := c.regs.get(r.buf, verbs.AccessRemoteWrite)
		if err != nil {
			r.complete(err)
			return
		}
		r.pinned = e
	}
	p.recvRndv[m.id] = r
	c.transfers++
	p.sendQ.pushFront(outMsg{kind: kindCTS, req: r})
	c.activate(p)
}

// onCTS: the receiver is ready; the WRITE goes when the send queue has room.
func (p *peer) onCTS(h *header) {
	r := p.inflight[h.ID]
	if r == nil {
		p.down(fmt.Errorf("protocol: clear-to-send for unknown message %d", h.ID))
		return
	}
	r.rndvAddr, r.rndvKey, r.rndvLen = h.Addr, h.RKey, int(min(h.Total, uint64(len(r.buf))))
	p.writeQ = append(p.writeQ, r)
	p.c.activate(p)
}

// postWrite writes a rendezvous message into the receiver's buffer, then FIN.
func (p *peer) postWrite(r *Request) {
	c := p.c
	if r.rndvLen > 0 {
		e, err := c.regs.get(r.buf, 0)
		if err != nil {
			r.complete(err)
			return
		}
		r.pinned = e
		if err := p.qp.PostSend([]verbs.SendWR{{WRID: wrRndv | r.id, Opcode: verbs.WRRDMAWrite, SendFlags: verbs.SendSignaled,
			SGList: []verbs.SGE{e.mr.SGE(e.off(r.buf), r.rndvLen)}, RemoteAddr: r.rndvAddr, RKey: r.rndvKey}}); err != nil {
			p.down(err)
			return
		}
		p.sqUsed++
	} else {
		delete(p.inflight, r.id)
		c.transfers--
		r.complete(nil)
	}
	p.sendQ.pushFront(outMsg{kind: kindFIN, id: r.id})
}

// written completes a rendezvous send whose WRITE completed.
func (p *peer) written(id uint64) {
	r := p.inflight[id]
	if r == nil {
		return
	}
	delete(p.inflight, id)
	p.c.transfers--
	p.c.regs.put(r.pinned)
	r.pinned = nil
	r.complete(nil)
}

// onFIN completes a rendezvous receive: the data before FIN is placed.
func (p *peer) onFIN(id uint64) {
	c := p.c
	r := p.recvRndv[id]
	if r == nil {
		return
	}
	delete(p.recvRndv, id)
	c.transfers--
	c.regs.put(r.pinned)
	r.pinned = nil
	c.stats.Rendezvous++
	if len(r.buf) < r.status.Count {
		r.complete(fmt.Errorf("%w: %d bytes from rank %d (tag %d) into a %d-byte buffer", ErrTruncated, r.status.Count, r.rndvFrom, r.tag, len(r.buf)))
		return
	}
	r.complete(nil)
}

// regCache keeps user buffers registered, so that a buffer sent or received again is not
// registered again (as MPI libraries' registration caches do). Entries not in use are
// unregistered, oldest first, beyond regCacheEntries or regCacheBytes.
type regCache struct {
	c       *Comm
	entries map[regKey]*regEntry
	lru     []*regEntry
	bytes   int
	hits    uint64
	misses  uint64
}

const (
	regCacheEntries = 64
	regCacheBytes   = 256 << 20
)

type regKey struct {
	ptr    uintptr
	n      int
	access verbs.AccessFlags
}

type regEntry struct {
	key  regKey
	mr   *verbs.MR
	refs int
}

func (e *regEntry) addr(b []byte) uint64 { return e.mr.Addr() + uint64(e.off(b)) }
func (e *regEntry) off(b []byte) int {
	return int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) - e.key.ptr)
}

func (rc *regCache) init(c *Comm) { rc.c, rc.entries = c, map[regKey]*regEntry{} }

// get returns b's registration with access (at least), registering it on a miss.
func (rc *regCache) get(b []byte, access verbs.AccessFlags) (*regEntry, error) {
	k := regKey{uintptr(unsafe.Pointer(unsafe.SliceData(b))), len(b), access | verbs.AccessLocalWrite}
	if e := rc.entries[k]; e != nil {
		rc.hits++
		e.refs++
		rc.touch(e)
		return e, nil
	}
	rc.misses++
	mr, err := rc.c.pd.RegMR(b, k.access)
	if err != nil {
		return nil, err
	}
	e := &regEntry{key: k, mr: mr, refs: 1}
	rc.entries[k] = e
	rc.lru = append(rc.lru, e)
	rc.bytes += len(b)
	rc.evict()
	return e, nil
}

func (rc *regCache) put(e *regEntry) {
	if e != nil {
		e.refs--
		rc.evict()
	}
}

func (rc *regCache) touch(e *regEntry) {
	for i, x := range rc.lru {
		if x == e {
			copy(rc.lru[i:], rc.lru[i+1:])
			rc.lru[len(rc.lru)-1] = e
			return
		}
	}
}

func (rc *regCache) evict() {
	for i := 0; i < len(rc.lru) && (len(rc.lru) > regCacheEntries || rc.bytes > regCacheBytes); {
		e := rc.lru[i]
		if e.refs > 0 {
			i++
			continue
		}
		e.mr.DeregMR()
		delete(rc.entries, e.key)
		rc.bytes -= e.key.n
		rc.lru = append(rc.lru[:i], rc.lru[i+1:]...)
	}
}
