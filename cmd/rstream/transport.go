package main

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/internal/streamtool"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// A transport is what a run's streams go over: rsockets on a softrnic device, or the
// kernel's TCP (-T s).
type transport interface {
	name() string
	listen(ctx context.Context) (listener, error)
	dial(ctx context.Context, tune streamtool.Tuning) (net.Conn, error)
	// describe adds what the transport knows of a connection to a test's result.
	describe(c net.Conn, r *Result)
}

// A listener takes a server's connections, one at a time.
type listener interface {
	accept(ctx context.Context) (net.Conn, error)
	addr() netip.AddrPort
	Close() error
}

// rsocketTransport is rsockets over a softrnic device.
type rsocketTransport struct {
	cfg *Config
	dev *verbs.Device
}

func (t *rsocketTransport) name() string { return "rsocket" }

// options are a connection's rsocket options: rings of twice -B, as rsockets take
// SO_RCVBUF and SO_SNDBUF; the inline size of the tuning (a send-side choice that the
// wire does not show: the least rsockets take for the bandwidth set, where rstream asks
// for none); and softrnic's options.
func (t *rsocketTransport) options(tune streamtool.Tuning) rsocket.Options {
	o := rsocket.Options{RecvBuffer: 2 * t.cfg.Buffer, SendBuffer: 2 * t.cfg.Buffer,
		Ordering: t.cfg.Ordering, BusyPoll: t.cfg.BusyPoll, NoDelay: t.cfg.NoDelay}
	switch tune {
	case streamtool.TuneLatency:
		o.InlineSize = max(t.cfg.Inline, 1)
	case streamtool.TuneBandwidth:
		o.InlineSize = 1 // raised to the least an rsocket takes
	}
	if t.cfg.KeepAlive > 0 {
		o.KeepAlive = time.Duration(t.cfg.KeepAlive) * time.Second
	}
	return o
}

// listen listens with the options of the run's first connection: an rsocket listener
// gives every connection its options, and those of the phases differ only in the
// inline size, which the wire does not show.
func (t *rsocketTransport) listen(ctx context.Context) (listener, error) {
	tune := streamtool.TuneLatency
	if t.cfg.Custom {
		tune = streamtool.TuneMixed
	}
	lc := rsocket.ListenConfig{Options: t.options(tune)}
	l, err := lc.Listen(t.dev, uint16(t.cfg.Port))
	if err != nil {
		return nil, err
	}
	return &rsocketListener{l: l}, nil
}

func (t *rsocketTransport) dial(ctx context.Context, tune streamtool.Tuning) (net.Conn, error) {
	d := rsocket.Dialer{Options: t.options(tune), DevicePort: uint16(t.cfg.PeerPort)}
	return d.Dial(ctx, t.dev, netip.AddrPortFrom(t.cfg.ServerAddr, uint16(t.cfg.Port)))
}

func (t *rsocketTransport) describe(c net.Conn, r *Result) {
	rc := c.(*rsocket.Conn)
	st := rc.Stats()
	r.Rsocket = &st
	r.Ordering = rc.Ordering().String()
	counters := cmtool.Read(t.dev)
	r.Counters = &counters
}

type rsocketListener struct{ l *rsocket.Listener }

func (l *rsocketListener) accept(ctx context.Context) (net.Conn, error) {
	stop := context.AfterFunc(ctx, func() { l.l.Close() })
	defer stop()
	c, err := l.l.AcceptRsocket()
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return c, err
}

func (l *rsocketListener) addr() netip.AddrPort { return l.l.Addr().(*rsocket.Addr).AddrPort }
func (l *rsocketListener) Close() error         { return l.l.Close() }

// tcpTransport is the kernel's TCP through Go's net package, as rstream's -T s uses the
// kernel's sockets: for comparison on the same host. Buffers are -B (SO_SNDBUF,
// SO_RCVBUF, set once connected); Nagle's algorithm is off, as rstream sets TCP_NODELAY
// (Go's default).
type tcpTransport struct {
	cfg *Config
}

func (t *tcpTransport) name() string { return "tcp" }

func (t *tcpTransport) keepAlive() time.Duration {
	if t.cfg.KeepAlive > 0 {
		return time.Duration(t.cfg.KeepAlive) * time.Second
	}
	return -1 // rstream sets no SO_KEEPALIVE without -k
}

func (t *tcpTransport) listen(ctx context.Context) (listener, error) {
	lc := net.ListenConfig{KeepAlive: t.keepAlive()}
	var host netip.Addr
	if t.cfg.Bind.IsValid() {
		host = t.cfg.Bind
	}
	addr := net.JoinHostPort("", strconv.Itoa(t.cfg.Port))
	if host.IsValid() {
		addr = netip.AddrPortFrom(host, uint16(t.cfg.Port)).String()
	}
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &tcpListener{l: l.(*net.TCPListener), t: t}, nil
}

func (t *tcpTransport) dial(ctx context.Context, _ streamtool.Tuning) (net.Conn, error) {
	d := net.Dialer{KeepAlive: t.keepAlive()}
	if t.cfg.Bind.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: t.cfg.Bind.AsSlice()}
	}
	c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(t.cfg.ServerAddr, uint16(t.cfg.Port)).String())
	if err != nil {
		return nil, err
	}
	t.tune(c.(*net.TCPConn))
	return c, nil
}

// tune sets a connection's buffers as rstream's -B does.
func (t *tcpTransport) tune(c *net.TCPConn) {
	_ = c.SetReadBuffer(t.cfg.Buffer)
	_ = c.SetWriteBuffer(t.cfg.Buffer)
	_ = c.SetNoDelay(true)
}

func (t *tcpTransport) describe(net.Conn, *Result) {}

type tcpListener struct {
	l *net.TCPListener
	t *tcpTransport
}

func (l *tcpListener) accept(ctx context.Context) (net.Conn, error) {
	stop := context.AfterFunc(ctx, func() { l.l.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c, err := l.l.AcceptTCP()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	l.t.tune(c)
	return c, nil
}

func (l *tcpListener) addr() netip.AddrPort {
	a := l.l.Addr().(*net.TCPAddr).AddrPort()
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

func (l *tcpListener) Close() error { return l.l.Close() }
