package rsocket

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/softrnic/softrnic/verbs"
)

// stack is what the rsockets of one device share: a protection domain for their
// memory, and one completion channel that all their completion queues raise events on,
// read by one goroutine (events) that moves the connection whose queue it was, as the
// network poller moves sockets. A device's stack lives until the device closes.
type stack struct {
	dev *verbs.Device
	pd  *verbs.PD
	ch  *verbs.CompChannel

	mu    sync.Mutex
	conns map[*verbs.CQ]*Conn // guarded by mu
}

var (
	stacksMu sync.Mutex
	stacks   = map[*verbs.Device]*stack{}
)

// stackFor returns dev's stack, making it on first use.
func stackFor(dev *verbs.Device) (*stack, error) {
	if dev == nil {
		return nil, errors.New("nil device")
	}
	stacksMu.Lock()
	defer stacksMu.Unlock()
	if s := stacks[dev]; s != nil {
		return s, nil
	}
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	ch, err := dev.CreateCompChannel()
	if err != nil {
		pd.DeallocPD()
		return nil, err
	}
	s := &stack{dev: dev, pd: pd, ch: ch, conns: map[*verbs.CQ]*Conn{}}
	stacks[dev] = s
	go s.events()
	return s, nil
}

// events hands each completion event to its connection until the device closes.
func (s *stack) events() {
	defer func() {
		stacksMu.Lock()
		if stacks[s.dev] == s {
			delete(stacks, s.dev)
		}
		stacksMu.Unlock()
	}()
	for {
		cq, err := s.ch.GetCQEvent(context.Background())
		if err != nil {
			return
		}
		cq.AckCQEvents(1)
		s.mu.Lock()
		c := s.conns[cq]
		s.mu.Unlock()
		if c != nil {
			c.onEvent()
		}
	}
}

// newCQ makes a completion queue whose events go to c.
func (s *stack) newCQ(cqe int, c *Conn) (*verbs.CQ, error) {
	cq, err := s.dev.CreateCQ(cqe, s.ch, verbs.NoHandler)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.conns[cq] = c
	s.mu.Unlock()
	return cq, nil
}

// dropCQ destroys a connection's completion queue.
func (s *stack) dropCQ(cq *verbs.CQ) error {
	s.mu.Lock()
	delete(s.conns, cq)
	s.mu.Unlock()
	if err := cq.DestroyCQ(); err != nil {
		return fmt.Errorf("destroy CQ: %w", err)
	}
	return nil
}
