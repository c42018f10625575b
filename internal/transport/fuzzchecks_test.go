package transport

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// What the fuzz targets check: memory outside what an input may write, the packets a
// fuzzed device sends, the requester's and the weak mode's bookkeeping, completions.

// span is a byte range [off, off+n) of a guarded buffer that an input may change.
type span struct{ off, n int }

// guarded is a buffer whose bytes outside some spans must never change.
type guarded struct {
	buf, pristine, snap []byte
}

func newGuarded(n int) *guarded {
	g := &guarded{buf: make([]byte, n), pristine: make([]byte, n), snap: make([]byte, n)}
	for i := range g.pristine {
		g.pristine[i] = "CANARY!-"[i%8] ^ byte(i/8)
	}
	copy(g.buf, g.pristine)
	return g
}

// fill gives [off, off+n) the initial content pattern (also in the pristine copy).
func (g *guarded) fill(off, n int, pattern func(i int) byte) []byte {
	for i := 0; i < n; i++ {
		g.pristine[off+i] = pattern(i)
	}
	copy(g.buf[off:off+n], g.pristine[off:off+n])
	return g.buf[off : off+n : off+n]
}

func (g *guarded) reset() { copy(g.buf, g.pristine) }

// snapshot remembers the buffer's content; changedSince reports the first byte that
// differs from it.
func (g *guarded) snapshot() { copy(g.snap, g.buf) }

func (g *guarded) changedSince() error {
	if i := firstDiff(g.buf, g.snap); i >= 0 {
		return fmt.Errorf("byte %d changed from %#02x to %#02x", i, g.snap[i], g.buf[i])
	}
	return nil
}

// check reports the first changed byte outside the allowed spans.
func (g *guarded) check(allowed []span) error {
	pos := 0
	for _, s := range append(allowed, span{len(g.buf), 0}) {
		if s.off > pos {
			if i := firstDiff(g.buf[pos:s.off], g.pristine[pos:s.off]); i >= 0 {
				return fmt.Errorf("byte %d changed from %#02x to %#02x, outside every span the input may write (%v)",
					pos+i, g.pristine[pos+i], g.buf[pos+i], allowed)
			}
		}
		pos = max(pos, s.off+s.n)
	}
	return nil
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// txMonitor is the FaultFilter of a fuzzed device: it checks every packet the device sends
// (valid ICRC for the device's flow to its peer, decodes, default P_Key, plus the target's
// own checks) and drops it, so that the peer never answers; while pass is set (the
// liveness check) it lets everything through unchecked.
type txMonitor struct {
	pass  atomic.Bool
	flow  atomic.Pointer[wire.Flow]
	check func(p *wire.Packet) string
	mu    sync.Mutex
	err   string
}

func (m *txMonitor) filter(pkt []byte) netio.Verdict {
	if m.pass.Load() {
		return netio.Verdict{Action: netio.Pass}
	}
	var p wire.Packet
	msg := ""
	if fl := m.flow.Load(); fl != nil && !fl.VerifyICRC(pkt) {
		msg = "bad ICRC"
	} else if err := p.Decode(pkt); err != nil {
		msg = err.Error()
	} else if p.BTH.PKey != wire.DefaultPKey {
		msg = fmt.Sprintf("P_Key %#x", p.BTH.PKey)
	} else if m.check != nil {
		msg = m.check(&p)
	}
	if msg != "" {
		m.mu.Lock()
		if m.err == "" {
			m.err = fmt.Sprintf("sent packet %x: %s", pkt[:min(len(pkt), 64)], msg)
		}
		m.mu.Unlock()
	}
	return netio.Verdict{Action: netio.Drop}
}

// take returns and clears the first problem seen.
func (m *txMonitor) take() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.err
	m.err = ""
	return e
}

// logOutcome logs what an input did to the QP (with -v: to check that seeds do what their
// names say).
func logOutcome(t *testing.T, q *QP, cq *CQ) {
	var cqes [128]CQE
	n := cq.Poll(cqes[:])
	s := q.Stats()
	t.Logf("QP %v: rx %d, duplicates %d, out of sequence %d, NAKs sent %d, RNR NAKs sent %d, NAKs received %d, RNR NAKs received %d, dropped %d, wrong source %d; %d CQEs",
		q.State(), s.RxPackets, s.Duplicates, s.OutOfSequence, s.NAKsSent, s.RNRNAKsSent, s.NAKsRecv, s.RNRNAKsRecv, s.Dropped, s.WrongSource, n)
	for _, c := range cqes[:n] {
		t.Logf("  CQE wr %d status %d opcode %d len %d imm %#x vendor %#x", c.WRID, c.Status, c.Opcode, c.ByteLen, c.Imm, c.VendorErr)
	}
}

