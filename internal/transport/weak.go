package transport

import (
	"github.com/softrnic/softrnic/internal/holes"
	"github.com/softrnic/softrnic/internal/wire"
)

// Weakly-ordered mode (as IRN, Falcon's weakly-ordered RDMA and NVIDIA's out-of-order
// placement): every packet describes itself and is placed the moment it arrives; what it
// completes is held, counted on the hole in the PSN space it waits for, and released in
// order when that hole closes (package holes). Losses are found from selective
// acknowledgements with a reordering threshold, or by the retransmission timer with
// back-off, and only the lost packets are sent again.
//
// Responder, per hole: receive completions (SEND, WRITE with immediate) whose CQEs are
// posted when it closes; READ requests whose responses are prepared but held for the
// doorbell that rings when it closes; atomics, executed when it closes.
// Requester, per hole in the acknowledged/answered PSNs: READ work requests whose
// responses all arrived, SEND/WRITE work requests all acknowledged, atomics answered; they
// complete when it closes.
//
// Memory visibility: bytes of a message may land in any order. Only a completion (a CQE,
// or a later message's CQE) says a message's bytes are all there; polling the last byte
// of a buffer does not.

// Kinds of held items.
const (
	// Responder.
	kindRecv    holes.Kind = 0 // a receive completion (SEND, WRITE with immediate)
	kindReadReq holes.Kind = 1 // a READ request whose responses wait for the doorbell
	kindAtomic  holes.Kind = 2 // an atomic, executed when the hole closes
	// Requester.
	kindSendDone   holes.Kind = 0 // a SEND or WRITE work request, acknowledged
	kindReadDone   holes.Kind = 1 // a READ work request, all responses arrived
	kindAtomicDone holes.Kind = 2 // an atomic work request, answered
)

// psnMeta is what the requester knows about one PSN in flight.
type psnMeta struct {
	sentAt int64  // device time of its last (re)transmission or of its READ request
	seq    uint32 // transmission number of its last (re)transmission or of its READ request
	wqe    uint32 // low bits of the index of the WQE it belongs to
	resp   bool   // completed by a response (READ, atomic), not by an acknowledgement
	queued bool   // on the retransmission list
	retx   bool   // sent more than once (no round-trip sample from it)
}

// weakMsg is a message that consumes a receive WQE, while its packets arrive.
type weakMsg struct {
	valid  bool
	rsn    wire.PSN
	first  wire.PSN // the message's first PSN
	npk    uint32   // packets
	got    uint32   // packets placed
	length uint32
	imm    uint32
	hasImm bool
	se     bool
	write  bool // WRITE with immediate
	wqe    recvWQE
}

// weakState is a weakly-ordered QP's bookkeeping, both directions.
type weakState struct {
	span    uint32
	reorder int32

	// Requester.
	done     *holes.Tracker // PSNs acknowledged or answered; Base is una
	meta     []psnMeta      // by PSN & (span-1)
	txSeq    uint32         // transmissions so far
	inflight uint32         // PSNs sent and not yet acknowledged or answered
	ackedSeq uint32         // highest transmission number found acknowledged or answered
	lost     []wire.PSN     // PSNs to retransmit (entries whose meta is no longer queued are stale)
	backoff  uint8          // retransmission timer doublings since the last progress
	probeAt  int64          // loss probe deadline (0: not armed)
	probeBo  uint8          // loss probe doublings since the last progress
	probe    int64          // minimum loss probe interval
	srtt     int64          // smoothed round trip (ns), from first transmissions only
	rttvar   int64
	sample   int64 // round trip measured by the packet being processed (0: none)
	nextRSN  wire.PSN
	nextRdSN wire.PSN
	// rdBase is the oldest read sequence number (READ request or atomic) not yet
	// complete; rdDone marks those after it that are, by sequence number & (len-1).
	// A new one may go out only within max_rd_atomic of rdBase: the responder keeps its
	// resource in slot seq % max_dest_rd_atomic, and in weak mode requests complete out of
	// order, so a count of outstanding ones is not enough — a later request would take the
	// slot of an older one whose lost responses are still to be asked for again.
	rdBase wire.PSN
	rdDone [256]bool

	// Responder.
	arrived *holes.Tracker // request PSNs arrived; Base is the expected PSN
	highTx  uint32         // highest transmission number received (echoed in SACKs)
	msgs    []weakMsg      // by receive sequence number & (span-1)
	rsnBase wire.PSN       // receive sequence number of the next receive WQE to consume
	inMsgs  uint32         // messages with a receive WQE in progress (not all packets placed)
	inSegs  uint32         // their packets placed
	// rnrQuiet: an RNR NAK went out for rnrPSN and no message has bound a receive WQE
	// since; packets refused meanwhile get no NAK of their own (the requester resends after
	// the one wait; a NAK per packet, arriving after that wait, would each cost a retry).
	rnrQuiet bool
	rnrPSN   wire.PSN

	items  []holes.Item  // scratch
	ranges [][2]wire.PSN // scratch
}

func newWeakState(q *QP, span uint32, epsn wire.PSN) *weakState {
	ws := &weakState{
		reorder: int32(q.dev.cfg.ReorderThreshold),
		probe:   int64(q.dev.cfg.LossProbe),
		arrived: holes.New(epsn, span),
		done:    holes.New(0, span),
	}
	ws.span = ws.arrived.Span()
	ws.meta = make([]psnMeta, ws.span)
	ws.msgs = make([]weakMsg, ws.span)
	return ws
}

// Responder.

// The mode seam (see mode.go).

func (*weakState) weak() bool { return true }
func (ws *weakState) holes() Holes {
	return Holes{Responder: ws.arrived.Holes(nil), Requester: ws.done.Holes(nil)}
}

func (ws *weakState) holeCounts() (opened, closed uint64) {
	return ws.arrived.Opened + ws.done.Opened, ws.arrived.Closed + ws.done.Closed
}
