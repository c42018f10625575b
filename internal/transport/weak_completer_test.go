package transport

import (
	"encoding/binary"
	"testing"

	"github.com/softrnic/softrnic/internal/holes"
	"github.com/softrnic/softrnic/internal/testutil"
	"github.com/softrnic/softrnic/internal/wire"
)

// The weakly-ordered completer's own tests (weak_completer.go): SACKs, completions held
// until the holes before them close, losses found by the reordering threshold, RNR waits
// and fatal NAKs in SACK form, responses wherever they fall.

// weakSends posts n signaled one-packet SENDs (WRIDs 0..n-1) on a weak rig and drops what
// they sent.
func (rg *qpRig) weakSends(n int) {
	rg.t.Helper()
	_, ms := rg.mem(64)
	for i := 0; i < n; i++ {
		rg.post(SendWR{WRID: uint64(i), Opcode: WRSend, Flags: FlagSignaled, SG: []SGE{sge(ms, 0, 8)}})
	}
	wantSent(rg.t, rg.sent(), 0x100, repeat(wire.OpWeakSend, n)...)
}

// TestWeakCompleterHoldsCompletions: work requests a SACK acknowledges beyond a hole
// complete only when the hole closes, and then in posting order.
func TestWeakCompleterHoldsCompletions(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Weak))
	rg.weakSends(3)
	rg.deliver(sack(0xFF, ackSyn, 3, [2]wire.PSN{0x101, 0x103}))
	if c := polled(rg.scq); len(c) != 0 {
		t.Fatalf("completions across the hole at 0x100: %+v", c)
	}
	h := rg.qp.Holes().Requester
	if len(h) != 1 || h[0].Start != 0x100 || h[0].End != 0x101 || h[0].Counts[kindSendDone] != 2 {
		t.Fatalf("requester holes %+v, want [0x100, 0x101) holding two SENDs", h)
	}
	rg.deliver(sack(0x100, ackSyn, 3, [2]wire.PSN{0x101, 0x103}))
	wantStatuses(t, polled(rg.scq), [2]uint64{0, 0}, [2]uint64{1, 0}, [2]uint64{2, 0})
	if s := rg.qp.Stats(); s.SACKsRecv != 2 || s.HolesOpened != 1 || s.HolesClosed != 1 {
		t.Fatalf("%+v", s)
	}
}

// TestWeakCompleterReorderThreshold: a PSN still missing is declared lost only once a
// packet sent ReorderThreshold transmissions after it was acknowledged; then it alone is
// sent again, and the window closes.
func TestWeakCompleterReorderThreshold(t *testing.T) {
	cfg := newRigConfig(Weak)
	cfg.Dev.ReorderThreshold = 3
	rg := newQPRig(t, cfg)
	rg.weakSends(6) // transmissions 1..6
	rg.deliver(sack(0x100, ackSyn, 4, [2]wire.PSN{0x102, 0x104}))
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("0x101 declared lost two transmissions later: %v", p)
	}
	rg.deliver(sack(0x100, ackSyn, 5, [2]wire.PSN{0x102, 0x105}))
	p := rg.sent()
	wantPSNs(t, p, 0x101)
	if !p[0].BTH.AckReq || p[0].ooh.TxSeq != 7 || rg.qp.Stats().SelectiveRetransmits != 1 || rg.qp.req.win != rg.d.winBase {
		t.Fatalf("retransmission %v %+v, %+v", p[0], p[0].ooh, rg.qp.Stats())
	}
	wantStatuses(t, polled(rg.scq), [2]uint64{0, 0})
	rg.deliver(sack(0x105, ackSyn, 7))
	if c := polled(rg.scq); len(c) != 5 {
		t.Fatalf("%d completions once the retransmission was acknowledged", len(c))
	}
}

// TestWeakCompleterRNRWait: an RNR NAK in SACK form acknowledges what it covers and starts
// one RNR wait, however many refused packets it answers (one RNR retry per wait); after
// the wait only the PSNs still missing go again.
func TestWeakCompleterRNRWait(t *testing.T) {
	cfg := newRigConfig(Weak)
	cfg.Attr.RNRRetry = 3
	rg := newQPRig(t, cfg)
	rg.weakSends(4)
	const code = 14
	rg.deliver(sack(0x100, wire.AETHRNR|code, 2, [2]wire.PSN{0x103, 0x104}))
	rg.deliver(sack(0x100, wire.AETHRNR|code, 3, [2]wire.PSN{0x103, 0x104}))
	wantStatuses(t, polled(rg.scq), [2]uint64{0, 0})
	if rg.qp.comp.rnrLeft != 2 || rg.qp.Stats().RNRNAKsRecv != 2 {
		t.Fatalf("two RNR NAKs in one wait: %d RNR retries left, %+v", rg.qp.comp.rnrLeft, rg.qp.Stats())
	}
	rg.after(wire.RNRTimer(code) - 1)
	if p := rg.sent(); len(p) != 0 {
		t.Fatalf("sent during the RNR wait: %v", p)
	}
	rg.after(1)
	wantPSNs(t, rg.sent(), 0x101, 0x102)
}

