package perf

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// maxBuffer caps a side's registered buffer; large messages get fewer slots.
const maxBuffer = 256 << 20

// Info is what each side tells the other: its QPs (not with Config.CM: the connection
// manager connects them) and its buffer.
type Info struct {
	Endpoints []verbs.Endpoint
	Addr      uint64
	RKey      uint32
	Len       int
}

// side is one end of a benchmark: a device, a PD, one CQ, the QPs and a registered
// buffer of slots, one message each.
type side struct {
	cfg   *Config
	ctx   *verbs.Device
	own   bool // Close closes ctx
	pd    *verbs.PD
	cq    *verbs.CQ   // cqs[0]
	cqs   []*verbs.CQ // one per thread (Config.Threads): QP i completes on cqs[i % len]; Events: each has its own channel
	qps   []*verbs.QP
	psns  []uint32
	buf   []byte
	mr    *verbs.MR
	slots int
	qpIdx map[uint32]int
	conns []*cm.Conn // with Config.CM: QP i's connection
}

func isBW(test string) bool { return strings.HasSuffix(test, "_bw") }

// slotsFor returns how many message slots a side's buffer has.
func slotsFor(c *Config) int {
	if !isBW(c.Test) {
		return 2 // latency tests: [receive area][send area]
	}
	n := c.TxDepth * c.QPs
	if c.Test == "send_bw" {
		n *= 2
	}
	return max(1, min(n, maxBuffer/c.Size))
}

// newSide opens (or uses) a device, writing its packets to capture if that is set, and
// creates the PD, CQ, QPs and buffer.
func newSide(c *Config, ctx *verbs.Device, addr netip.Addr, port int, capture *verbs.PacketCapture) (*side, error) {
	s := &side{cfg: c, slots: slotsFor(c), qpIdx: map[uint32]int{}}
	if ctx == nil {
		var err error
		ctx, err = verbs.OpenDevice(verbs.DeviceConfig{Addr: addr, Port: port, Queues: c.Queues, Faults: c.Faults, Window: c.Window, BusyPoll: c.BusyPoll, Capture: capture})
		if err != nil {
			return nil, err
		}
		c.publish(ctx)
		s.own = true
	}
	s.ctx = ctx
	if err := s.setup(); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *side) setup() error {
	c := s.cfg
	var err error
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		return err
	}
	depth := c.TxDepth
	if c.Test == "send_bw" {
		depth = 2 * c.TxDepth
	}
	threads := max(1, c.Threads)
	cqe := max(depth*((c.QPs+threads-1)/threads)*2, 64)
	for range threads {
		var ch *verbs.CompChannel
		if c.Events {
			if ch, err = s.ctx.CreateCompChannel(); err != nil {
				return err
			}
		}
		cq, err := s.ctx.CreateCQ(cqe, ch, 0)
		if err != nil {
			if ch != nil {
				ch.DestroyCompChannel()
			}
			return err
		}
		s.cqs = append(s.cqs, cq)
	}
	s.cq = s.cqs[0]
	s.buf = make([]byte, s.slots*c.Size+8)
	// Touch every page now, as perftest initialises its buffers: first-touch page faults
	// are not what a benchmark should measure.
	for i := 0; i < len(s.buf); i += 4096 {
		s.buf[i] = 0
	}
	if s.mr, err = s.pd.RegMR(s.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic); err != nil {
		return err
	}
	for i := 0; i < c.QPs; i++ {
		cq := s.cqs[i%len(s.cqs)]
		qp, err := s.pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{
			MaxSendWR: max(c.TxDepth, 16), MaxRecvWR: max(depth, 16), MaxSendSGE: 1, MaxRecvSGE: 1,
			MaxInlineData: 64}})
		if err != nil {
			return err
		}
		s.qps = append(s.qps, qp)
		s.psns = append(s.psns, verbs.RandomPSN())
		s.qpIdx[qp.QPNum()] = i
	}
	return nil
}

