package verbs

import (
	"net/netip"
	"unsafe"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/transport"
)

// gsi is the device's QP1, the general services interface: a UD QP with the well-known
// Q_Key that CM MADs are sent to. Until a connection manager claims the device (issue 10),
// its agent answers what needs an answer: a ConnectRequest for any service is rejected
// with "invalid service ID" (nobody listens), as an IB CM without a listener does; other
// MADs are dropped. It lives in the engine directly (PD 0, which verbs never hands out),
// so it counts against none of the device's limits.
type gsi struct {
	c      *Context
	qp     *transport.QP
	cq     *transport.CQ
	mem    []byte // gsiRecvs receive slots, then one send slot
	region *tpt.Region
	wake   chan struct{}
}

const (
	gsiRecvs   = 64
	gsiSlot    = transport.GRHLen + mad.Size
	gsiSendOff = gsiRecvs * gsiSlot
)

// openGSI creates QP1 in RTS with its receive buffers posted and starts its agent.
func (c *Context) openGSI() error {
	g := &gsi{c: c, cq: c.dev.NewCQ(2*gsiRecvs + 8), mem: make([]byte, gsiSendOff+mad.Size), wake: make(chan struct{}, 1)}
	var err error
	if g.region, err = c.dev.MRs().Register(0, g.mem, uint64(uintptr(unsafe.Pointer(&g.mem[0]))), tpt.LocalWrite); err != nil {
		return err
	}
	g.qp, err = c.dev.CreateQP(transport.QPConfig{Service: transport.ServiceUD, GSI: true, SendCQ: g.cq, RecvCQ: g.cq,
		MaxSendWR: 16, MaxRecvWR: gsiRecvs, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		return err
	}
	lim := transport.Limits{}
	for _, s := range []struct {
		a    transport.Attr
		mask uint32
	}{
		{transport.Attr{State: transport.StateInit, Port: 1, QKey: mad.GSIQKey}, transport.MaskState | transport.MaskPKeyIndex | transport.MaskPort | transport.MaskQKey},
		{transport.Attr{State: transport.StateRTR}, transport.MaskState},
		{transport.Attr{State: transport.StateRTS}, transport.MaskState | transport.MaskSQPSN},
	} {
		if err := g.qp.Modify(&s.a, s.mask, lim); err != nil {
			return err
		}
	}
	for i := 0; i < gsiRecvs; i++ {
		if err := g.post(i); err != nil {
			return err
		}
	}
	g.cq.SetNotify(func(*transport.CQ) {
		select {
		case g.wake <- struct{}{}:
		default:
		}
	})
	c.gsi = g
	go g.run()
	return nil
}

func (g *gsi) post(i int) error {
	_, err := g.qp.PostRecv([]transport.RecvWR{{WRID: uint64(i), SG: []transport.SGE{{Addr: g.region.IOVA() + uint64(i*gsiSlot), Length: gsiSlot, LKey: g.region.Key()}}}})
	return err
}

// run is the agent: it waits for completions on QP1's CQ (armed, woken by its notify) until
// the device closes.
func (g *gsi) run() {
	var wcs [16]transport.CQE
	for {
		g.cq.Arm(false)
		for {
			n := g.cq.Poll(wcs[:])
			for _, e := range wcs[:n] {
				if e.Opcode == transport.WCRecv && e.WRID < gsiRecvs {
					if e.Status == transport.StatusSuccess {
						g.handle(int(e.WRID), &e)
					}
					if g.post(int(e.WRID)) != nil {
						return // the device is closing
					}
				}
			}
			if n < len(wcs) {
				break
			}
		}
		select {
		case <-g.wake:
		case <-g.c.done:
			return
		}
	}
}

// handle answers the MAD in receive slot i.
func (g *gsi) handle(i int, e *transport.CQE) {
	slot := g.mem[i*gsiSlot : (i+1)*gsiSlot]
	if e.ByteLen != gsiSlot {
		return // not a MAD
	}
	var req mad.REQ
	h, err := mad.Decode(slot[transport.GRHLen:], &req)
	if err != nil || h.Method != mad.MethodSend {
		return
	}
	src, ok := transport.GRHSource(slot[:transport.GRHLen])
	if !ok {
		return
	}
	// Nobody listens: reject with "invalid service ID", naming the request's comm ID.
	rej := mad.REJ{RemoteCommID: req.LocalCommID, MessageRejected: mad.MsgREQ, Reason: mad.RejInvalidServiceID}
	out := g.mem[gsiSendOff:]
	mad.Put(out, h.TID, &rej)
	ah, err := g.c.dev.NewAH(netip.AddrPortFrom(src, e.SrcPort))
	if err != nil {
		return
	}
	_, _ = g.qp.PostSend([]transport.SendWR{{Opcode: transport.WRSend, AH: ah, RemoteQPN: e.SrcQP, RemoteQKey: mad.GSIQKey,
		SG: []transport.SGE{{Addr: g.region.IOVA() + gsiSendOff, Length: mad.Size, LKey: g.region.Key()}}}})
}
