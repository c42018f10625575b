package transport

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/softrnic/softrnic/internal/lockrank"
	"github.com/softrnic/softrnic/internal/netio"
	"github.com/softrnic/softrnic/internal/wire"
)

// MaxMessage is the largest message (sum of a work request's scatter/gather list), 2^31
// bytes as in InfiniBand.
const MaxMessage = 1 << 31

// packetsFor returns how many packets of mtu bytes a message of n bytes takes (at least
// one: a zero-length message is one packet), computed without the uint32 wrap that
// (n+mtu-1)/mtu has for n near 2^32.
func packetsFor(n, mtu uint32) uint32 {
	return uint32(max((uint64(n)+uint64(mtu)-1)/uint64(mtu), 1))
}

// Service is a QP's transport service.
type Service uint8

// Services.
const (
	ServiceRC Service = iota // reliable connected
	ServiceUD                // unreliable datagram
)

func (s Service) String() string {
	if s == ServiceUD {
		return "UD"
	}
	return "RC"
}

// QPConfig holds what a QP is created with.
type QPConfig struct {
	Service        Service
	PD             uint32
	SendCQ, RecvCQ *CQ
	SRQ            *RecvQueue // nil: the QP gets its own receive queue
	MaxSendWR      int
	MaxRecvWR      int
	MaxSendSGE     int
	MaxRecvSGE     int
	MaxInline      int
	SigAll         bool
	// GSI makes the QP the device's general services interface: a UD QP with QP number
	// 1, the one CM MADs are sent to. There is at most one; it does not count against
	// MaxQP.
	GSI bool
}

// QP is a queue pair: a send queue and a receive queue (its own, or a shared one), in
// one of two transport services, chosen at creation: reliable connected (RC), connected
// to one peer QP whose requests it answers and which acknowledges its own, or unreliable
// datagram (UD), sending single-packet messages to any QP and receiving them from any.
// Its attributes and their state machine (ModifyQP's) are in attr.go and state.go, posting
// in post.go; what the services and an RC QP's ordering modes do is in service.go and
// mode.go, and the roles' files they name.
type QP struct {
	// Set at creation, read without a lock.
	service    Service
	svc        service // what the service does (service.go)
	dev        *Device
	qpn        uint32
	pd         uint32
	sendCQ     *CQ
	recvCQ     *CQ
	rq         *RecvQueue
	home       *queue // the receive queue the QP lives on (see queue), set with qpn
	srq        bool
	sigAll     bool
	maxSendSGE int
	maxInline  int

	// Owner is the verbs object wrapping this QP.
	Owner any

	// mu guards every field from here to the timer's (see the package doc), except
	// srqPolled (atomic).
	mu        mutex
	state     QPState
	destroyed bool
	attr      Attr // as last set (for QueryQP)
	mtu       uint32
	// peer is replaced, never modified, by ModifyQP: batches being sent without q.mu keep
	// pointing at the address they were built for.
	peer      *netio.Addr
	txFlow    wire.Flow
	txPrefix  wire.PrefixCache // the ICRC pseudo-header's CRC for what it sends last (q.mu)
	src       int              // the device socket its packets leave from (netio source; see sourceFor)
	sqdNotify bool

	sq sendQueue // posted by PostSend, sent by the requester, retired by the completer

	req   requester   // RC: sends requests (requester.go)
	comp  completer   // RC: handles their responses (completer.go)
	resp  responder   // RC: answers the peer's requests (responder.go)
	ord   ordered     // ordered mode's parts of the three roles (ordered*.go)
	weak  *weakState  // weak mode's roles; nil unless the QP is weakly ordered (weak*.go)
	lq    *limitQueue // limit queue; nil: no limits
	stats Stats

	share     float64       // statistical share of the SRQ, WQEs per second (SetShare)
	srqTaken  uint64        // receive WQEs taken from the SRQ
	srqPolled atomic.Uint64 // their completions polled by the consumer

	txOwner    bool      // a goroutine is building/sending this QP's requests (see the package doc)
	txIdle     sync.Cond // signalled (L: mu) when a destroyed QP's transmit owner lets go
	txPending  bool      // more requester work arrived while another goroutine owned transmit
	txMore     bool      // the receive path's last fill stopped on a full batch
	kickQueued bool      // on the receive path's kick list
	commEst    bool

	// Guarded by the device's timerQueue.mu.
	timerAt  int64 // deadline the timer heap holds for this QP (0: none)
	timerIdx int
}

// CreateQP creates a QP in the RESET state.
func (d *Device) CreateQP(c QPConfig) (*QP, error) {
	if c.SendCQ == nil || c.RecvCQ == nil {
		return nil, errors.New("QP needs a send CQ and a receive CQ")
	}
	if c.MaxSendWR < 1 {
		c.MaxSendWR = 1
	}
	q := &QP{
		service: c.Service, dev: d, pd: c.PD, sendCQ: c.SendCQ, recvCQ: c.RecvCQ, sigAll: c.SigAll,
		maxSendSGE: c.MaxSendSGE, maxInline: c.MaxInline, timerIdx: -1,
	}
	if c.Service == ServiceUD {
		q.svc = newUDService(q)
		q.mtu = uint32(wire.MTUBytes(d.cfg.MTU)) // a UD message is one packet of up to the port's MTU
	} else {
		q.svc = rc{q}
	}
	q.mu.Rank = lockrank.QP
	q.txIdle.L = &q.mu
	q.sq.init(c.MaxSendWR, c.MaxSendSGE, c.MaxInline)
	if c.SRQ != nil {
		q.rq, q.srq = c.SRQ, true
	} else {
		q.rq = d.NewRecvQueue(c.PD, max(c.MaxRecvWR, 1), c.MaxRecvSGE, false)
	}
	if c.GSI && c.Service != ServiceUD {
		return nil, errors.New("the GSI QP is a UD QP")
	}
	q.resp.init(q)
	q.req.q, q.comp.q = q, q
	q.setOrdering(Ordered, 0)
	if c.GSI {
		if err := d.claimGSI(q); err != nil {
			return nil, err
		}
	} else if err := d.allocQPN(q); err != nil {
		return nil, err
	}
	q.sendCQ.addQueue(q.home)
	q.recvCQ.addQueue(q.home)
	return q, nil
}

// QPN returns the QP number.
func (q *QP) QPN() uint32 { return q.qpn }

// State returns the current state.
func (q *QP) State() QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// Device returns the device the QP belongs to.
func (q *QP) Device() *Device { return q.dev }

// Destroy removes the QP. Outstanding work is dropped without completions, as
// ibv_destroy_qp does. When it returns, nothing of the QP is in flight any more: no
// goroutine is sending its packets (which reference registered memory).
func (q *QP) Destroy() {
	q.mu.Lock()
	// An ACK held back to ride along with the next send (ackDelay) is owed for messages
	// this side has already completed: it goes out now. Dropped, it would leave the peer's
	// last SEND or WRITE unacknowledged, to end in its retry-exceeded error once this QP is
	// gone (ibv_rc_pingpong's server: the client destroys its QP as soon as the server's
	// last SEND completes there).
	if q.resp.ackDeferred && q.state != StateReset && q.state != StateErr {
		q.flushAckRelock() // releases and retakes q.mu
	}
	q.destroyed = true
	q.state = StateReset
	for q.txOwner {
		q.txIdle.Wait()
	}
	q.mu.Unlock()
	// Whoever holds the receive path sends what it built before releasing it.
	q.dev.Quiesce()
	q.home.timers.cancel(q)
	q.dev.freeQPN(q)
}
