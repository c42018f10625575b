package verbs

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/softrnic/softrnic/internal/gsiport"
	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/internal/tpt"
	"github.com/softrnic/softrnic/internal/transport"
)

// gsi is the device's QP1, the general services interface: a UD QP with the well-known
// Q_Key that CM MADs are sent to. The connection manager (package cm) claims it through
// internal/gsiport and then receives every MAD; until then its agent answers what needs
// an answer: a ConnectRequest for any service is rejected with "invalid service ID"
// (nobody listens), as an IB CM without a listener does; other MADs are dropped. It lives
// in the engine directly (PD 0, which verbs never hands out), so it counts against none
// of the device's limits.
type gsi struct {
	c      *Device
	qp     *transport.QP
	rcq    *transport.CQ // receive completions, polled by the agent
	scq    *transport.CQ // send completions, polled by senders under sendMu
	mem    []byte        // gsiRecvs receive slots, then gsiSends send slots
	region *tpt.Region
	wake   chan struct{}
	h      atomic.Pointer[gsiport.Handler]
	inc    uint64 // the device's incarnation (gsiport.Port.Incarnation)
	// unreach holds the reports of MADs whose destination's port is closed, for the
	// agent to hand to the handler (see unreachable).
	unreach chan unreachReport

	closeOnce sync.Once

	sendMu   sync.Mutex
	free     []int // free send slots (guarded by sendMu)
	sendWake chan struct{}
}

const (
	gsiRecvs   = 256
	gsiSends   = 128
	gsiSlot    = transport.GRHLen + mad.Size
	gsiSendOff = gsiRecvs * gsiSlot
)

func init() {
	gsiport.Lookup = func(dev any) (gsiport.Port, error) {
		c, ok := dev.(*Device)
		if !ok || c == nil {
			return nil, fmt.Errorf("verbs: %T is not a device", dev)
		}
		if err := c.check(); err != nil {
			return nil, err
		}
		return c.gsi, nil
	}
}