// TestWeakCompleterFatalNAK: a NAK in SACK form acknowledges what it covers, then fails
// the oldest work request not acknowledged with the NAK's status, and the QP.
func TestWeakCompleterFatalNAK(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Weak))
	rg.weakSends(3)
	rg.deliver(sack(0x100, wire.AETHNak|wire.NakRemoteAccessError, 1))
	c := polled(rg.scq)
	wantStatuses(t, c, [2]uint64{0, 0}, [2]uint64{1, uint64(StatusRemAccessErr)}, [2]uint64{2, uint64(StatusWRFlushErr)})
	if rg.qp.State() != StateErr || c[1].VendorErr != VendorRemoteNAK|wire.NakRemoteAccessError {
		t.Fatalf("state %v, %+v", rg.qp.State(), c[1])
	}
}

// TestWeakCompleterResponses: READ responses and atomic ACKs are taken wherever they
// fall, their work requests completing in posting order; a response again is a
// duplicate; what is not a weak completer's (an ordered ACK, a malformed SACK) is counted
// and dropped.
func TestWeakCompleterResponses(t *testing.T) {
	rg := newQPRig(t, newRigConfig(Weak))
	dst, md := rg.mem(4096)
	rg.post(SendWR{WRID: 1, Opcode: WRRead, Flags: FlagSignaled, RemoteAddr: 0x1000, RKey: 1, SG: []SGE{sge(md, 0, 2000)}},
		SendWR{WRID: 2, Opcode: WRAtomicFetch, Flags: FlagSignaled, RemoteAddr: 0x2000, RKey: 1, CompareAdd: 1, SG: []SGE{sge(md, 2048, 8)}})
	p := rg.sent()
	wantPSNs(t, p, 0x100, 0x102)
	if p[0].BTH.Opcode != wire.OpWeakReadReq || p[1].BTH.Opcode != wire.OpWeakFetchAdd {
		t.Fatalf("sent %v", p)
	}
	data := testutil.Pattern(2000, 4)
	rg.deliver(rigPkt{Op: wire.OpAtomicAcknowledge, PSN: 0x102, AETH: wire.AETH{Syndrome: ackSyn}, AtomicAck: 77})
	rg.deliver(rigPkt{Op: wire.OpReadResponseLast, PSN: 0x101, AETH: wire.AETH{Syndrome: ackSyn}, Payload: data[1024:]})
	if c := polled(rg.scq); len(c) != 0 || binary.NativeEndian.Uint64(dst[2048:]) != 77 || dst[1024] != data[1024] {
		t.Fatalf("before the READ's first response: completions %+v; responses not placed on arrival", c)
	}
	h := rg.qp.Holes().Requester
	if len(h) != 1 || h[0].Start != 0x100 || h[0].Counts != [holes.MaxKinds]uint32{0, 0, 1} {
		t.Fatalf("requester holes %+v, want the answered atomic held on [0x100, 0x101)", h)
	}
	rg.deliver(rigPkt{Op: wire.OpReadResponseFirst, PSN: 0x100, AETH: wire.AETH{Syndrome: ackSyn}, Payload: data[:1024]})
	c := polled(rg.scq)
	wantStatuses(t, c, [2]uint64{1, 0}, [2]uint64{2, 0})
	if c[0].Opcode != WCRead || c[1].Opcode != WCFetchAdd || string(dst[:2000]) != string(data) || rg.qp.req.rdOut != 0 {
		t.Fatalf("completions %+v, READ data equal %v, %d outstanding", c, string(dst[:2000]) == string(data), rg.qp.req.rdOut)
	}
	before := rg.qp.Stats()
	rg.deliver(rigPkt{Op: wire.OpReadResponseFirst, PSN: 0x100, AETH: wire.AETH{Syndrome: ackSyn}, Payload: data[:1024]})
	rg.deliver(okAck(0x101))
	bad := sack(0x102, ackSyn, 1, [2]wire.PSN{0x104, 0x105})
	bad.SACKCount = 2 // one range there
	rg.deliver(bad)
	s := rg.qp.Stats()
	if s.Duplicates != before.Duplicates+1 || s.WrongMode != before.WrongMode+1 || s.Dropped != before.Dropped+1 {
		t.Fatalf("duplicate, ordered ACK, malformed SACK: %+v", s)
	}
}
