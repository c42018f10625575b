package perf

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/softrnic/softrnic/cm"
)

// With Config.CM the queue pairs are connected through the connection manager (package
// cm), as perftest's -R connects them through rdma_cm: the server side listens on a
// service port of its device and accepts one request per QP, the client side dials one
// per QP. QP numbers, PSNs, the path MTU and the ordering mode are what the CM
// negotiates; only buffers, rkeys and the test's course go over the control connection.

// cmSetupTimeout bounds the whole handshake of a run (every QP's Dial or Accept).
const cmSetupTimeout = 30 * time.Second

// cmAwaitDisconnect is how long the accepting side waits for the dialing side's
// DisconnectRequests after a run before it disconnects by itself.
const cmAwaitDisconnect = 5 * time.Second

// cmMagic starts a ConnectRequest's private data, followed by the QP's index (uint32,
// big-endian): client QP i is connected to server QP i, whatever order requests come in.
var cmMagic = []byte("rperf")

func cmPrivateData(i int) []byte {
	return binary.BigEndian.AppendUint32(bytes.Clone(cmMagic), uint32(i))
}

// cmIndex returns the QP index a ConnectRequest's private data names.
func cmIndex(data []byte) (int, bool) {
	if len(data) < len(cmMagic)+4 || !bytes.Equal(data[:len(cmMagic)], cmMagic) {
		return 0, false
	}
	return int(binary.BigEndian.Uint32(data[len(cmMagic):])), true
}

// initQPs moves every QP to INIT with the remote access the hand exchange gives, so that
// prepare can post receives before the handshake (the first SEND never meets an empty
// receive queue).
func (s *side) initQPs() error {
	access := s.connectOptions().WithDefaults().Access
	for _, qp := range s.qps {
		if err := cm.InitQP(qp, access); err != nil {
			return fmt.Errorf("cm: QP %#x to INIT: %w", qp.QPNum(), err)
		}
	}
	return nil
}

// acceptAll accepts one request per QP from l, QP i for the request that names index i.
func (s *side) acceptAll(ctx context.Context, l *cm.Listener) error {
	s.conns = make([]*cm.Conn, len(s.qps))
	for n := 0; n < len(s.qps); {
		req, err := l.Accept(ctx)
		if err != nil {
			return fmt.Errorf("cm: accepting QP %d of %d: %w", n+1, len(s.qps), err)
		}
		i, ok := cmIndex(req.PrivateData)
		if !ok || i < 0 || i >= len(s.qps) || s.conns[i] != nil {
			_ = req.Reject([]byte("rperf: unexpected connection request"))
			if !ok {
				continue // not an rperf client: wait for ours
			}
			return fmt.Errorf("cm: request from %v for QP index %d (this side has %d QPs)", req.Remote, i, len(s.qps))
		}
		c, err := req.Accept(s.qps[i], &cm.AcceptParams{Options: s.connectOptions()})
		if err != nil {
			return fmt.Errorf("cm: accepting QP %d: %w", i, err)
		}
		s.conns[i] = c
		n++
	}
	return nil
}

// dialAll connects every QP to the listener at remote (the peer device's address and the
// service port), whose device's UDP port is devPort.
func (s *side) dialAll(ctx context.Context, remote netip.AddrPort, devPort uint16) error {
	s.conns = make([]*cm.Conn, len(s.qps))
	for i, qp := range s.qps {
		c, err := cm.Dial(ctx, s.ctx, remote, qp, &cm.DialParams{
			DevicePort: devPort, PrivateData: cmPrivateData(i), Options: s.connectOptions()})
		if err != nil {
			return fmt.Errorf("cm: dialing %v (device port %d) for QP %d: %w", remote, devPort, i, err)
		}
		s.conns[i] = c
	}
	return nil
}

// connectCM connects the QPs of two sides in this process: ss listens and accepts, cs
// dials. Both sides' receives must already be posted.
func connectCM(cs, ss *side) error {
	ctx, cancel := context.WithTimeout(context.Background(), cmSetupTimeout)
	defer cancel()
	l, err := cm.Listen(ss.ctx, DefaultControlPort)
	if err != nil {
		return err
	}
	defer l.Close()
	acc := make(chan error, 1)
	go func() { acc <- ss.acceptAll(ctx, l) }()
	devAddr := ss.ctx.Addr()
	derr := cs.dialAll(ctx, netip.AddrPortFrom(devAddr.Addr(), DefaultControlPort), devAddr.Port())
	if derr != nil {
		cancel() // the listener's side stops waiting
	}
	return errors.Join(derr, <-acc)
}

// disconnect disconnects every connection of the side (all at once, so that peers that
// do not answer cost one CM timeout, not one per QP) and forgets them.
func (s *side) disconnect() error {
	errs := make([]error, len(s.conns))
	var wg sync.WaitGroup
	for i, c := range s.conns {
		if c == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Disconnect(); err != nil {
				errs[i] = fmt.Errorf("cm: disconnecting QP %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	s.conns = nil
	return errors.Join(errs...)
}

// awaitDisconnect waits until the peer has disconnected every connection, at most d.
func (s *side) awaitDisconnect(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, c := range s.conns {
		if c == nil {
			continue
		}
		select {
		case <-c.Done():
		case <-t.C:
			return
		}
	}
}
