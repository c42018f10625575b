package rsocket

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// ListenConfig listens with options (rlisten with the socket options set before it);
// every accepted connection takes them. The zero value listens with the defaults.
type ListenConfig struct {
	Options
}

// Listener takes rsocket connections on one service port of a device: a net.Listener.
// Connections are set up in the background, as a TCP stack completes handshakes
// before accept, at most Backlog of them waiting to be accepted.
type Listener struct {
	l      *cm.Listener
	dev    *verbs.Device
	o      Options
	addr   Addr
	ctx    context.Context
	cancel context.CancelFunc
	ready  chan *Conn
	wg     sync.WaitGroup
	errMu  sync.Mutex
	errs   uint64 // requests refused or failed before they were accepted
}

// Backlog is how many established connections wait for Accept, and how many
// handshakes a listener runs at once.
const Backlog = 128

// Listen listens for rsocket connections on port of dev with the default options.
func Listen(dev *verbs.Device, port uint16) (*Listener, error) {
	var lc ListenConfig
	return lc.Listen(dev, port)
}

// Listen listens for rsocket connections on port of dev (rdma_cm's TCP port space, as
// rsockets use: rstream's default is 7471).
func (lc *ListenConfig) Listen(dev *verbs.Device, port uint16) (*Listener, error) {
	opErr := func(err error) error {
		var a net.Addr
		if dev != nil {
			a = &Addr{AddrPort: netip.AddrPortFrom(dev.Addr().Addr(), port)}
		}
		return &net.OpError{Op: "listen", Net: "rsocket", Addr: a, Err: err}
	}
	o, err := lc.Options.withDefaults()
	if err != nil {
		return nil, opErr(err)
	}
	cl, err := cm.Listen(dev, port)
	if err != nil {
		return nil, opErr(err)
	}
	l := &Listener{l: cl, dev: dev, o: o, addr: Addr{AddrPort: cl.Addr()}, ready: make(chan *Conn, Backlog)}
	l.addr.AddrPort = netip.AddrPortFrom(cl.Addr().Addr(), port)
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.serve()
	return l, nil
}

// serve answers connection requests until the listener closes, each in a goroutine of
// its own, at most Backlog at once.
func (l *Listener) serve() {
	defer l.wg.Done()
	slots := make(chan struct{}, Backlog)
	for {
		req, err := l.l.Accept(l.ctx)
		if err != nil {
			return
		}
		select {
		case slots <- struct{}{}:
		case <-l.ctx.Done():
			req.Reject(nil)
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-slots }()
			c, err := l.handshake(req)
			if err != nil {
				l.errMu.Lock()
				l.errs++
				l.errMu.Unlock()
				return
			}
			select {
			case l.ready <- c:
			case <-l.ctx.Done():
				c.Close()
			}
		}()
	}
}

// handshake checks a request's connect data and accepts it with a new connection's
// resources, or rejects it, as librdmacm's rs_accept does.
func (l *Listener) handshake(req *cm.Request) (*Conn, error) {
	pd, err := parseConnData(req.PrivateData)
	if err != nil {
		req.Reject(nil)
		return nil, err
	}
	c, err := newConn(l.dev, l.o)
	if err != nil {
		req.Reject(nil)
		return nil, err
	}
	co := connectOptions(l.o)
	if l.o.ACKTimeout > 0 {
		co.Timeout = ackCode(l.o.ACKTimeout) // else the requester's, as Linux takes it
	}
	cn, err := req.Accept(c.qp, &cm.AcceptParams{PrivateData: c.connData(), KeepAlive: l.o.KeepAlive,
		Options: co})
	if err != nil {
		c.abort()
		return nil, err
	}
	c.local, c.remote = l.addr, Addr{AddrPort: req.Remote}
	c.start(cn, pd)
	return c, nil
}

// Accept returns the next connection.
func (l *Listener) Accept() (net.Conn, error) { return l.AcceptRsocket() }

// AcceptRsocket returns the next connection as a *Conn.
func (l *Listener) AcceptRsocket() (*Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.ctx.Done():
		return nil, &net.OpError{Op: "accept", Net: "rsocket", Addr: &l.addr, Err: net.ErrClosed}
	}
}

// Close stops listening: blocked Accepts return an error wrapping net.ErrClosed, and
// connections not yet accepted are closed.
func (l *Listener) Close() error {
	if l.ctx.Err() != nil {
		return &net.OpError{Op: "close", Net: "rsocket", Addr: &l.addr, Err: net.ErrClosed}
	}
	l.cancel()
	err := l.l.Close()
	l.wg.Wait()
	for {
		select {
		case c := <-l.ready:
			c.Close()
		default:
			if err != nil && !errors.Is(err, cm.ErrClosed) {
				return &net.OpError{Op: "close", Net: "rsocket", Addr: &l.addr, Err: err}
			}
			return nil
		}
	}
}

// Addr is the listener's address: the device's IP address and the service port.
func (l *Listener) Addr() net.Addr { return &l.addr }

var _ net.Listener = (*Listener)(nil)
