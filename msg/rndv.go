package msg

import (
	"fmt"
	"net/netip"
	"unsafe"

	"github.com/softrnic/softrnic/verbs"
)

func netip4(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// Rendezvous: a message above the largest eager phase is not copied. Its sender
// registers the buffer (through the cache) and sends a request to send (RTS) with its
// address and key through the eager slots; the receiver, once a receive matches, RDMA
// READs it straight into the receive buffer (registered through the cache too) and
// answers FIN, which completes the send.

// startRead starts the READ of a matched rendezvous message (progress goroutine).
func (c *Comm) startRead(r *Request, m *inMsg) {
	p := c.peers[m.src]
	// The peer may not be up yet here (its messages can arrive before our Accept
	// returns): the READ waits in readQ until it is.
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
	r.tag = m.tag
	c.nextID++
	r.id = c.nextID
	r.status.Count = m.total
	r.pinned = nil
	r.buf = r.buf[:min(len(r.buf), m.total)]
	r.rndvAddr, r.rndvKey = m.addr, m.rkey
	p.readQ = append(p.readQ, r)
	c.activate(p)
}

// postRead posts the READ of a rendezvous receive.
func (p *peer) postRead(r *Request) {
	c := p.c
	if len(r.buf) == 0 {
		p.reads[r.id] = r
		p.readDone(r.id)
		return
	}
	e, err := c.regs.get(r.buf, verbs.AccessLocalWrite)
	if err != nil {
		r.complete(err)
		return
	}
	r.pinned = e
	p.reads[r.id] = r
	if err := p.qp.PostSend([]verbs.SendWR{{WRID: wrRead | r.id, Opcode: verbs.WRRDMARead, SendFlags: verbs.SendSignaled,
		SGList: []verbs.SGE{e.mr.SGE(e.off(r.buf), len(r.buf))}, RemoteAddr: r.rndvAddr, RKey: r.rndvKey}}); err != nil {
		p.down(err)
		return
	}
	p.sqUsed++
}

// readDone completes a rendezvous receive and tells the sender.
func (p *peer) readDone(id uint64) {
	c := p.c
	r := p.reads[id]
	if r == nil {
		return
	}
	delete(p.reads, id)
	if r.pinned != nil {
		c.regs.put(r.pinned)
		r.pinned = nil
	}
	c.stats.Rendezvous++
	p.sendQ = append([]*outMsg{{kind: kindFIN, id: r.rndvID}}, p.sendQ...)
	c.activate(p)
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
