package transport

import (
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// orderedRequester is the ordered requester's go-back-N: its packets carry the standard
// FIRST/MIDDLE/LAST/ONLY opcodes, the window bounds PSNs past the oldest unacknowledged one,
// and whatever must go again is sent again from the first PSN it covers (rewind).
type orderedRequester struct {
	r         *requester
	rewound   bool     // already went back to rewindPSN and is waiting for progress
	rewindPSN wire.PSN // PSN of the last go-back
}

func (o *orderedRequester) begin(psn wire.PSN) { o.r.resetPSN(psn) }

// fill: new packets only (what must go again, the requester goes back to).
func (o *orderedRequester) fill(b *netio.SendBatch) bool { return o.r.fillNew(b, 0) }

func (o *orderedRequester) window() int32 { return o.r.openWindow() }

// start: ordered packets carry no sequence numbers of their own.
func (*orderedRequester) start(*sendWQE) {}

// admit: the packet's PSNs lie within the window past una (as fill opened it).
func (o *orderedRequester) admit(_ *sendWQE, _, end wire.PSN) bool {
	return end.Diff(o.r.una) < o.r.win
}

// readSlot: fewer than max_rd_atomic READ requests and atomics are outstanding.
func (o *orderedRequester) readSlot(*sendWQE, wire.PSN) bool {
	return o.r.rdOut < int(o.r.q.attr.MaxRdAtomic)
}

// format: FIRST/MIDDLE/LAST/ONLY opcodes; a WRITE's RETH is on its first packet only.
func (*orderedRequester) format(w *sendWQE, idx uint32, last bool, _, _ uint64) (wire.Opcode, wire.OOH, bool, bool) {
	switch w.op {
	case WRRead:
		return wire.OpReadRequest, wire.OOH{}, false, false
	case WRAtomicCmpSwap:
		return wire.OpCompareSwap, wire.OOH{}, false, false
	case WRAtomicFetch:
		return wire.OpFetchAdd, wire.OOH{}, false, false
	}
	return requestOpcode(w.op, idx == 0, last), wire.OOH{}, false, false
}

// requestOpcode returns the opcode of a SEND's or WRITE's packet: FIRST, MIDDLE, LAST or
// ONLY, with the immediate on the last.
func requestOpcode(op uint8, first, last bool) wire.Opcode {
	var base wire.Opcode // FIRST, MIDDLE, LAST, LAST_IMM, ONLY, ONLY_IMM
	if op == WRWrite || op == WRWriteImm {
		base = wire.OpWriteFirst
	}
	imm := op == WRSendImm || op == WRWriteImm
	switch {
	case first && last && imm:
		return base + 5
	case first && last:
		return base + 4
	case first:
		return base
	case last && imm:
		return base + 3
	case last:
		return base + 2
	}
	return base + 1
}

// sent: go-back-N keeps no record of each packet; una and the send queue say it all.
func (*orderedRequester) sent(uint64, *sendWQE, wire.PSN, wire.PSN, int64) {}

// resend goes back to psn; after a local ACK timeout, with the window closed.
func (o *orderedRequester) resend(psn wire.PSN, timeout bool) {
	if timeout {
		o.r.closeWindow()
	}
	o.rewind(psn)
}

// probe: ordered mode arms no loss probe (the ACK timeout and sequence NAKs find losses).
func (*orderedRequester) probe(int64) bool { return false }

// rewind makes the requester send again from psn (go-back-N).
func (o *orderedRequester) rewind(psn wire.PSN) {
	r := o.r
	w := r.q.sq.rewind(psn)
	if w == nil {
		r.curPSN = r.nextPSN
		return
	}
	if psn.Before(w.firstPSN) {
		psn = w.firstPSN
	}
	r.curPSN = psn // a READ is re-requested from psn to the end of its chunk
	o.rewound, o.rewindPSN = true, psn
}

// goBackOnce makes the requester send again from una, unless it already went back there
// and has made no progress since (later packets of the same loss must not restart it
// again).
func (o *orderedRequester) goBackOnce() {
	r := o.r
	if !(o.rewound && o.rewindPSN == r.una) {
		r.closeWindow()
		o.rewind(r.una)
		r.q.home.queueKick(r.q)
	}
}
