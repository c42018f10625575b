package cm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/softrnic/softrnic/internal/mad"
	"github.com/softrnic/softrnic/verbs"
)

// QPConfig is what DialQP and AcceptQP make for a connection (rdma_create_ep's pd and
// qp_init_attr); every field may be left zero.
type QPConfig struct {
	// PD is the QP's protection domain. Nil makes one that the endpoint owns and Close
	// frees. Give one to share memory regions among connections, or to register memory
	// before the connection is made: the buffers of Recv, or a region whose address and
	// key go to the peer in the private data.
	PD *verbs.PD
	// Cap are the QP's queue sizes; zero fields take 64 work requests each way and one
	// scatter/gather element each (no inline data).
	Cap verbs.QPCap
	// CQE is the size of the completion queue both of the QP's queues complete to
	// (0: MaxSendWR + MaxRecvWR).
	CQE int
	// SRQ, if set, is the shared receive queue the QP takes its receives from (the QP
	// then has no receive queue of its own); PD, if set, must be the SRQ's.
	SRQ *verbs.SRQ
	// SQSigAll makes every send work request signaled.
	SQSigAll bool
	// Recv are receives posted to the QP before the connection is requested or
	// accepted, so that the peer's first SEND finds one (their SGEs are of regions of
	// PD). Without them, post receives before the peer sends. A QP on an SRQ has no
	// receive queue of its own: post to the SRQ instead.
	Recv []verbs.RecvWR
}

// Endpoint is a connection with the verbs objects made for it, as an rdma_cm_id made by
// rdma_create_ep is: an RC QP, the CQ both of its queues complete to, and its PD (the
// endpoint's own unless QPConfig.PD gave one). Conn's methods (QP, PrivateData, Done,
// Err, Disconnect, ...) are the connection's; Close disconnects and frees what the
// endpoint made. The low-level calls (Dial, Listener.Accept, Request.Accept with a QP of
// one's own) remain for programs that make their verbs objects themselves.
type Endpoint struct {
	*Conn
	pd    *verbs.PD
	ownPD bool
	cq    *verbs.CQ
	qp    *verbs.QP // Conn's, and before there is a Conn

	mu     sync.Mutex
	mrs    []*verbs.MR // registered with RegMR
	closed bool
}

// DialQP connects to the listener on remote's port at the device with remote's
// address, as Dial does, with a PD (unless cfg gives one), a CQ and an RC QP made for
// the connection from cfg (nil: defaults), as rdma_create_ep and rdma_connect do. On
// error nothing it made is left.
func DialQP(ctx context.Context, dev *verbs.Device, remote netip.AddrPort, cfg *QPConfig, p *DialParams) (*Endpoint, error) {
	if p == nil {
		p = &DialParams{}
	}
	ep, err := makeEndpoint(dev, cfg, p.Options, "DialQP")
	if err != nil {
		return nil, err
	}
	conn, err := Dial(ctx, dev, remote, ep.qp, p)
	if err != nil {
		ep.free()
		return nil, err
	}
	ep.Conn = conn
	return ep, nil
}

// AcceptQP takes the next connection request, as Accept does, and accepts it with a PD
// (unless cfg gives one), a CQ and an RC QP made for the connection from cfg (nil:
// defaults), as rdma_get_request and rdma_accept on an endpoint made by rdma_create_ep
// do. The request's private data is the endpoint's PrivateData. To look at a request
// before taking it, use Accept and then Request.AcceptQP or Reject.
func (l *Listener) AcceptQP(ctx context.Context, cfg *QPConfig, p *AcceptParams) (*Endpoint, error) {
	r, err := l.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return r.AcceptQP(cfg, p)
}

// AcceptQP accepts the request with a PD (unless cfg gives one), a CQ and an RC QP made
// for the connection from cfg (nil: defaults), as Accept does with a QP of one's own. If
// they cannot be made, the request is rejected (no resources) and the error returned;
// on error nothing it made is left.
func (r *Request) AcceptQP(cfg *QPConfig, p *AcceptParams) (*Endpoint, error) {
	if p == nil {
		p = &AcceptParams{}
	}
	ep, err := makeEndpoint(r.c.m.dev, cfg, p.Options, "AcceptQP")
	if err != nil {
		r.rejectNoResources()
		return nil, err
	}
	conn, err := r.Accept(ep.qp, p)
	if err != nil {
		ep.free()
		return nil, err
	}
	ep.Conn = conn
	return ep, nil
}

// rejectNoResources rejects a request still waiting for its answer with "no resources".
func (r *Request) rejectNoResources() {
	m := r.c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.c.state == stReqRcvd || r.c.state == stMRASent {
		r.c.reject(mad.RejNoResources, nil)
	}
}

// PD is the QP's protection domain.
func (ep *Endpoint) PD() *verbs.PD { return ep.pd }

// CQ is the completion queue of the QP's send and receive queues.
func (ep *Endpoint) CQ() *verbs.CQ { return ep.cq }

