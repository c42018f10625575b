package verbs

import (
	"fmt"

	"github.com/softrnic/softrnic/internal/transport"
)

// SRQ is a shared receive queue (ibv_srq): many QPs created with it take their receive
// WQEs from it instead of a receive queue of their own. Completions name the QP each
// message arrived on (WorkCompletion.QPNum).
type SRQ struct {
	pd   *PD
	rq   *transport.RecvQueue
	max  int
	sge  int
	qps  int // QPs using it (guarded by ctx.mu)
	dead bool
}

// SRQInitAttr is what CreateSRQ takes (ibv_srq_init_attr). SRQLimit is ignored, as by
// ibv_create_srq; arm the limit with ModifySRQ.
type SRQInitAttr struct {
	MaxWR    int
	MaxSGE   int
	SRQLimit int
}

// SRQAttr are an SRQ's attributes (ibv_srq_attr).
type SRQAttr struct {
	MaxWR    int // capacity
	MaxSGE   int
	SRQLimit int // armed low watermark; 0 when disarmed (also after the limit event fired)
}

// SRQAttrMask selects what ModifySRQ changes (ibv_srq_attr_mask values).
type SRQAttrMask int

// SRQ attribute mask bits.
const (
	SRQAttrMaxWR SRQAttrMask = 1 // resize
	SRQAttrLimit SRQAttrMask = 2 // arm the limit event
)

// CreateSRQ creates a shared receive queue with room for attr.MaxWR receive WQEs of up to
// attr.MaxSGE scatter elements.
func (pd *PD) CreateSRQ(attr *SRQInitAttr) (*SRQ, error) {
	if attr == nil {
		return nil, fmt.Errorf("verbs: CreateSRQ: %w: nil attributes", ErrInvalid)
	}
	switch {
	case attr.MaxWR < 1 || attr.MaxWR > maxSRQWR:
		return nil, fmt.Errorf("verbs: CreateSRQ: %w: max_wr %d not in 1..%d", ErrInvalid, attr.MaxWR, maxSRQWR)
	case attr.MaxSGE < 0 || attr.MaxSGE > maxSGE:
		return nil, fmt.Errorf("verbs: CreateSRQ: %w: max_sge %d not in 0..%d", ErrInvalid, attr.MaxSGE, maxSGE)
	}
	c := pd.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.srqs >= maxSRQ {
		return nil, fmt.Errorf("verbs: CreateSRQ: %w (max_srq %d)", ErrLimit, maxSRQ)
	}
	if err := pd.use(); err != nil {
		return nil, fmt.Errorf("verbs: CreateSRQ: %w", err)
	}
	s := &SRQ{pd: pd, rq: c.dev.NewRecvQueue(pd.id, attr.MaxWR, attr.MaxSGE, true), max: attr.MaxWR, sge: attr.MaxSGE}
	s.rq.Owner = s
	c.srqs++
	return s, nil
}

// ModifySRQ resizes the SRQ (SRQAttrMaxWR; not below what is posted) or arms its limit
// (SRQAttrLimit): when a QP takes a WQE and fewer than SRQLimit remain posted, an
// EventSRQLimitReached asynchronous event is raised once and the limit is disarmed.
func (s *SRQ) ModifySRQ(attr *SRQAttr, mask SRQAttrMask) error {
	if attr == nil {
		return fmt.Errorf("verbs: ModifySRQ: %w: nil attributes", ErrInvalid)
	}
	if mask&^(SRQAttrMaxWR|SRQAttrLimit) != 0 || mask == 0 {
		return fmt.Errorf("verbs: ModifySRQ: %w: mask %#x (want SRQAttrMaxWR and/or SRQAttrLimit)", ErrInvalid, int(mask))
	}
	c := s.pd.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.dead {
		return fmt.Errorf("verbs: ModifySRQ: %w", ErrClosed)
	}
	max := s.max
	if mask&SRQAttrMaxWR != 0 {
		if attr.MaxWR < 1 || attr.MaxWR > maxSRQWR {
			return fmt.Errorf("verbs: ModifySRQ: %w: max_wr %d not in 1..%d", ErrInvalid, attr.MaxWR, maxSRQWR)
		}
		max = attr.MaxWR
	}
	if mask&SRQAttrLimit != 0 && (attr.SRQLimit < 0 || attr.SRQLimit > max) {
		return fmt.Errorf("verbs: ModifySRQ: %w: srq_limit %d exceeds max_wr %d", ErrInvalid, attr.SRQLimit, max)
	}
	if mask&SRQAttrMaxWR != 0 {
		if err := s.rq.Resize(max); err != nil {
			return fmt.Errorf("verbs: ModifySRQ: %w: %v", ErrInvalid, err)
		}
		s.max = max
	}
	if mask&SRQAttrLimit != 0 {
		if err := s.rq.SetLimit(attr.SRQLimit); err != nil {
			return fmt.Errorf("verbs: ModifySRQ: %w: %v", ErrInvalid, err)
		}
	}
	return nil
}

