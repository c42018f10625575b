package msg

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// Connections are made on first use: the first send to a rank dials it (connect), and a
// rank accepts the other ranks' requests (onRequest). Each side's private data is a hello
// (wire.go): the job ID and its rank, its first ring (address, remote key, slot count and
// size) and its acknowledgement area, so that either side can write into the other's ring
// as soon as the connection is up. When two ranks dial each other at once, the lower
// rank's Dial wins: the lower rank rejects the higher one's request (rejTie), and the
// higher one accepts the lower one's on a fresh QP and drops its own Dial. A request from
// another job's rank, or from a rank already connected, is rejected.

// hello is this rank's private data for the connection to p.
func (p *peer) hello() []byte {
	c := p.c
	h := hello{Job: c.job, Rank: uint32(c.rank), RingAddr: p.ring.Addr(), RingKey: p.ring.RKey(), Slots: uint32(c.cfg.Slots),
		SlotSize: uint32(c.cfg.Phases[0]), AckAddr: p.ackMR.Addr(), AckKey: p.ackMR.RKey()}
	return h.put()
}

// connectOptions are the connections' attributes: the path MTU of the device's link
// (pathMTU), ordering as configured. The local ACK timeout is 268 ms (16)
// rather than the usual 67 ms: with seven retries a connection survives its peer's
// process not running for two seconds, as happens to jobs of many ranks on a machine
// busy with other work (a lost packet that no later one reveals costs that timeout).
func (c *Comm) connectOptions() verbs.ConnectOptions {
	return verbs.ConnectOptions{MTU: c.mtu, Ordering: c.cfg.Ordering, Timeout: 16}
}

// pathMTU is the path MTU of the rank's connections: the largest the device's link
// carries (4096 on loopback or jumbo frames, 1024 on a standard 1500-byte Ethernet).
func pathMTU(dev *verbs.Device) verbs.MTU {
	pa, err := dev.QueryPort(1)
	if err != nil || pa.ActiveMTU == 0 {
		return verbs.MTU1024
	}
	return pa.ActiveMTU
}

// connect dials the peer unless a connection is made or being made.
func (p *peer) connect() {
	if p.state != psIdle || p.rank == p.c.rank {
		return
	}
	c := p.c
	p.state = psDialing
	to := c.book[p.rank]
	data := p.hello()
	qp := p.qp
	p.dialQP = qp
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.ConnectTimeout)
		defer cancel()
		conn, err := cm.Dial(ctx, c.dev, netip.AddrPortFrom(to.Addr(), servicePort), qp,
			&cm.DialParams{PrivateData: data, DevicePort: to.Port(), Options: c.connectOptions()})
		if !c.submit(func() { c.onDialed(p, conn, err) }) && conn != nil {
			conn.Disconnect()
		}
	}()
}

// Reject reasons in private data.
var (
	rejTie = []byte("tie") // both dialed; the lower rank's Dial wins
	rejDup = []byte("dup") // already connected
	rejJob = []byte("job") // not of this job
)

func (c *Comm) onDialed(p *peer, conn *cm.Conn, err error) {
	if dq := p.dialQP; dq != nil && dq != p.qp {
		// We accepted the peer's request on a fresh QP meanwhile: this one is done.
		delete(c.byQPN, dq.QPNum())
		p.dialQP = nil
		if conn != nil {
			go conn.Disconnect()
		}
		go dq.DestroyQP()
		return
	}
	p.dialQP = nil
	if err == nil {
		if p.state != psDialing {
			go conn.Disconnect()
			return
		}
		h, ok := getHello(conn.PrivateData())
		if !ok || h.Job != c.job || int(h.Rank) != p.rank {
			go conn.Disconnect()
			p.down(fmt.Errorf("rank %d answered as another job's rank %d", p.rank, h.Rank))
			return
		}
		p.up(conn, h)
		return
	}
	if p.state != psDialing {
		return // we accepted the peer's request instead
	}
	var rej *cm.RejectError
	if errors.As(err, &rej) && string(trimZero(rej.PrivateData)) == string(rejTie) {
		p.state = psAwaiting
		return
	}
	p.down(err)
}

