package rsocket

import (
	"context"
	"errors"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// newConn makes a connection's verbs objects on dev: a protection domain, a
// completion queue with a channel of its own, an RC QP in INIT that lets the peer write,
// the receive ring, the grant slots and the send buffer, with every receive posted, so
// that the peer may write as soon as it learns of them.
func newConn(dev *verbs.Device, o Options) (c *Conn, err error) {
	if dev == nil {
		return nil, errors.New("nil device")
	}
	c = &Conn{o: o, rq: o.QueueSize, corkWait: corkTimeout,
		rwake: make(chan struct{}, 1), wwake: make(chan struct{}, 1), done: make(chan struct{}),
		rdl: newDeadline(), wdl: newDeadline()}
	c.flushTimer = time.AfterFunc(time.Hour, c.onFlushTimer)
	c.flushTimer.Stop()
	defer func() {
		if err != nil {
			c.release()
		}
	}()
	if c.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if c.ch, err = dev.CreateCompChannel(); err != nil {
		return nil, err
	}
	sq, rq := o.QueueSize+ctrlSlots, o.QueueSize+extraRecvs
	if c.cq, err = dev.CreateCQ(sq+rq, c.ch, verbs.NoHandler); err != nil {
		return nil, err
	}
	if c.qp, err = c.pd.CreateQP(&verbs.QPInitAttr{SendCQ: c.cq, RecvCQ: c.cq, SQSigAll: true,
		Cap: verbs.QPCap{MaxSendWR: sq, MaxRecvWR: rq, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: o.InlineSize}}); err != nil {
		return nil, err
	}
	if err = cm.InitQP(c.qp, verbs.AccessRemoteWrite); err != nil {
		return nil, err
	}
	remote := verbs.AccessLocalWrite | verbs.AccessRemoteWrite
	if c.ring, err = c.pd.RegMR(make([]byte, o.RecvBuffer), remote); err != nil {
		return nil, err
	}
	if c.target, err = c.pd.RegMR(make([]byte, grantSlots*sgeLen+iomapLen*o.IOMapSize), remote); err != nil {
		return nil, err
	}
	if c.sbuf, err = c.pd.RegMR(make([]byte, o.SendBuffer+sgeLen+iomapLen), 0); err != nil {
		return nil, err
	}
	c.initState()
	c.wcs = make([]verbs.WorkCompletion, 64)
	c.recvs = make([]verbs.RecvWR, rq)
	for i := range c.recvs {
		c.recvs[i].WRID = wrRecv
	}
	if err = c.qp.PostRecv(c.recvs); err != nil {
		return nil, err
	}
	return c, nil
}

// initState sets the state a connection starts in: the first half of the ring
// granted (in the connect data), the second half free to grant, no grant of the peer's
// ring yet.
func (c *Conn) initState() {
	o := c.o
	half := uint32(o.RecvBuffer / 2)
	c.rx = rxState{size: uint32(o.RecvBuffer), half: half, lens: make([]uint32, o.QueueSize+1),
		granted: half, freeOff: half, avail: half, seqComp: uint16(o.QueueSize / 2), slot: 1}
	c.tx = txState{nextSlot: 1, sqe: o.QueueSize, avail: uint32(o.SendBuffer)}
	c.ctrlAvail = ctrlSlots
	c.inflight, c.sentDisc, c.peerDisc, c.closing, c.closed, c.err, c.stats = 0, false, false, false, false, nil, Stats{}
}

// connData is what this side tells the peer: its credits, its grant slots and the first
// half of its ring.
func (c *Conn) connData() []byte {
	d := connData{Version: version, Flags: flagIOMap, Credits: uint16(c.rq), IOMap: c.o.IOMapSize,
		Target:  sge{Addr: c.target.Addr(), Key: c.target.RKey(), Len: grantSlots},
		DataBuf: sge{Addr: c.ring.Addr(), Key: c.ring.RKey(), Len: c.rx.half}}
	b := make([]byte, connDataLen)
	d.put(b)
	return b
}

// start takes the peer's connect data and the established connection.
func (c *Conn) start(cn *cm.Conn, d connData) {
	c.cn = cn
	c.peerBE = d.Flags&flagNet != 0
	c.peerTarget = d.Target
	c.peerIOMap = make([]*Mapping, min(d.IOMap, maxIOMap))
	c.iomaps = make([]ioEntry, c.o.IOMapSize)
	c.tx.grants[0] = d.DataBuf
	c.tx.gN = 1
	c.tx.seqComp = d.Credits
	// The second half of the ring goes to the peer at once, as librdmacm grants it.
	c.giveCredits()
}

// abort frees a connection that never started.
func (c *Conn) abort() { c.release() }

// contextUntil returns a context cancelled when ch closes.
func contextUntil(ch <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-ch:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
