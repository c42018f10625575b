package transport

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/wire"
)

// An RC QP whose peer device is gone (its port closed: the host answers ICMP port
// unreachable) fails its outstanding work at once with RETRY_EXC_ERR and
// VendorUnreachable, having spent none of its retries: the ACK timeout is 4.3 s with 7
// retries, which without the report would end the same way (VendorRetryTimer) after 8
// timeouts. On one receive queue and on three (the report may reach any socket of the
// group), in both ordering modes.
func TestUnreachablePeerFailsQP(t *testing.T) {
	for _, mode := range []Ordering{Ordered, Weak} {
		for _, queues := range []int{1, 3} {
			t.Run(mode.String()+"/queues="+string(rune('0'+queues)), func(t *testing.T) {
				a := openSide(t, "127.0.0.1", Config{Queues: queues})
				b := openSide(t, "127.0.0.1", Config{Queues: queues})
				connectTimeout(t, a, b, wire.MTU1024, 100, 200, mode, 20)
				b.d.Close() // its port closes: the host answers with ICMP port unreachable
				src := make([]byte, 4096)
				ma := reg(t, a.d, src)
				_, err := a.qp.PostSend([]SendWR{{WRID: 7, Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{{Addr: ma.IOVA(), Length: uint32(len(src)), LKey: ma.Key()}}}})
				must(t, err)
				c := waitCQE(t, a.cq, 1)[0]
				if c.WRID != 7 || c.Status != StatusRetryExcErr || c.VendorErr != VendorUnreachable {
					t.Fatalf("completion %+v, want status %d vendor error %#x", c, StatusRetryExcErr, VendorUnreachable)
				}
				s := a.qp.Stats()
				if s.Timeouts != 0 || s.Unreachable != 1 {
					t.Errorf("%d ACK timeouts, %d unreachable failures; want 0, 1", s.Timeouts, s.Unreachable)
				}
				if st := a.qp.State(); st != StateErr {
					t.Errorf("QP in %v, want ERR", st)
				}
			})
		}
	}
}

// A report fails a QP only if it quotes a request the QP sent and its peer has not
// acknowledged, to the QP's peer address and port: a report for another port, another
// peer QP, a PSN outside the unacknowledged ones, an ACK, or a QP with nothing in flight
// changes nothing.
func TestUnreachableReportChecked(t *testing.T) {
	a := openSide(t, "127.0.0.1", Config{})
	b := openSide(t, "127.0.0.1", Config{})
	connectTimeout(t, a, b, wire.MTU1024, 100, 200, Ordered, 20)
	peer := b.d.LocalAddr()
	quote := func(op wire.Opcode, destQP uint32, psn wire.PSN) []byte {
		h := wire.BTH{Opcode: op, PKey: wire.DefaultPKey, DestQP: destQP, PSN: psn}
		q := make([]byte, wire.BTHLen+8)
		h.Put(q)
		return q
	}
	report := a.d.portUnreachable // as a receive path calls it (without its rxMu: the test holds b's)
	bqp := b.qp.QPN()
	// Nothing in flight.
	report(peer, quote(wire.OpSendOnly, bqp, 100))
	if st := a.qp.State(); st != StateRTS {
		t.Fatalf("a report with nothing in flight moved the QP to %v", st)
	}
	// One packet in flight (PSN 100): b's receive path is held, so it stays unacknowledged.
	b.d.q0().rxMu.Lock()
	defer b.d.q0().rxMu.Unlock()
	src := make([]byte, 64)
	ma := reg(t, a.d, src)
	_, err := a.qp.PostSend([]SendWR{{WRID: 1, Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{{Addr: ma.IOVA(), Length: 64, LKey: ma.Key()}}}})
	must(t, err)
	deadline := time.Now().Add(testutil.WaitLimit)
	for {
		a.qp.mu.Lock()
		sent := a.qp.req.highPSN == 101
		a.qp.mu.Unlock()
		if sent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the request was not sent")
		}
		runtime.Gosched()
	}
	otherPort := netip.AddrPortFrom(peer.Addr(), peer.Port()+1)
	for _, r := range []struct {
		what string
		dst  netip.AddrPort
		q    []byte
	}{
		{"another port", otherPort, quote(wire.OpSendOnly, bqp, 100)},
		{"another peer QP", peer, quote(wire.OpSendOnly, bqp+1, 100)},
		{"a PSN before the unacknowledged ones", peer, quote(wire.OpSendOnly, bqp, 99)},
		{"a PSN not sent yet", peer, quote(wire.OpSendOnly, bqp, 101)},
		{"an ACK", peer, quote(wire.OpAcknowledge, bqp, 100)},
		{"a quote shorter than a BTH", peer, quote(wire.OpSendOnly, bqp, 100)[:8]},
	} {
		report(r.dst, r.q)
		if st := a.qp.State(); st != StateRTS {
			t.Fatalf("a report with %s moved the QP to %v", r.what, st)
		}
	}
	report(peer, quote(wire.OpSendOnly, bqp, 100))
	if st := a.qp.State(); st != StateErr {
		t.Fatalf("a matching report left the QP in %v", st)
	}
	if c := waitCQE(t, a.cq, 1)[0]; c.Status != StatusRetryExcErr || c.VendorErr != VendorUnreachable {
		t.Errorf("completion %+v", c)
	}
}

// A UD datagram's report goes to OnUnreachable with the destination QP and the payload
// past the BTH and DETH.
func TestUnreachableUD(t *testing.T) {
	a := openSide(t, "127.0.0.1", Config{})
	type got struct {
		dst     netip.AddrPort
		destQP  uint32
		payload string
	}
	var reports []got
	a.d.OnUnreachable = func(dst netip.AddrPort, destQP uint32, payload []byte) {
		reports = append(reports, got{dst, destQP, string(payload)})
	}
	dst := netip.MustParseAddrPort("127.0.0.1:9")
	h := wire.BTH{Opcode: wire.OpUDSendOnly, PKey: wire.DefaultPKey, DestQP: 1}
	q := make([]byte, wire.BTHLen+wire.DETHLen+5)
	h.Put(q)
	binary.BigEndian.PutUint32(q[wire.BTHLen:], 0x80010000)
	copy(q[wire.BTHLen+wire.DETHLen:], "hello")
	a.d.portUnreachable(dst, q)
	if len(reports) != 1 || reports[0] != (got{dst, 1, "hello"}) {
		t.Errorf("reports %+v", reports)
	}
}