// QuerySRQ returns the SRQ's attributes.
func (s *SRQ) QuerySRQ() SRQAttr {
	c := s.pd.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	return SRQAttr{MaxWR: s.max, MaxSGE: s.sge, SRQLimit: s.rq.Limit()}
}

// Posted returns the number of receive WQEs waiting in the SRQ.
func (s *SRQ) Posted() int { return s.rq.Posted() }

// PostSRQRecv posts receive work requests. It stops at the first it refuses; a
// *PostError says which.
func (s *SRQ) PostSRQRecv(wrs []RecvWR) error {
	var buf [postChunk]transport.RecvWR
	for done := 0; done < len(wrs); {
		n := min(postChunk, len(wrs)-done)
		for i := 0; i < n; i++ {
			buf[i] = transport.RecvWR{WRID: wrs[done+i].WRID, SG: wrs[done+i].SGList}
		}
		posted, err := s.rq.Post(buf[:n])
		clear(buf[:n])
		if err != nil {
			return &PostError{Op: "PostSRQRecv", Index: done + posted, Err: postReason(err)}
		}
		done += n
	}
	return nil
}

// DestroySRQ destroys the SRQ; it fails while QPs use it. It waits until the SRQ's
// asynchronous events taken with GetAsyncEvent were acknowledged.
func (s *SRQ) DestroySRQ() error {
	c := s.pd.ctx
	c.mu.Lock()
	if s.dead {
		c.mu.Unlock()
		return fmt.Errorf("verbs: DestroySRQ: %w", ErrClosed)
	}
	if s.qps > 0 {
		c.mu.Unlock()
		return fmt.Errorf("verbs: DestroySRQ: %w: %d QPs use the SRQ", ErrBusy, s.qps)
	}
	s.dead = true
	s.pd.users--
	c.srqs--
	c.mu.Unlock()
	s.rq.Destroy()
	c.events.forget(s)
	return nil
}

// PD returns the SRQ's protection domain.
func (s *SRQ) PD() *PD { return s.pd }

// LimitKind is a dimension of a QP's limit queue.
type LimitKind int

// Limit queue dimensions.
const (
	LimitSRQHeld     LimitKind = LimitKind(transport.LimitSRQHeld)     // SRQ WQEs taken whose completions were not polled yet
	LimitInOrderMsgs LimitKind = LimitKind(transport.LimitInOrderMsgs) // messages being received in order
	LimitInOrderSegs LimitKind = LimitKind(transport.LimitInOrderSegs) // packets received of those
	LimitOOOMsgs     LimitKind = LimitKind(transport.LimitOOOMsgs)     // weak mode: messages complete beyond a hole
	LimitOOOSegs     LimitKind = LimitKind(transport.LimitOOOSegs)     // weak mode: packets received beyond the first hole
	LimitHoleSpan    LimitKind = LimitKind(transport.LimitHoleSpan)    // weak mode: PSNs from the first missing to the highest received
	NumLimits                  = int(transport.NumLimits)
)

func (k LimitKind) String() string { return transport.LimitKind(k).String() }

// Limit is a soft and a hard bound (0: none).
type Limit struct{ Soft, Hard uint32 }

// HardAction is the automatic response to a hard limit.
type HardAction int

