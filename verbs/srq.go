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
			buf[i] = transport.RecvWR{WRID: wrs[done+i].WRID, SG: tsges(wrs[done+i].SGList)}
		}
		posted, err := s.rq.Post(buf[:n])
		clear(buf[:n])
		if err != nil {
			return &PostError{Index: done + posted, Err: postReason(err)}
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
	c.events.forget(s)
	return nil
}

// PD returns the SRQ's protection domain.
func (s *SRQ) PD() *PD { return s.pd }
