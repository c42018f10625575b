package transport

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/internal/wire"
)

// A QP's limit queue bounds how much of the shared receive resources one connection may
// use, and decides locally — without a message to any other node — what to do when it
// reaches a limit. Each dimension has a soft and a hard limit (0: none).
//
// Reaching a soft limit starts an analysis of the connection's recent behaviour: its
// consumption of receive WQEs against its statistical share (a token bucket the SRQ
// manager refills at the share it computed), whether its completions drain (the consumer
// polls them as fast as they come), and its recent history of soft-limit hits. The
// response is graded: borrow (let it exceed its share for now), pace (refuse this packet
// with an RNR NAK whose timer is the time its share takes to earn it a WQE again: the
// requester waits and tries again), or escalate (treat
// it as the hard limit). Reaching a hard limit gives the automatic response: an RNR NAK,
// or dropping the connection (the QP goes to ERR, an asynchronous event names the limit,
// and the peer's requests fail with a NAK).
//
// Every packet beyond a soft limit spends a token, whether or not it takes a receive WQE:
// a connection over its soft limit on segments, out-of-order segments or the hole span
// borrows a burst, then is paced. A packet that takes a receive WQE is paced with an RNR
// NAK, as above. One that takes none (an RDMA WRITE without immediate) has no RNR: IBTA
// gives RNR NAKs for receive resources, and rxe and ConnectX never send one for a WRITE.
// It is paced the way a NIC whose buffers are full paces it: dropped, neither placed nor
// acknowledged, so that the requester's own loss recovery sends it again later — in weak
// mode after its reorder threshold or loss probe, selectively; in ordered mode from the
// sequence NAK the next packet causes. Only the connection over its limit pays for it.

// LimitKind is a dimension a limit queue bounds.
type LimitKind uint8

// Dimensions.
const (
	LimitSRQHeld LimitKind = iota // SRQ receive WQEs taken whose completions the consumer has not polled
	// LimitInOrderMsgs counts messages being received: started, not complete. An ordered
	// QP receives one message at a time, so there it is 0 or 1 (a limit of 1 never
	// refuses); a weakly-ordered QP can have many in progress at once, their packets
	// interleaved or arriving ahead of earlier messages, and there the limit bounds them.
	LimitInOrderMsgs
	LimitInOrderSegs // packets received of those messages
	LimitOOOMsgs     // weak mode: messages complete beyond a hole, held
	LimitOOOSegs     // weak mode: packets received beyond the first hole
	LimitHoleSpan    // weak mode: PSNs from the first missing to the highest received
	NumLimits
)

var limitNames = [NumLimits]string{"SRQ entries held", "in-order messages", "in-order segments",
	"out-of-order messages", "out-of-order segments", "hole span"}

func (k LimitKind) String() string {
	if k < NumLimits {
		return limitNames[k]
	}
	return fmt.Sprintf("limit %d", uint8(k))
}

// Limit is a soft and a hard bound on one dimension (0: none).
type Limit struct{ Soft, Hard uint32 }

// HardAction is the automatic response to a hard limit.
type HardAction uint8

// Hard-limit responses.
const (
	HardRNR  HardAction = iota // refuse the packet with an RNR NAK
	HardDrop                   // drop the connection: QP to ERR, async event, peer NAKed
)

// Decision is what the limit queue did about a packet that reached a limit.
type Decision uint8

// Decisions.
const (
	DecideBorrow   Decision = iota // soft limit: within its share, or draining well: accepted
	DecidePace                     // soft limit: over its share: refused with an RNR NAK
	DecideEscalate                 // soft limit: over its share, not draining, again and again: hard action
	DecideHardRNR                  // hard limit: RNR NAK
	DecideHardDrop                 // hard limit: connection dropped
	NumDecisions
)

var decisionNames = [NumDecisions]string{"borrow", "pace", "escalate", "hard RNR", "hard drop"}

func (d Decision) String() string {
	if d < NumDecisions {
		return decisionNames[d]
	}
	return "unknown"
}

