package msg

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Matching, as MPI defines it: a receive takes the first message, in arrival order, whose
// source, tag and context match it; a message takes the first posted receive, in post
// order, that matches it. Messages from one source arrive in the order they were sent
// (one ring per connection, consumed in order), so they do not overtake each other.

// inMsg is an arrived message not yet matched: an eager payload (copied out of its slot)
// or a rendezvous request.
type inMsg struct {
	src, tag int
	ctx      uint8
	data     []byte // eager
	rndv     bool
	total    int
	id       uint64 // rendezvous: the sender's message ID
}

// matches reports whether a receive (or probe) for source, tag and context takes a
// message from src with tag in ctx.
func matches(source, tag int, ctx uint8, src, mtag int, mctx uint8) bool {
	return ctx == mctx && (source == AnySource || source == src) && (tag == AnyTag || tag == mtag)
}

func (r *Request) matches(src, tag int, ctx uint8) bool {
	return matches(r.peer, r.tag, r.ctx, src, tag, ctx)
}

// postRecv matches a new receive against the unexpected messages, or posts it.
func (c *Comm) postRecv(r *Request) {
	for i, m := range c.unexpected {
		if r.matches(m.src, m.tag, m.ctx) {
			c.unexpected = append(c.unexpected[:i], c.unexpected[i+1:]...)
			c.deliver(r, m)
			return
		}
	}
	// Only then a dead peer fails it: what the peer sent before it went is received.
	if r.peer != AnySource {
		if p, err := c.peer(r.peer); err == nil && p.err != nil {
			r.complete(p.err)
			return
		}
	}
	c.posted = append(c.posted, r)
}

// arrived matches a message that just arrived, or keeps it as unexpected.
func (c *Comm) arrived(msg inMsg) {
	for i, r := range c.posted {
		if r.matches(msg.src, msg.tag, msg.ctx) {
			c.posted = append(c.posted[:i], c.posted[i+1:]...)
			c.deliver(r, &msg)
			return
		}
	}
	m := new(inMsg) // kept: only an unexpected message costs an allocation
	*m = msg
	if !m.rndv {
		m.data = append([]byte(nil), m.data...) // out of the slot, which goes back to the sender
	}
	c.unexpected = append(c.unexpected, m)
	for i := 0; i < len(c.probes); i++ {
		if pr := c.probes[i]; pr.matches(m) {
			pr.st = Status{Source: m.src, Tag: m.tag, Count: m.total}
			pr.fire()
			c.probes = append(c.probes[:i], c.probes[i+1:]...)
			i--
		}
	}
}

// deliver completes receive r with message m (or starts its rendezvous read).
func (c *Comm) deliver(r *Request, m *inMsg) {
	r.started = true
	r.status = Status{Source: m.src, Tag: m.tag, Count: m.total}
	if m.rndv {
		c.startRendezvous(r, m)
		return
	}
	n := copy(r.buf, m.data)
	if n < m.total {
		r.complete(fmt.Errorf("%w: %d bytes from rank %d (tag %d) into a %d-byte buffer", ErrTruncated, m.total, m.src, m.tag, len(r.buf)))
		return
	}
	r.complete(nil)
}

// sendSelf delivers a message a rank sends to itself.
func (c *Comm) sendSelf(r *Request) {
	r.started = true
	c.arrived(inMsg{src: c.rank, tag: r.tag, ctx: r.ctx, data: r.buf, total: len(r.buf)})
	r.complete(nil)
}

// probe is a Probe waiting for a matching message.
type probe struct {
	src, tag int
	ctx      uint8
	done     atomic.Bool
	wake     chan struct{} // closed when done
	st       Status
	gone     bool // the communicator closed
}

// fire ends the probe (progress lock held).
func (p *probe) fire() {
	p.done.Store(true)
	close(p.wake)
}

func (p *probe) finished() bool          { return p.done.Load() }
func (p *probe) signal() <-chan struct{} { return p.wake }

func (p *probe) matches(m *inMsg) bool { return matches(p.src, p.tag, p.ctx, m.src, m.tag, m.ctx) }

// Probe waits for a message from source with tag that a Recv would take, and returns its
// status without receiving it (MPI_Probe).
func (c *Comm) Probe(ctx context.Context, source, tag int) (Status, error) {
	pr := &probe{src: source, tag: tag, wake: make(chan struct{})}
	found := false
	if err := c.call(func() {
		for _, m := range c.unexpected {
			if pr.matches(m) {
				pr.st, found = Status{Source: m.src, Tag: m.tag, Count: m.total}, true
				return
			}
		}
		c.probes = append(c.probes, pr)
	}); err != nil {
		return Status{}, callError("Probe", err)
	}
	if found {
		return pr.st, nil
	}
	if !c.await(ctx, pr) {
		c.pmu.Lock()
		defer c.pmu.Unlock()
		for i, q := range c.probes {
			if q == pr {
				c.probes = append(c.probes[:i], c.probes[i+1:]...)
				return Status{}, ctx.Err()
			}
		}
		// It matched meanwhile.
	}
	if pr.gone {
		return Status{}, closedError("Probe")
	}
	return pr.st, nil
}
