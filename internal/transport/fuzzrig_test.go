package transport

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/wire"
)

// fuzzRig is the fixture the four QP fuzz targets share (receive path and requester, in
// both delivery modes): the device under test and its peer on their own sockets, the
// guarded memory the device under test registers, the monitor of every packet it sends,
// and the liveness check. An execution calls start, builds a fresh QP on dut, then
// feedInput and end.
type fuzzRig struct {
	g         *guarded
	mon       *txMonitor
	dut, peer *side
	live      *liveness
	peerQPN   atomic.Uint32
	stranger  netip.AddrPort // the peer's port on another address: a packet from it has the wrong source
}

// newFuzzRig opens two devices on 127.0.0.1 and 127.0.0.2: the device under test on the
// first if dutFirst (a requester's target), on the second otherwise, with dutCfg and the
// monitor as its fault filter. check is the target's own test of a packet the device sends
// (the rig checks that it goes to the peer's QP); g holds the regions the target will
// register on dut. The liveness check writes from the first device to the second in mode.
func newFuzzRig(f *testing.F, g *guarded, mode Ordering, dutFirst bool, dutCfg Config, check func(p *wire.Packet) string) *fuzzRig {
	rg := &fuzzRig{g: g}
	rg.mon = &txMonitor{check: func(p *wire.Packet) string {
		if p.BTH.DestQP != rg.peerQPN.Load() {
			return fmt.Sprintf("to QP %#x, not the peer QP %#x", p.BTH.DestQP, rg.peerQPN.Load())
		}
		return check(p)
	}}
	dutCfg.FaultFilter = rg.mon.filter
	var first, second *side
	if dutFirst {
		first = openSide(f, "127.0.0.1", dutCfg)
		second = openSide(f, "127.0.0.2", Config{})
		rg.dut, rg.peer = first, second
	} else {
		first = openSide(f, "127.0.0.1", Config{})
		second = openSide(f, "127.0.0.2", dutCfg)
		rg.dut, rg.peer = second, first
	}
	rg.peerQPN.Store(rg.peer.qp.QPN())
	from, to := rg.dut.d.LocalAddr(), rg.peer.d.LocalAddr()
	rg.mon.flow.Store(&wire.Flow{Src: from.Addr(), Dst: to.Addr(), SrcPort: from.Port(), DstPort: to.Port(), DF: true})
	rg.stranger = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), to.Port())
	rg.live = newLiveness(f, rg.mon, first.d, second.d, mode)
	return rg
}

// start begins an execution: the liveness check when it is due, the guarded memory back to
// its first contents, the monitor's findings of earlier executions dropped. The caller
// stops the watchdog it returns when the execution ends.
func (rg *fuzzRig) start(t *testing.T, data []byte) *time.Timer {
	w := watchdog(data)
	rg.live.tick(t)
	rg.g.reset()
	_ = rg.mon.take()
	return w
}

// flows returns the flows of packets to the device under test: from its peer, and from
// the stranger.
func (rg *fuzzRig) flows() (good, bad wire.Flow) {
	to, from := rg.dut.d.LocalAddr(), rg.peer.d.LocalAddr()
	return wire.Flow{Src: from.Addr(), Dst: to.Addr(), SrcPort: from.Port(), DstPort: to.Port(), DF: true},
		wire.Flow{Src: rg.stranger.Addr(), Dst: to.Addr(), SrcPort: rg.stranger.Port(), DstPort: to.Port(), DF: true}
}

// qpFeeder is how a target turns its input into packets for its QP: next builds the next
// packet from the input's records (reading what it needs of the QP under its lock),
// feed hands it to the device and reports whether it was refused (feed or weakFeed), and
// consistent, if set, checks the QP's invariants after each packet.
type qpFeeder struct {
	next       func(r *fuzzReader) (pkt []byte, fromBad, flush bool)
	feed       func(d *Device, q *QP, pkt []byte, from netip.AddrPort, flush bool) (refused bool)
	consistent func(q *QP) error
}

// feedInput feeds qp the packets of r's records (at most maxFuzzPackets), each from the
// peer or, if its record says so, from the stranger: a refused packet must leave memory as
// it was, and the QP consistent after each.
func (rg *fuzzRig) feedInput(t *testing.T, r *fuzzReader, qp *QP, fd qpFeeder) {
	for n := 0; n < maxFuzzPackets && !r.empty(); n++ {
		pkt, fromBad, flush := fd.next(r)
		from := rg.peer.d.LocalAddr()
		if fromBad {
			from = rg.stranger
		}
		rg.g.snapshot()
		if fd.feed(rg.dut.d, qp, pkt, from, flush) {
			if err := rg.g.changedSince(); err != nil {
				t.Fatalf("packet %d (%x) was refused but changed memory: %v", n, pkt, err)
			}
		}
		if fd.consistent != nil {
			if err := fd.consistent(qp); err != nil {
				t.Fatalf("after packet %d (%x): %v", n, pkt, err)
			}
		}
	}
}

// inputEnd is what a target checks when an execution's packets are in, besides memory and
// sent packets: its completions (if completions names them: each once, and in posting
// order if inOrder) and its QP's invariants.
type inputEnd struct {
	completions string
	inOrder     bool
	consistent  func(q *QP) error
}

// end finishes an execution: the device sends what its last batch left, then the
// completions and the QP are checked as e says, the guarded memory may have changed only
// in allowed, and every packet the device sent must have passed the monitor. role names
// the QP in failures (responder, requester).
func (rg *fuzzRig) end(t *testing.T, qp *QP, cq *CQ, allowed []span, role string, e inputEnd) {
	finish(rg.dut.d)
	if e.completions != "" {
		if err := cqInOrder(t, cq, e.inOrder); err != nil {
			t.Fatalf("%s: %v", e.completions, err)
		}
	}
	if testing.Verbose() {
		logOutcome(t, qp, cq)
	}
	if e.consistent != nil {
		if err := e.consistent(qp); err != nil {
			t.Fatalf("after the last packet: %v", err)
		}
	}
	if err := rg.g.check(allowed); err != nil {
		t.Fatalf("%s memory: %v", role, err)
	}
	if msg := rg.mon.take(); msg != "" {
		t.Fatalf("%s: %s", role, msg)
	}
}
