package rsocket

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// A Dialer connects to rsocket listeners with its options (rconnect with the socket
// options set before it). The zero value dials with the defaults.
type Dialer struct {
	Options
	// DevicePort is the peer device's UDP port (0: 4791, the RoCEv2 port, where a
	// Linux peer listens).
	DevicePort uint16
}

// Dial connects to the rsocket listener at addr (the peer device's IP address and the
// service port it listens on) through dev, with the default options.
func Dial(ctx context.Context, dev *verbs.Device, addr netip.AddrPort) (*Conn, error) {
	var d Dialer
	return d.Dial(ctx, dev, addr)
}

// Dial connects to the rsocket listener at addr through dev: an RC connection made by
// the connection manager, whose private data carries each side's receive ring and
// credits. It returns once the connection is established, or when ctx ends.
func (d *Dialer) Dial(ctx context.Context, dev *verbs.Device, addr netip.AddrPort) (_ *Conn, err error) {
	raddr := Addr{AddrPort: addr}
	opErr := func(err error) error {
		var src net.Addr
		if dev != nil {
			src = &Addr{AddrPort: dev.Addr()}
		}
		return &net.OpError{Op: "dial", Net: "rsocket", Source: src, Addr: &raddr, Err: err}
	}
	o, err := d.Options.withDefaults()
	if err != nil {
		return nil, opErr(fmt.Errorf("rsocket: %w", err))
	}
	c, err := newConn(dev, o)
	if err != nil {
		return nil, opErr(err)
	}
	co := connectOptions(o)
	co.Timeout = ackTimeout
	if o.ACKTimeout > 0 {
		co.Timeout = ackCode(o.ACKTimeout)
	}
	cn, err := cm.Dial(ctx, dev, addr, c.qp, &cm.DialParams{PrivateData: c.connData(), DevicePort: d.DevicePort,
		KeepAlive: o.KeepAlive, Options: co})
	if err != nil {
		c.abort()
		return nil, opErr(err)
	}
	pd, err := parseConnData(cn.PrivateData())
	if err != nil {
		cn.Disconnect()
		c.abort()
		return nil, opErr(err)
	}
	c.local, c.remote = Addr{AddrPort: dev.Addr()}, raddr
	c.start(cn, pd)
	return c, nil
}

// ackTimeout is the local ACK timeout a dialled connection asks for (4.096 µs × 2^19,
// 2.1 s), what a C program's rconnect gets from Linux's rdma_cm on RoCE. The listener's
// side takes it from the request, as Linux's does, so it sets both sides' retransmission
// timer. With verbs' default (67 ms) a standard peer that answers slowly, rxe under load
// say, makes both sides retransmit early and a pause of half a second exhausts the seven
// retries, ending the connection.
const ackTimeout = 19

// ackCode is the local ACK timeout code (4.096 µs × 2^code) of the shortest timeout at
// least d long.
func ackCode(d time.Duration) uint8 {
	code := uint8(1)
	for code < 31 && 4096*time.Nanosecond<<code < d {
		code++
	}
	return code
}

// connectOptions are the QP attributes rsockets ask for: seven transport retries and
// RNR retries for ever (a receive is reposted the moment its completion is seen).
func connectOptions(o Options) verbs.ConnectOptions {
	return verbs.ConnectOptions{RetryCnt: 7, RNRRetry: 7, Ordering: o.Ordering, Access: verbs.AccessRemoteWrite}
}