// Hard-limit responses.
const (
	HardRNR  HardAction = HardAction(transport.HardRNR)  // refuse the packet with an RNR NAK
	HardDrop HardAction = HardAction(transport.HardDrop) // drop the connection (QP to ERR, EventQPFatal naming the limit)
)

// Decision is what a limit queue did about a packet that reached a limit.
type Decision int

// Decisions.
const (
	DecideBorrow   Decision = Decision(transport.DecideBorrow)   // soft limit, within its share: accepted
	DecidePace     Decision = Decision(transport.DecidePace)     // soft limit, over its share: RNR NAK
	DecideEscalate Decision = Decision(transport.DecideEscalate) // soft limit, over its share and not draining, repeatedly: hard action
	DecideHardRNR  Decision = Decision(transport.DecideHardRNR)  // hard limit: RNR NAK
	DecideHardDrop Decision = Decision(transport.DecideHardDrop) // hard limit: connection dropped
	NumDecisions            = int(transport.NumDecisions)
)

func (d Decision) String() string { return transport.Decision(d).String() }

// LimitConfig configures a QP's limit queue: per dimension a soft and a hard limit, the
// hard-limit response, the burst a connection may take beyond its share, and how many soft
// hits over its share without its completions draining escalate to the hard response.
type LimitConfig struct {
	Limits        [NumLimits]Limit
	OnHard        HardAction
	Burst         float64
	EscalateAfter int
}

// LimitStats are a QP's limit queue usage and decisions.
type LimitStats struct {
	Usage     [NumLimits]uint32
	Peak      [NumLimits]uint32
	SoftHits  [NumLimits]uint64
	HardHits  [NumLimits]uint64
	Decisions [NumDecisions]uint64
	Taken     uint64  // SRQ WQEs the QP took
	Polled    uint64  // their completions polled
	Share     float64 // WQEs per second of its statistical share (set with SetShare)
	Tokens    float64 // its token bucket: positive while within its share
	Dropped   bool
	DropWhy   string
}

// SetLimits gives the QP a limit queue (nil removes it). Everything is decided locally,
// with no message to the peer: on reaching a soft limit the QP looks at its recent
// behaviour — consumption against its share, whether its completions drain, its recent
// soft-limit hits — and lets it borrow, paces it with an RNR NAK, or escalates; on reaching
// a hard limit it sends an RNR NAK or drops the connection.
func (q *QP) SetLimits(c *LimitConfig) {
	if c == nil {
		q.qp.SetLimits(nil)
		return
	}
	tc := transport.LimitConfig{OnHard: transport.HardAction(c.OnHard), Burst: c.Burst, EscalateAfter: c.EscalateAfter}
	for i, l := range c.Limits {
		tc.Limits[i] = transport.Limit{Soft: l.Soft, Hard: l.Hard}
	}
	q.qp.SetLimits(&tc)
}

// SetShare sets the QP's statistical share of its SRQ, in WQEs per second: the rate its
// limit queue's token bucket refills at.
func (q *QP) SetShare(perSecond float64) { q.qp.SetShare(perSecond) }

// SRQDemand returns how many SRQ receive WQEs the QP has taken so far and how many of its
// requests its limit queue has refused (paced, or RNR NAKed at a hard limit). It is
// cheap: what a provisioner samples every interval on every connection.
func (q *QP) SRQDemand() (taken, refused uint64) { return q.qp.SRQDemand() }

// LimitStats returns the QP's limit queue usage and decisions.
func (q *QP) LimitStats() LimitStats {
	s := q.qp.LimitStats()
	r := LimitStats{Taken: s.Taken, Polled: s.Polled, Share: s.Share, Tokens: s.Tokens, Dropped: s.Dropped, DropWhy: s.DropWhy}
	for i := 0; i < NumLimits; i++ {
		r.Usage[i], r.Peak[i], r.SoftHits[i], r.HardHits[i] = s.Usage[i], s.Peak[i], s.SoftHits[i], s.HardHits[i]
	}
	for i := 0; i < NumDecisions; i++ {
		r.Decisions[i] = s.Decisions[i]
	}
	return r
}