// onRequest answers a connection request from another rank.
func (c *Comm) onRequest(req *cm.Request) {
	h, ok := getHello(req.PrivateData)
	if !ok || h.Job != c.job || int(h.Rank) >= c.size || int(h.Rank) == c.rank {
		req.Reject(rejJob)
		return
	}
	p, err := c.peer(int(h.Rank))
	if err != nil {
		req.Reject(nil)
		return
	}
	switch p.state {
	case psUp, psAccepting, psDead:
		req.Reject(rejDup)
		return
	case psDialing:
		if c.rank < p.rank {
			req.Reject(rejTie)
			return
		}
		// Both dialed; the peer's Dial wins. Ours may not have sent its request yet
		// (it runs in its own goroutine): accept on a fresh QP, so that our request,
		// whenever it leaves, names a QP the peer has not connected to (else the
		// peer's CM would take it for a stale connection's).
		qp, err := c.newQP()
		if err != nil {
			req.Reject(nil)
			return
		}
		p.qp = qp
		c.byQPN[qp.QPNum()] = p
	}
	p.state = psAccepting
	if h.Slots >= 2 && h.Slots <= maxCredits && h.SlotSize == uint32(c.cfg.Phases[0]) {
		// Known now: the dialer may write before Accept returns here (its Dial returns
		// first), and an enlargement it asks for is acknowledged into this area.
		p.learn(h)
	}
	data := p.hello()
	opts := c.connectOptions()
	go func() {
		conn, err := req.Accept(p.qp, &cm.AcceptParams{PrivateData: data, Options: opts})
		ok := c.submit(func() {
			if err != nil {
				p.down(err)
				return
			}
			p.up(conn, h)
		})
		if !ok && conn != nil {
			conn.Disconnect()
		}
	}()
}

// up makes the connection usable: the peer's first ring and acknowledgement area.
func (p *peer) up(conn *cm.Conn, h hello) {
	c := p.c
	if h.Slots < 2 || h.Slots > maxCredits || h.SlotSize < hdrLen+8 || h.SlotSize != uint32(c.cfg.Phases[0]) {
		go conn.Disconnect()
		p.down(fmt.Errorf("rank %d's ring (%d slots of %d bytes) does not fit this job's configuration", p.rank, h.Slots, h.SlotSize))
		return
	}
	p.conn, p.state = conn, psUp
	p.learn(h)
	c.stats.Connections++
	if p.ackDeferred {
		p.ackDeferred = false
		p.writeAck(p.lastAck, p.lastAckSlot)
	}
	go func() {
		<-conn.Done()
		c.submit(func() {
			// What the peer sent before it disconnected is already in the CQ (it was
			// acknowledged before the DisconnectRequest left): take it first.
			c.pollCQ()
			p.down(conn.Err())
		})
	}()
	c.activate(p)
}

// learn takes the peer's first ring and acknowledgement area from its hello.
func (p *peer) learn(h hello) {
	if p.known {
		return
	}
	p.known = true
	p.rAddr, p.rKey, p.rSlots, p.rSize, p.rPhase = h.RingAddr, h.RingKey, int(h.Slots), int(h.SlotSize), 0
	p.credits = p.rSlots
	p.pAck, p.pAckKey = h.AckAddr, h.AckKey
}

// down ends the connection: every request involving the peer fails.
func (p *peer) down(err error) {
	if p.state == psDead {
		return
	}
	p.state = psDead
	p.err = errPeer(p.rank, err)
	p.fail(p.err)
	if p.qp != nil {
		p.qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateErr}, verbs.QPAttrState)
	}
}

// fail ends every request that involves the peer with err.
func (p *peer) fail(err error) {
	c := p.c
	for _, m := range p.sendQ {
		if m.req != nil {
			m.req.complete(err)
		}
	}
	p.sendQ.clear()
	for id, r := range p.inflight {
		r.complete(err)
		delete(p.inflight, id)
		c.transfers--
	}
	for id, r := range p.recvRndv {
		r.complete(err)
		delete(p.recvRndv, id)
		c.transfers--
	}
	p.writeQ = nil // their requests are in inflight
	keep := c.posted[:0]
	for _, r := range c.posted {
		if r.peer == p.rank {
			r.complete(err)
		} else {
			keep = append(keep, r)
		}
	}
	c.posted = keep
}

func trimZero(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}