// RegMR registers buf in the endpoint's PD, as PD.RegMR does (rdma_reg_msgs,
// rdma_reg_read, rdma_reg_write); Close deregisters it.
func (ep *Endpoint) RegMR(buf []byte, access verbs.AccessFlags) (*verbs.MR, error) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closed {
		return nil, fmt.Errorf("cm: Endpoint.RegMR: %w", ErrClosed)
	}
	mr, err := ep.pd.RegMR(buf, access)
	if err != nil {
		return nil, err
	}
	ep.mrs = append(ep.mrs, mr)
	return mr, nil
}

// Close ends the connection and frees what the endpoint made, in order, as
// rdma_destroy_ep does: it disconnects (Disconnect), destroys the QP and the CQ,
// deregisters the regions registered with RegMR, and frees the endpoint's own PD. Its
// error says what could not be freed (its own PD, while regions registered on it
// otherwise remain); a peer that does not answer the disconnect is Disconnect's to report,
// not Close's. After the device was closed, Close has nothing left to free and returns
// nil. A second Close returns ErrClosed.
func (ep *Endpoint) Close() error {
	ep.mu.Lock()
	if ep.closed {
		ep.mu.Unlock()
		return fmt.Errorf("cm: Endpoint.Close: %w", ErrClosed)
	}
	ep.closed = true
	ep.mu.Unlock()
	_ = ep.Disconnect() // the connection ends whatever the peer answers
	return ep.free()
}

// makeEndpoint makes the PD (unless cfg gives one), CQ and RC QP of a connection of dev,
// the QP in INIT with the remote access o gives, and posts cfg's receives. op names the
// caller in errors. On error nothing it made is left.
func makeEndpoint(dev *verbs.Device, cfg *QPConfig, o verbs.ConnectOptions, op string) (*Endpoint, error) {
	if dev == nil {
		return nil, fmt.Errorf("cm: %s: nil device", op)
	}
	if cfg == nil {
		cfg = &QPConfig{}
	}
	ep := &Endpoint{pd: cfg.PD}
	if cfg.SRQ != nil {
		if ep.pd == nil {
			ep.pd = cfg.SRQ.PD()
		} else if ep.pd != cfg.SRQ.PD() {
			return nil, fmt.Errorf("cm: %s: the SRQ belongs to another PD than QPConfig.PD: %w", op, verbs.ErrInvalid)
		}
	}
	fail := func(err error) (*Endpoint, error) {
		if ep.qp != nil {
			_ = ep.qp.DestroyQP()
		}
		if ep.cq != nil {
			_ = ep.cq.DestroyCQ()
		}
		if ep.ownPD {
			_ = ep.pd.DeallocPD()
		}
		return nil, fmt.Errorf("cm: %s: %w", op, err)
	}
	if ep.pd == nil {
		pd, err := dev.AllocPD()
		if err != nil {
			return fail(err)
		}
		ep.pd, ep.ownPD = pd, true
	} else if ep.pd.Device() != dev {
		return nil, fmt.Errorf("cm: %s: the PD belongs to another device: %w", op, verbs.ErrInvalid)
	}
	c := cfg.Cap
	c.MaxSendWR = orDefaultInt(c.MaxSendWR, 64)
	c.MaxRecvWR = orDefaultInt(c.MaxRecvWR, 64)
	c.MaxSendSGE = orDefaultInt(c.MaxSendSGE, 1)
	c.MaxRecvSGE = orDefaultInt(c.MaxRecvSGE, 1)
	cqe := orDefaultInt(cfg.CQE, c.MaxSendWR+c.MaxRecvWR)
	var err error
	if ep.cq, err = dev.CreateCQ(cqe, nil, 0); err != nil {
		return fail(err)
	}
	if ep.qp, err = ep.pd.CreateQP(&verbs.QPInitAttr{SendCQ: ep.cq, RecvCQ: ep.cq, SRQ: cfg.SRQ, Cap: c, SQSigAll: cfg.SQSigAll}); err != nil {
		return fail(err)
	}
	// In INIT, as rdma_create_ep leaves a QP, with the remote access Dial or Accept
	// would give it from RESET, so that receives can be posted now.
	if err := InitQP(ep.qp, o.WithDefaults().Access); err != nil {
		return fail(err)
	}
	if len(cfg.Recv) > 0 {
		if err := ep.qp.PostRecv(cfg.Recv); err != nil {
			return fail(err)
		}
	}
	return ep, nil
}

func orDefaultInt(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

// free destroys what the endpoint made, the QP first (its CQ and PD are in use until it
// is gone). An object already freed, or a device already closed, is not an error.
func (ep *Endpoint) free() error {
	var errs []error
	keep := func(err error) {
		if err != nil && !errors.Is(err, verbs.ErrClosed) {
			errs = append(errs, err)
		}
	}
	keep(ep.qp.DestroyQP())
	keep(ep.cq.DestroyCQ())
	ep.mu.Lock()
	mrs := ep.mrs
	ep.mrs = nil
	ep.mu.Unlock()
	for _, mr := range mrs {
		keep(mr.DeregMR())
	}
	if ep.ownPD {
		if err := ep.pd.DeallocPD(); err != nil && !errors.Is(err, verbs.ErrClosed) {
			errs = append(errs, fmt.Errorf("cm: Endpoint.Close: the endpoint's PD keeps regions not registered with Endpoint.RegMR: %w", err))
		}
	}
	return errors.Join(errs...)
}