func (s *side) info() Info {
	in := Info{Addr: s.mr.Addr(), RKey: s.mr.RKey(), Len: len(s.buf)}
	if s.cfg.CM {
		return in
	}
	for i, qp := range s.qps {
		ep := qp.Endpoint(s.psns[i])
		ep.Ordering = s.cfg.Ordering
		in.Endpoints = append(in.Endpoints, ep)
	}
	return in
}

// connect brings every QP to RTS against the peer's QPs.
func (s *side) connect(peer Info) error {
	if len(peer.Endpoints) != len(s.qps) {
		return fmt.Errorf("peer has %d QPs, this side %d", len(peer.Endpoints), len(s.qps))
	}
	for i, qp := range s.qps {
		if err := qp.Connect(s.psns[i], peer.Endpoints[i], s.connectOptions()); err != nil {
			return err
		}
	}
	return nil
}

// connectOptions are the QP attributes this side asks for, by hand or through the CM:
// the path MTU, the local ACK timeout and the ordering offer (the rest: verbs' defaults).
func (s *side) connectOptions() verbs.ConnectOptions {
	mtu, _ := verbs.MTUFromBytes(s.cfg.MTU)
	return verbs.ConnectOptions{MTU: mtu, Timeout: s.cfg.Timeout, Ordering: s.cfg.Ordering}
}

// sampleHoles snapshots the QPs' open holes every few milliseconds until stop is closed,
// and returns the snapshot with the most holes.
func (s *side) sampleHoles(name string, stop <-chan struct{}) <-chan *HoleSample {
	out := make(chan *HoleSample, 1)
	go func() {
		var best *HoleSample
		most := -1
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			for _, qp := range s.qps {
				r := qp.Holes()
				if n := len(r.Responder) + len(r.Requester); n > most {
					most = n
					best = &HoleSample{Side: name, QPNum: qp.QPNum(), Report: r}
				}
			}
			select {
			case <-stop:
				out <- best
				return
			case <-t.C:
			}
		}
	}()
	return out
}

// ordering returns the mode the QPs ended up in: with Config.CM, the one the connection
// manager negotiated.
func (s *side) ordering() string {
	if len(s.conns) > 0 {
		return s.conns[0].Ordering().String()
	}
	a, _ := s.qps[0].QueryQP()
	return a.Ordering.String()
}

func (s *side) close() {
	_ = s.disconnect() // before the QPs and the device go (nothing if already done)
	for _, qp := range s.qps {
		qp.DestroyQP()
	}
	if s.mr != nil {
		s.mr.DeregMR()
	}
	for _, cq := range s.cqs {
		ch := cq.Channel()
		cq.DestroyCQ()
		if ch != nil {
			ch.DestroyCompChannel()
		}
	}
	if s.pd != nil {
		s.pd.DeallocPD()
	}
	if s.own {
		s.ctx.Close()
	}
}

// perQP returns how many slots each QP has; QP q owns slots [q*perQP, (q+1)*perQP).
func (s *side) perQP() int { return max(1, s.slots/len(s.qps)) }

// slotOf returns the slot of iteration it: iterations go round-robin over the QPs, and
// each QP cycles through its own slots.
func (s *side) slotOf(it int) int {
	nqp := len(s.qps)
	return (it%nqp)*s.perQP() + (it/nqp)%s.perQP()
}

// slot returns message slot i of the buffer.
func (s *side) slot(i int) []byte {
	i %= s.slots
	return s.buf[i*s.cfg.Size : (i+1)*s.cfg.Size]
}

// patternGen yields the bytes of message seq, so a receiver can check every byte.
type patternGen uint32

func newPattern(seq int) patternGen { return patternGen(uint32(seq)*2654435761 + 1) }

func (g *patternGen) next() byte {
	x := uint32(*g)
	x ^= x << 13
	x ^= x >> 17
	x ^= x << 5
	*g = patternGen(x)
	return byte(x)
}

// pattern fills b with message seq.
func pattern(b []byte, seq int) {
	g := newPattern(seq)
	for i := range b {
		b[i] = g.next()
	}
}

// checkPattern returns the offset of the first byte of b that differs from message seq,
// or -1.
func checkPattern(b []byte, seq int) int {
	g := newPattern(seq)
	for i := range b {
		if b[i] != g.next() {
			return i
		}
	}
	return -1
}
