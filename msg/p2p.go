package msg

import (
	"context"
	"fmt"
)

// Point-to-point calls: Isend and Irecv start a request, Send and Recv wait for it. A send
// joins its connection's send vector (eager, or rendezvous above the largest phase's
// threshold) and goes at once if it can; a receive is matched against the messages that
// arrived, or posted (match.go).

// Isend starts sending buf to rank dest with tag (MPI_Isend). buf must not change until
// the request is done.
func (c *Comm) Isend(buf []byte, dest, tag int) *Request {
	return c.isend(buf, dest, tag, 0)
}

func (c *Comm) isend(buf []byte, dest, tag int, ctxID uint8) *Request {
	r := new(Request)
	c.sendInto(r, buf, dest, tag, ctxID)
	return r
}

// sendInto starts a send with request r.
func (c *Comm) sendInto(r *Request, buf []byte, dest, tag int, ctxID uint8) {
	*r = Request{c: c, sig: r.sig, send: true, buf: buf, peer: dest, tag: tag, ctx: ctxID} // a pooled request keeps its wake channel
	switch {
	case dest < 0 || dest >= c.size:
		r.complete(noRank(fmt.Sprintf("send to rank %d with tag %d", dest, tag), dest, c.size))
		return
	case tag < 0:
		r.complete(fmt.Errorf("msg: send to rank %d with tag %d: %w: a tag is at least 0", dest, tag, ErrInvalid))
		return
	}
	c.start(r)
}

// Irecv starts receiving into buf a message from source (or AnySource) with tag (or
// AnyTag) (MPI_Irecv).
func (c *Comm) Irecv(buf []byte, source, tag int) *Request {
	return c.irecv(buf, source, tag, 0)
}

func (c *Comm) irecv(buf []byte, source, tag int, ctxID uint8) *Request {
	r := new(Request)
	c.recvInto(r, buf, source, tag, ctxID)
	return r
}

// recvInto starts a receive with request r.
func (c *Comm) recvInto(r *Request, buf []byte, source, tag int, ctxID uint8) {
	*r = Request{c: c, sig: r.sig, buf: buf, peer: source, tag: tag, ctx: ctxID}
	switch {
	case source < AnySource || source >= c.size:
		r.complete(noRank(fmt.Sprintf("receive from rank %d with tag %d", source, tag), source, c.size))
		return
	case tag < AnyTag:
		r.complete(fmt.Errorf("msg: receive from rank %d with tag %d: %w: a tag is at least 0 (or AnyTag)", source, tag, ErrInvalid))
		return
	}
	c.start(r)
}

// start hands a new request to the progress engine: a send is queued and posted at once,
// a receive matched or posted; after Close it fails.
func (c *Comm) start(r *Request) {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	switch {
	case c.down && r.send:
		r.complete(closedError(fmt.Sprintf("send to rank %d with tag %d", r.peer, r.tag)))
	case c.down:
		r.complete(closedError(fmt.Sprintf("receive from rank %d with tag %d", r.peer, r.tag)))
	case r.send:
		c.startSend(r)
		c.pump() // post it now
	default:
		c.postRecv(r)
	}
}

// Send sends buf to dest with tag and returns when buf may be reused (MPI_Send).
func (c *Comm) Send(ctx context.Context, buf []byte, dest, tag int) error {
	r := reqPool.Get().(*Request)
	c.sendInto(r, buf, dest, tag, 0)
	_, err := r.Wait(ctx)
	r.release()
	return err
}

// Recv receives a message into buf (MPI_Recv).
func (c *Comm) Recv(ctx context.Context, buf []byte, source, tag int) (Status, error) {
	r := reqPool.Get().(*Request)
	c.recvInto(r, buf, source, tag, 0)
	st, err := r.Wait(ctx)
	r.release()
	return st, err
}

// startSend queues a send to its peer (progress lock held).
func (c *Comm) startSend(r *Request) {
	p, err := c.peer(r.peer)
	if err != nil {
		r.complete(err)
		return
	}
	if p.err != nil {
		r.complete(p.err)
		return
	}
	if r.peer == c.rank {
		c.sendSelf(r)
		return
	}
	p.sendQ.push(outMsg{kind: kindData, req: r})
	if len(r.buf) > c.cfg.threshold(len(c.cfg.Phases)-1) {
		p.sendQ[len(p.sendQ)-1].kind = kindRTS
	}
	p.connect()
	c.activate(p)
}

// cancel ends r with err if it has not started (progress lock held).
func (c *Comm) cancel(r *Request, err error) {
	if r.started {
		return
	}
	if r.send {
		if p := c.peers[r.peer]; p != nil {
			for i, m := range p.sendQ {
				if m.req == r {
					p.sendQ.remove(i)
					r.complete(err)
					return
				}
			}
		}
		return
	}
	for i, q := range c.posted {
		if q == r {
			c.posted = append(c.posted[:i], c.posted[i+1:]...)
			r.complete(err)
			return
		}
	}
}