// requesterConsistent checks invariants of the send queue and the requester.
func requesterConsistent(q *QP) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if sq := &q.sq; !(sq.tail <= sq.cur && sq.cur <= sq.started && sq.started <= sq.head) {
		return fmt.Errorf("send queue indices out of order: tail %d cur %d started %d head %d", q.sq.tail, q.sq.cur, q.sq.started, q.sq.head)
	}
	if q.req.rdOut < 0 || q.req.rdOut > int(q.attr.MaxRdAtomic) {
		return fmt.Errorf("%d READ/atomic requests outstanding, max_rd_atomic %d", q.req.rdOut, q.attr.MaxRdAtomic)
	}
	return nil
}

// weakConsistent checks a weakly-ordered QP's bookkeeping: both hole trackers' invariants
// (holes.Tracker.Check), and on the requester side that the oldest unacknowledged PSN is
// the done tracker's base, that nothing beyond what was sent is done, that the count of
// PSNs in flight is the number sent and not yet done, and the requester's
// READ/atomic count and send queue indices (requesterConsistent).
func weakConsistent(q *QP) error {
	if err := requesterConsistent(q); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	ws, r := q.weak, &q.req
	if ws == nil {
		if q.state == StateRTR || q.state == StateRTS || q.state == StateSQD {
			return fmt.Errorf("QP in %v has no weak-mode state", q.state)
		}
		return nil
	}
	if err := ws.resp.arrived.Check(); err != nil {
		return fmt.Errorf("responder's arrival tracker: %v (holes %+v)", err, ws.resp.arrived.Holes(nil))
	}
	if err := ws.comp.done.Check(); err != nil {
		return fmt.Errorf("requester's done tracker: %v (holes %+v)", err, ws.comp.done.Holes(nil))
	}
	if q.state != StateRTS && q.state != StateSQD {
		return nil
	}
	if r.una != ws.comp.done.Base() {
		return fmt.Errorf("una %#x, done tracker's base %#x", r.una, ws.comp.done.Base())
	}
	if r.highPSN.Before(ws.comp.done.High()) {
		return fmt.Errorf("PSNs up to %#x done, only up to %#x sent", ws.comp.done.High(), r.highPSN)
	}
	n := uint32(0)
	for p := r.una; p.Before(r.highPSN); p = p.Add(1) {
		if !ws.comp.done.Has(p) {
			n++
		}
	}
	if n != ws.req.inflight {
		return fmt.Errorf("%d PSNs in flight counted, %d sent and not done in [%#x, %#x)", ws.req.inflight, n, r.una, r.highPSN)
	}
	return nil
}

// checkSACK checks a SACK a weak responder sent: well formed, its ranges beyond the
// cumulative PSN, in order and disjoint.
func checkSACK(p *wire.Packet) string {
	rs, err := wire.DecodeSACK(p.Ext, p.Payload, nil)
	if err != nil {
		return fmt.Sprintf("malformed SACK: %v", err)
	}
	prev := p.BTH.PSN.Add(1) // the first missing PSN
	for i, rg := range rs {
		if rg[0].Diff(prev) <= 0 {
			return fmt.Sprintf("SACK for PSN %#x: range %d [%#x, %#x) does not start after %#x", p.BTH.PSN, i, rg[0], rg[1], prev)
		}
		prev = rg[1]
	}
	return ""
}

// cqInOrder polls cq and checks that each work request completed once and, if inOrder,
// that their WRIDs strictly increase: in posting order (the fuzz targets post WRIDs in
// order). With -v it logs them.
func cqInOrder(t *testing.T, cq *CQ, inOrder bool) error {
	var cqes [64]CQE
	last := int64(-1)
	seen := map[uint64]bool{}
	for {
		n := cq.Poll(cqes[:])
		if n == 0 {
			return nil
		}
		for _, c := range cqes[:n] {
			if testing.Verbose() {
				t.Logf("  CQE wr %d status %d opcode %d len %d imm %#x vendor %#x", c.WRID, c.Status, c.Opcode, c.ByteLen, c.Imm, c.VendorErr)
			}
			if seen[c.WRID] {
				return fmt.Errorf("WRID %d (status %d) completed twice", c.WRID, c.Status)
			}
			seen[c.WRID] = true
			if inOrder && int64(c.WRID) <= last {
				return fmt.Errorf("completion of WRID %d (status %d) after WRID %d", c.WRID, c.Status, last)
			}
			last = int64(c.WRID)
		}
	}
}