// LimitConfig configures a QP's limit queue.
type LimitConfig struct {
	Limits [NumLimits]Limit
	OnHard HardAction
	// Burst is how many WQEs beyond its share a connection may take in a burst before the
	// analysis says it is over its share (the token bucket's depth; default 16).
	Burst float64
	// EscalateAfter is how many soft-limit hits over its share in a row, without its
	// completions draining, escalate to the hard action (default 8).
	EscalateAfter int
}

// LimitStats are a limit queue's usage and decisions.
type LimitStats struct {
	Usage     [NumLimits]uint32
	Peak      [NumLimits]uint32
	SoftHits  [NumLimits]uint64
	HardHits  [NumLimits]uint64
	Decisions [NumDecisions]uint64
	Taken     uint64  // SRQ WQEs taken so far
	Polled    uint64  // their completions polled by the consumer
	Share     float64 // WQEs per second of this connection's statistical share (0: none set)
	Tokens    float64 // token bucket: positive while within its share
	Dropped   bool    // the connection was dropped by a hard limit
	DropWhy   string
}

// limitQueue is a QP's limit state (under q.mu, except the atomics).
type limitQueue struct {
	cfg        LimitConfig
	stats      LimitStats
	streak     int     // soft-limit hits over share in a row
	lastPolled uint64  // completions polled at the last analysis
	tokens     float64 // token bucket: refills at the QP's share, up to the burst
	lastAt     int64   // device time of the last refill
}

// SetLimits installs (or, with nil, removes) the QP's limit queue.
func (q *QP) SetLimits(c *LimitConfig) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c == nil {
		q.lq = nil
		return
	}
	cfg := *c
	if cfg.Burst <= 0 {
		cfg.Burst = 16
	}
	if cfg.EscalateAfter <= 0 {
		cfg.EscalateAfter = 8
	}
	if q.lq == nil {
		q.lq = &limitQueue{tokens: cfg.Burst, lastAt: q.dev.now()}
	}
	q.lq.cfg = cfg
}

// SetShare sets the WQEs per second this connection's statistical share of the SRQ
// allows (the limit queue's token bucket refills at it).
func (q *QP) SetShare(perSecond float64) {
	q.mu.Lock()
	q.share = perSecond
	q.mu.Unlock()
}

// LimitStats returns the limit queue's usage and decisions (zero without one). Taken
// and Polled are counted even without a limit queue.
func (q *QP) LimitStats() LimitStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	var s LimitStats
	if q.lq != nil {
		s = q.lq.stats
		s.Tokens = q.lq.tokens
		s.Usage = q.usage()
	}
	s.Share = q.share
	s.Taken = q.srqTaken
	s.Polled = q.srqPolled.Load()
	return s
}

// SRQDemand returns how many SRQ WQEs the QP has taken and how many of its requests its
// limit queue refused (paced, or RNR at a hard limit): cheap enough to sample every
// interval on thousands of QPs.
func (q *QP) SRQDemand() (taken, refused uint64) {
	q.mu.Lock()
	taken = q.srqTaken
	if q.lq != nil {
		refused = q.lq.stats.Decisions[DecidePace] + q.lq.stats.Decisions[DecideHardRNR]
	}
	q.mu.Unlock()
	return taken, refused
}

// usage computes the current usage of every dimension (q.mu held).
func (q *QP) usage() [NumLimits]uint32 {
	u := q.resp.order.usage()
	if taken, polled := q.srqTaken, q.srqPolled.Load(); taken > polled {
		u[LimitSRQHeld] = uint32(taken - polled)
	}
	return u
}

