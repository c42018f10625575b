package cm

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Disconnect ends the connection as rdma_disconnect does: the QP moves to ERR (its
// outstanding work requests complete with flush errors), a DisconnectRequest goes to the
// peer, which moves its QP to ERR and answers. Disconnect waits for the answer at most
// one keep-alive period (the connection's KeepAlive; DefaultKeepAlive, 1 s, if its
// keep-alive is off), so that a dead peer does not hold it up: it returns nil when the
// answer came, ErrPeerUnreachable or ErrPeerRestarted when the CM found the peer gone
// first (on Linux, a DisconnectRequest that its host answers with ICMP port unreachable:
// one round trip), ErrTimeout when the period ran out; ErrClosed after the device
// closed. Whatever
// it returns, the connection is ended on this side: Done is closed, and a
// DisconnectRequest not yet answered is resent in the background until the peer answers
// or the CM gives up on it. Calling it again, or after the peer disconnected, returns nil
// once the connection is ended (waiting, within the same bound, for a disconnect under
// way).
func (cn *Conn) Disconnect() error {
	return cn.disconnect(context.Background(), cn.c.waitBound())
}

// DisconnectContext is Disconnect with the wait for the peer's answer bounded by ctx
// instead of the keep-alive period: it returns when the answer came, the CM gave up on
// the peer (ErrPeerUnreachable, ErrPeerRestarted, ErrTimeout after the DisconnectRequest's
// retries), or ctx is done (its error, wrapped; at once if ctx is already done). The
// connection is ended on this side in every case, as with Disconnect.
func (cn *Conn) DisconnectContext(ctx context.Context) error {
	return cn.disconnect(ctx, 0)
}

// waitBound is how long Disconnect waits for the peer: one keep-alive period.
func (c *conn) waitBound() time.Duration {
	if c.keepAlive > 0 {
		return c.keepAlive
	}
	return DefaultKeepAlive
}

// disconnect ends the connection and waits for the peer's answer until ctx is done or,
// if bound is above zero, for at most bound.
func (cn *Conn) disconnect(ctx context.Context, bound time.Duration) error {
	c := cn.c
	m := c.m
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return &callError{op: "Disconnect", err: errDeviceClosed}
	}
	wait, first := c.discDone, c.state == stEstablished
	if first {
		c.toErr()
		c.state = stDreqSent
		c.retries = 0
		c.sendDREQ()
		c.arm(c.timeout)
		m.stats.Disconnected++
		c.end(ErrDisconnected)
		c.logEvent(slog.LevelInfo, evClosed, "disconnected by this side")
		wait = make(chan struct{})
		c.discDone = wait
	} else if wait == nil {
		m.mu.Unlock()
		return nil // ended already
	}
	m.mu.Unlock()
	var expired <-chan time.Time
	if bound > 0 {
		t := time.NewTimer(bound)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-wait:
	case <-expired:
		return fmt.Errorf("cm: Disconnect: the peer did not answer within %v (one keep-alive period); the connection is ended here: %w", bound, ErrTimeout)
	case <-ctx.Done():
		return fmt.Errorf("cm: Disconnect: %w", ctx.Err())
	}
	if !first {
		return nil
	}
	m.mu.Lock()
	err := c.discErr
	m.mu.Unlock()
	if err == ErrDisconnected {
		err = nil
	}
	return err
}