// openGSI creates QP1 in RTS with its receive buffers posted and starts its agent.
func (c *Device) openGSI() error {
	g := &gsi{c: c, rcq: c.dev.NewCQ(gsiRecvs + 8), scq: c.dev.NewCQ(gsiSends + 8),
		mem: make([]byte, gsiSendOff+gsiSends*mad.Size), wake: make(chan struct{}, 1), sendWake: make(chan struct{}, 1),
		inc: newIncarnation(), unreach: make(chan unreachReport, gsiUnreachReports)}
	for i := gsiSends - 1; i >= 0; i-- {
		g.free = append(g.free, i)
	}
	var err error
	if g.region, err = c.dev.MRs().Register(0, g.mem, uint64(uintptr(unsafe.Pointer(&g.mem[0]))), tpt.LocalWrite); err != nil {
		return err
	}
	g.qp, err = c.dev.CreateQP(transport.QPConfig{Service: transport.ServiceUD, GSI: true, SendCQ: g.scq, RecvCQ: g.rcq,
		MaxSendWR: gsiSends, MaxRecvWR: gsiRecvs, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		return err
	}
	caps := transport.DeviceCaps{} // a UD QP takes no READ or atomic attributes
	for _, s := range []struct {
		a    transport.Attr
		mask uint32
	}{
		{transport.Attr{State: transport.StateInit, Port: 1, QKey: mad.GSIQKey}, transport.MaskState | transport.MaskPKeyIndex | transport.MaskPort | transport.MaskQKey},
		{transport.Attr{State: transport.StateRTR}, transport.MaskState},
		{transport.Attr{State: transport.StateRTS}, transport.MaskState | transport.MaskSQPSN},
	} {
		if err := g.qp.Modify(&s.a, s.mask, caps); err != nil {
			return err
		}
	}
	for i := 0; i < gsiRecvs; i++ {
		if err := g.post(i); err != nil {
			return err
		}
	}
	g.rcq.SetNotify(func(*transport.CQ) {
		select {
		case g.wake <- struct{}{}:
		default:
		}
	})
	g.scq.SetNotify(func(*transport.CQ) {
		select {
		case g.sendWake <- struct{}{}:
		default:
		}
	})
	c.gsi = g
	c.dev.OnUnreachable = g.unreachable // before QP1 sends anything: reports are about its sends
	go g.run()
	return nil
}

func (g *gsi) post(i int) error {
	_, err := g.qp.PostRecv([]transport.RecvWR{{WRID: uint64(i), SG: []transport.SGE{{Addr: g.region.IOVA() + uint64(i*gsiSlot), Length: gsiSlot, LKey: g.region.Key()}}}})
	return err
}

// run is the agent: it waits for completions on QP1's receive CQ (armed, woken by its
// notify) until the device closes.
func (g *gsi) run() {
	var wcs [16]transport.CQE
	for {
		g.rcq.Arm(false)
		for {
			n := g.rcq.Poll(wcs[:])
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
		case r := <-g.unreach:
			g.deliverUnreachable(&r)
		case <-g.c.done:
			return
		}
	}
}

// handle passes the MAD in receive slot i to the claimed handler, or answers it.
func (g *gsi) handle(i int, e *transport.CQE) {
	slot := g.mem[i*gsiSlot : (i+1)*gsiSlot]
	if e.ByteLen != gsiSlot {
		return // not a MAD
	}
	src, ok := transport.GRHSource(slot[:transport.GRHLen])
	if !ok {
		return
	}
	from := netip.AddrPortFrom(src, e.SrcPort)
	if h := g.h.Load(); h != nil {
		(*h).HandleMAD(from, e.SrcQP, slot[transport.GRHLen:])
		return
	}
	// Nobody listens: a connection request is rejected with "invalid service ID", a
	// service ID resolution answered "not supported", as Linux's CM does. A softrnic
	// peer's keep-alive probe is answered with this device's incarnation, so that a peer
	// that had connections with an earlier device at this address ends them at once.
	var out [mad.Size]byte
	b := slot[transport.GRHLen:]
	hdr, err := mad.DecodeHeader(b)
	if err == nil && hdr.Method == mad.MethodGet && hdr.AttrID == mad.AttrClassPortInfo {
		if _, soft := mad.Incarnation(b); soft {
			mad.PutClassPortInfoResp(out[:], hdr.TID, 16)
			mad.PutIncarnation(out[:], g.inc)
			_ = g.SendMAD(from, e.SrcQP, out[:])
		}
		return
	}
	if err != nil || hdr.Method != mad.MethodSend {
		return
	}
	soft := false
	switch hdr.AttrID {
	case mad.AttrREQ:
		var req mad.REQ
		if _, err := mad.Decode(b, &req); err != nil {
			return
		}
		soft = req.FromSoftrnic()
		mad.Put(out[:], hdr.TID, &mad.REJ{RemoteCommID: req.LocalCommID, MessageRejected: mad.MsgREQ, Reason: mad.RejInvalidServiceID})
	case mad.AttrSIDRREQ:
		var req mad.SIDRREQ
		if _, err := mad.Decode(b, &req); err != nil {
			return
		}
		soft = req.FromSoftrnic()
		mad.Put(out[:], hdr.TID, &mad.SIDRREP{RequestID: req.RequestID, Status: mad.SIDRUnsupported, ServiceID: req.ServiceID})
	default:
		return
	}
	// A softrnic device listens on the port it sent from; a standard peer sends from a
	// port of its own and listens on 4791 only.
	if !soft {
		from = netip.AddrPortFrom(from.Addr(), DefaultPort)
	}
	_ = g.SendMAD(from, e.SrcQP, out[:])
}

// errGSIBusy is returned when QP1's send slots stay taken (the socket does not drain).
var errGSIBusy = errors.New("verbs: QP1 send queue full")

// SendMAD sends m to QP qpn at dst from one of QP1's send slots (gsiport.Port).
func (g *gsi) SendMAD(dst netip.AddrPort, qpn uint32, m []byte) error {
	if len(m) != mad.Size {
		return fmt.Errorf("verbs: QP1: a MAD is %d bytes, not %d", mad.Size, len(m))
	}
	ah, err := g.c.dev.NewAH(dst)
	if err != nil {
		return err
	}
	g.sendMu.Lock()
	defer g.sendMu.Unlock()
	var deadline time.Time
	for {
		g.reclaim()
		if len(g.free) > 0 {
			break
		}
		// Sends complete once handed to the socket, in whichever goroutine transmits:
		// wait for one (bounded), as a MAD layer waits for its send queue.
		if deadline.IsZero() {
			deadline = time.Now().Add(time.Second)
		}
		g.scq.Arm(false)
		g.reclaim()
		if len(g.free) > 0 {
			break
		}
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-g.sendWake:
			t.Stop()
		case <-g.c.done:
			t.Stop()
			return fmt.Errorf("verbs: QP1: %w", ErrClosed)
		case <-t.C:
			return errGSIBusy
		}
	}
	s := g.free[len(g.free)-1]
	g.free = g.free[:len(g.free)-1]
	off := gsiSendOff + s*mad.Size
	copy(g.mem[off:off+mad.Size], m)
	_, err = g.qp.PostSend([]transport.SendWR{{WRID: uint64(s), Opcode: transport.WRSend, Flags: transport.FlagSignaled, AH: ah, RemoteQPN: qpn, RemoteQKey: mad.GSIQKey,
		SG: []transport.SGE{{Addr: g.region.IOVA() + uint64(off), Length: mad.Size, LKey: g.region.Key()}}}})
	if err != nil {
		g.free = append(g.free, s)
	}
	return err
}

// reclaim returns the slots of completed sends to the free list (sendMu held).
func (g *gsi) reclaim() {
	var wcs [16]transport.CQE
	for {
		n := g.scq.Poll(wcs[:])
		for _, e := range wcs[:n] {
			if e.WRID < gsiSends {
				g.free = append(g.free, int(e.WRID))
			}
		}
		if n < len(wcs) {
			return
		}
	}
}

// LocalAddr is the device's address (gsiport.Port).
func (g *gsi) LocalAddr() netip.AddrPort { return g.c.Addr() }

// Incarnation is the device's incarnation (gsiport.Port).
func (g *gsi) Incarnation() uint64 { return g.inc }

// newIncarnation draws a device's incarnation: random, odd (never 0).
func newIncarnation() uint64 {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// Claim makes h the receiver of QP1's MADs (gsiport.Port).
func (g *gsi) Claim(h gsiport.Handler) error {
	if !g.h.CompareAndSwap(nil, &h) {
		return errors.New("verbs: QP1 is already claimed by a connection manager")
	}
	return nil
}

// closing tells the handler that the device is closing, before its socket is shut.
func (g *gsi) closing() {
	g.closeOnce.Do(func() {
		if h := g.h.Load(); h != nil {
			(*h).Closing()
		}
	})
}