// admit decides about a request packet that would add add to each dimension (q.mu held);
// takesWQE says whether its message consumes a receive WQE (SEND, WRITE with immediate).
// It returns true to accept the packet; false when it was refused (with an RNR NAK, or
// dropped unacknowledged if it takes no WQE) or the connection was dropped.
func (q *QP) admit(psn wire.PSN, add *[NumLimits]uint32, takesWQE bool) bool {
	lq := q.lq
	u := q.usage()
	soft := false
	for k := LimitKind(0); k < NumLimits; k++ {
		v := u[k] + add[k]
		if v > lq.stats.Peak[k] {
			lq.stats.Peak[k] = v
		}
		l := lq.cfg.Limits[k]
		if add[k] == 0 {
			continue
		}
		if l.Hard != 0 && v > l.Hard {
			lq.stats.HardHits[k]++
			return q.hardLimit(psn, k, v, false)
		}
		if l.Soft != 0 && v > l.Soft {
			lq.stats.SoftHits[k]++
			soft = true
		}
	}
	if !soft {
		lq.streak = 0
		return true
	}
	switch q.analyse() {
	case DecideBorrow:
		lq.stats.Decisions[DecideBorrow]++
		return true
	case DecidePace:
		lq.stats.Decisions[DecidePace]++
		if takesWQE {
			q.resp.sendRNRTimer(psn, q.paceTimer())
		} else {
			q.stats.Dropped++ // dropped unacknowledged: the requester sends it again later
		}
		return false
	}
	lq.stats.Decisions[DecideEscalate]++
	for k := LimitKind(0); k < NumLimits; k++ {
		if l := lq.cfg.Limits[k]; add[k] != 0 && l.Soft != 0 && u[k]+add[k] > l.Soft {
			return q.hardLimit(psn, k, u[k]+add[k], true)
		}
	}
	return q.hardLimit(psn, LimitSRQHeld, u[LimitSRQHeld], true)
}

// analyse looks at the connection's recent behaviour at a soft limit: within its share
// (the token bucket, refilled at the share, is positive) it may borrow; over its share it
// is paced while its completions drain, and escalated once it stays over its share without
// draining, hit after hit.
func (q *QP) analyse() Decision {
	lq := q.lq
	now := q.dev.now()
	if share := q.share; share > 0 {
		lq.tokens = min(lq.tokens+share*float64(now-lq.lastAt)/1e9, lq.cfg.Burst)
	}
	lq.lastAt = now
	lq.tokens--
	if lq.tokens >= 0 {
		lq.streak = 0
		return DecideBorrow
	}
	lq.streak++
	// Draining: the consumer polled completions since the last look (or holds none).
	polled := q.srqPolled.Load()
	draining := polled != lq.lastPolled || q.srqTaken == polled
	lq.lastPolled = polled
	if draining || lq.streak < lq.cfg.EscalateAfter {
		return DecidePace
	}
	return DecideEscalate
}

// maxPace is the longest a pacing RNR NAK asks the requester to wait.
const maxPace = 100 * time.Millisecond

// paceTimer is the RNR timer code for pacing a connection over its share: long enough for
// its token bucket to hold a token again at its share's rate (the QP's minimum RNR timer
// without a share), at most maxPace.
func (q *QP) paceTimer() uint8 {
	code := q.attr.MinRNRTimer & 0x1F
	if q.share <= 0 {
		return code
	}
	wait := time.Duration((1 - q.lq.tokens) / q.share * 1e9)
	if wait > maxPace {
		wait = maxPace
	}
	if c := wire.RNRTimerCode(wait); code != 0 && c > code {
		return c
	}
	return code
}

// hardLimit applies the automatic response to a hard limit on k at value v (or to a soft
// limit the analysis escalated).
func (q *QP) hardLimit(psn wire.PSN, k LimitKind, v uint32, escalated bool) bool {
	lq := q.lq
	if lq.cfg.OnHard == HardRNR {
		lq.stats.Decisions[DecideHardRNR]++
		q.resp.sendRNR(psn)
		return false
	}
	lq.stats.Decisions[DecideHardDrop]++
	lq.stats.Dropped = true
	if escalated {
		lq.stats.DropWhy = fmt.Sprintf("soft limit on %v (%d > %d) escalated: over its share and not draining", k, v, lq.cfg.Limits[k].Soft)
	} else {
		lq.stats.DropWhy = fmt.Sprintf("hard limit on %v reached (%d > %d)", k, v, lq.cfg.Limits[k].Hard)
	}
	q.resp.respFatalEvent(wire.NakRemoteOpError, StatusRemOpErr, EventQPFatal, "connection dropped: "+lq.stats.DropWhy)
	return false
}
