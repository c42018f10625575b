package perf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/verbs"
)

// perftest's -R (perftest_communication.c: create_comm_struct, establish_connection,
// rdma_client_connect, rdma_server_connect, ctx_xchg_data_rdma, rdma_write_keys,
// rdma_read_keys; perftest_resources.c: create_rdma_cm_connection), as perftest 4.5
// does it, which is also what rperf's perftest mode does with Config.CM (rperf -R):
//
//   - No TCP at all. The exchange itself goes over RDMA: the client connects one RC QP
//     (the "comm" QP) through rdma_cm to the server's port (18515) in rdma_cm's TCP port
//     space (service ID 0x01060000 | 18515), with no private data, responder resources
//     and initiator depth 0, retry count 7 and RNR retry count 7. Each side posts one
//     receive of sizeof(struct pingpong_dest) (56 bytes) before rdma_connect /
//     rdma_accept; the server's listener is destroyed once it accepted.
//   - Each message of the exchange is one signaled SEND of exactly the bytes TCP would
//     carry (version 16, page size 4, cache line 4, MTU 2, reports 8 each), the client
//     sending first and each side reposting its one receive before it sends, except the
//     handshake: over RDMA it is struct pingpong_dest itself (56 bytes: lid, out_reads,
//     qpn, psn, rkey as big-endian 32-bit ints, 4 bytes of padding, vaddr big-endian 64
//     bits, the 16 GID bytes, srqn and gid_index big-endian; perftest reads back lid to
//     the GID only), not the 108-character text. ctx_close_connection is then the last
//     handshake alone: no "done".
//   - The test's own QPs are connected through rdma_cm too, after the version, page
//     size, cache line and MTU steps: a handshake (both sides' destinations still
//     zeros), then the server listens on the same port again (the comm listener is gone
//     by then) and the client connects one rdma_cm id per QP (its rdma_connect: no
//     private data, responder resources = initiator depth = the outstanding reads in the
//     READ and atomic tests and 0 otherwise, retry count 7, RNR retry count 7; the
//     client tries again up to 10 times, 100 ms apart, when the connection fails, e.g.
//     rejected because the server does not listen yet); the server accepts the requests
//     in the order they come (QP i of the server is the i-th request's) and sets the
//     QPs' RNR timer to 12; then another handshake of zeros. Then each test's usual
//     handshakes follow (perftest skips ctx_connect: the PSNs, MTU and QP numbers are
//     rdma_cm's; the MTU step's result goes unused), with the real destinations (for
//     their rkeys and addresses).
//   - At the end the client disconnects its data connections (rdma_disconnect, waiting
//     for each DISCONNECTED event: the server must answer the DisconnectRequests) and
//     the server destroys its ids; the comm connection is never disconnected by hand
//     (it goes when the process exits).

// ptDestBinLen is sizeof(struct pingpong_dest) on Linux x86-64 and arm64.
const ptDestBinLen = 56

// marshalBinary is rdma_write_keys' message: the destination as perftest's struct, its
// integers big-endian (perftest's HAVE_ENDIAN build, every Linux one), padding zero.
func (d ptDest) marshalBinary() []byte {
	b := make([]byte, ptDestBinLen)
	be := binary.BigEndian
	be.PutUint32(b[0:], uint32(d.LID))
	be.PutUint32(b[4:], uint32(d.OutReads))
	be.PutUint32(b[8:], d.QPN)
	be.PutUint32(b[12:], d.PSN)
	be.PutUint32(b[16:], d.RKey)
	be.PutUint64(b[24:], d.VAddr)
	copy(b[32:48], d.GID[:])
	be.PutUint32(b[48:], d.SRQN)
	// b[52:56]: gid_index, which no peer reads; 0.
	return b
}

// parsePtDestBinary reads rdma_read_keys' message: lid, out_reads, qpn, psn, rkey,
// vaddr, gid (and srqn, which perftest does not read).
func parsePtDestBinary(b []byte) (ptDest, error) {
	if len(b) != ptDestBinLen {
		return ptDest{}, fmt.Errorf("perftest handshake over rdma_cm: %d bytes, want %d", len(b), ptDestBinLen)
	}
	be := binary.BigEndian
	d := ptDest{LID: uint16(be.Uint32(b[0:])), OutReads: uint16(be.Uint32(b[4:])), QPN: be.Uint32(b[8:]) & 0xFFFFFF,
		PSN: be.Uint32(b[12:]) & 0xFFFFFF, RKey: be.Uint32(b[16:]), VAddr: be.Uint64(b[24:]), SRQN: be.Uint32(b[48:])}
	copy(d.GID[:], b[32:48])
	return d, nil
}

// ptCommMsg is the room each of the comm QP's buffers has: the largest message is the
// 56-byte handshake.
const ptCommMsg = 64

// ptCommRecvs is how many receives the comm QP keeps posted (perftest keeps one: the
// lockstep never has two messages in flight toward a side).
const ptCommRecvs = 2

// ptComm is the exchange's QP with -R: an RC QP connected through rdma_cm, each message
// one SEND. It sleeps on a completion channel while it waits (the peer may take the
// whole test to send the next message).
type ptComm struct {
	pd   *verbs.PD
	ch   *verbs.CompChannel
	cq   *verbs.CQ
	qp   *verbs.QP
	mr   *verbs.MR
	buf  []byte // [send][receive 0][receive 1]
	conn *cm.Conn
	// deadline bounds each wait for a message (zero: none).
	deadline time.Time
	recvd    [][]byte // messages received and not read yet
	sent     int      // send completions not waited for yet
	failed   error    // the first failed completion
	armed    bool
	wc       [4]verbs.WorkCompletion
}

// newPtComm creates the comm QP on dev with its receives posted, in INIT, ready for
// Dial or Accept.
func newPtComm(dev *verbs.Device) (*ptComm, error) {
	c := &ptComm{buf: make([]byte, (1+ptCommRecvs)*ptCommMsg)}
	err := func() error {
		var err error
		if c.pd, err = dev.AllocPD(); err != nil {
			return err
		}
		if c.ch, err = dev.CreateCompChannel(); err != nil {
			return err
		}
		if c.cq, err = dev.CreateCQ(16, c.ch, 0); err != nil {
			return err
		}
		if c.qp, err = c.pd.CreateQP(&verbs.QPInitAttr{SendCQ: c.cq, RecvCQ: c.cq, Cap: verbs.QPCap{
			MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: ptCommMsg}}); err != nil {
			return err
		}
		if c.mr, err = c.pd.RegMR(c.buf, verbs.AccessLocalWrite); err != nil {
			return err
		}
		if err := cm.InitQP(c.qp, 0); err != nil {
			return err
		}
		for i := range ptCommRecvs {
			if err := c.postRecv(i); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		c.close()
		return nil, fmt.Errorf("perftest -R: the exchange's QP: %w", err)
	}
	return c, nil
}

// ptCommOptions are the comm QP's connection attributes: perftest's conn_param for it
// (no READ or atomic either way, 7 retries, 7 RNR retries) and its ACK timeout.
func ptCommOptions(c *Config) verbs.ConnectOptions {
	return verbs.ConnectOptions{NoRemoteAccess: true, Timeout: c.Timeout, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12,
		Ordering: verbs.OrderingOrdered, Zero: verbs.ZeroMaxRdAtomic}
}

func (c *ptComm) postRecv(i int) error {
	wr := [1]verbs.RecvWR{{WRID: uint64(1 + i), SGList: []verbs.SGE{c.mr.SGE((1+i)*ptCommMsg, ptCommMsg)}}}
	return c.qp.PostRecv(wr[:])
}

// poll takes the completions there are: receives become messages (and are posted
// again), sends are counted. A failed one (the QP went to ERR: the peer disconnected,
// or retries ran out) is kept in c.failed, for a wait that the successful ones before it
// did not satisfy.
func (c *ptComm) poll() int {
	n := c.cq.PollCQ(c.wc[:])
	for _, wc := range c.wc[:n] {
		if c.failed != nil {
			break
		}
		switch {
		case wc.Status != verbs.WCSuccess:
			c.failed = fmt.Errorf("work completion %v (opcode %v, %v): the connection is gone", wc.Status, wc.Opcode, wc.VendorErr)
		case wc.WRID == 0 && wc.Opcode == verbs.WCSend:
			c.sent++
		case wc.WRID >= 1 && wc.WRID <= ptCommRecvs && wc.Opcode == verbs.WCRecv:
			i := int(wc.WRID - 1)
			off := (1 + i) * ptCommMsg
			c.recvd = append(c.recvd, slices.Clone(c.buf[off:off+int(wc.ByteLen)]))
			if err := c.postRecv(i); err != nil {
				c.failed = err
			}
		default:
			c.failed = fmt.Errorf("unexpected completion %+v", wc)
		}
	}
	return n
}

// wait polls until done says so, sleeping on the completion channel in between.
func (c *ptComm) wait(what string, done func() bool) error {
	for !done() {
		if c.failed != nil {
			return fmt.Errorf("perftest exchange over rdma_cm: %s: %w", what, c.failed)
		}
		if c.poll() > 0 {
			continue
		}
		if !c.armed {
			if err := c.cq.ReqNotifyCQ(false); err != nil {
				return err
			}
			c.armed = true
			continue // a completion may have come before the arm
		}
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if !c.deadline.IsZero() {
			ctx, cancel = context.WithDeadline(ctx, c.deadline)
		}
		_, err := c.ch.GetCQEvent(ctx)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("perftest exchange over rdma_cm: %s: nothing from the peer", what)
			}
			return fmt.Errorf("perftest exchange over rdma_cm: %s: %w", what, err)
		}
		c.cq.AckCQEvents(1)
		c.armed = false
	}
	return nil
}

// send is rdma_write_data: one signaled SEND of b, waited for.
func (c *ptComm) send(b []byte) error {
	if len(b) > ptCommMsg {
		return fmt.Errorf("perftest exchange over rdma_cm: a %d-byte message", len(b))
	}
	copy(c.buf, b)
	wr := [1]verbs.SendWR{{WRID: 0, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, SGList: []verbs.SGE{c.mr.SGE(0, len(b))}}}
	if err := c.qp.PostSend(wr[:]); err != nil {
		return fmt.Errorf("perftest exchange over rdma_cm: %w", err)
	}
	if err := c.wait("sending", func() bool { return c.sent > 0 }); err != nil {
		if c.peerDisconnected() {
			// The peer disconnects once it has the exchange's last message, and its
			// DisconnectRequest may overtake its ACK (they leave from different sockets
			// when its device has several queues): the SEND was delivered. A peer that
			// left before the end fails the next receive.
			return nil
		}
		return err
	}
	c.sent--
	return nil
}

// recv is rdma_read_data: the peer's next message, which must be n bytes.
func (c *ptComm) recv(n int) ([]byte, error) {
	if err := c.wait("waiting for the peer's message", func() bool { return len(c.recvd) > 0 }); err != nil {
		return nil, err
	}
	b := c.recvd[0]
	c.recvd = c.recvd[1:]
	if len(b) != n {
		return nil, fmt.Errorf("perftest exchange over rdma_cm: a %d-byte message where %d were due (%q)", len(b), n, b)
	}
	return b, nil
}

// peerDisconnected reports whether the peer ended the exchange's connection (its
// DisconnectRequest came).
func (c *ptComm) peerDisconnected() bool {
	return c.conn != nil && errors.Is(c.conn.Err(), cm.ErrDisconnected)
}

func (c *ptComm) close() {
	if c.qp != nil {
		c.qp.DestroyQP()
	}
	if c.mr != nil {
		c.mr.DeregMR()
	}
	if c.cq != nil {
		c.cq.DestroyCQ()
	}
	if c.ch != nil {
		c.ch.DestroyCompChannel()
	}
	if c.pd != nil {
		c.pd.DeallocPD()
	}
}

// ptCM connects a session's QPs through the connection manager (-R) and ends the
// connections after it.
type ptCM struct {
	// connect connects every QP of s (in INIT, receives posted as the test wants).
	connect func(s *ptSide) error
	// client: this side disconnects at the end; the server waits for the client to.
	client bool
}

// ptDialTries and ptDialPause are how the client retries its data connections when the
// server does not listen yet (it listens for them only after the handshake that precedes
// them): perftest's rdma_cm_client_connection tries 10 times, 100 ms apart, each time
// after destroying and resolving its ids again, which takes time of its own; rperf
// tries for 2 s.
const (
	ptDialTries = 20
	ptDialPause = 100 * time.Millisecond
)

// cmOptions are a data QP's connection attributes with -R: perftest's conn_param (READ
// and atomic depth: the outstanding reads in those tests, none otherwise; 7 retries; 7
// RNR retries; RNR timer 12), --mtu as this side's offer or limit, ordered mode.
func (s *ptSide) cmOptions() verbs.ConnectOptions {
	c := s.cfg
	o := verbs.ConnectOptions{Access: s.access(), Timeout: c.Timeout, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12,
		Ordering: verbs.OrderingOrdered}
	if c.MTU != 0 {
		o.MTU, _ = verbs.MTUFromBytes(c.MTU)
	}
	if readOrAtomic(c.Test) {
		o.MaxRdAtomic = uint8(min(s.my[0].OutReads, 255))
	} else {
		o.Zero |= verbs.ZeroMaxRdAtomic
	}
	return o
}

// dialAll connects QP i to the i-th connection the server at remote accepts, retrying
// as perftest's client does when the server does not listen yet.
func (s *ptSide) dialAll(ctx context.Context, remote netip.AddrPort) error {
	s.conns = make([]*cm.Conn, len(s.qps))
	for q, qp := range s.qps {
		for try := 1; ; try++ {
			cn, err := cm.Dial(ctx, s.ctx, remote, qp, &cm.DialParams{DevicePort: uint16(s.cfg.RoCEPort), Options: s.cmOptions()})
			if err == nil {
				s.conns[q] = cn
				break
			}
			if try == ptDialTries || !errors.Is(err, cm.ErrNoListener) {
				return fmt.Errorf("rdma_cm: connecting QP %d to %v: %w", q, remote, err)
			}
			select {
			case <-time.After(ptDialPause):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// acceptAll accepts one request per QP from l, in the order they come from the client
// at peer, as perftest's server does (requests from elsewhere are turned away: one
// client at a time).
func (s *ptSide) acceptAll(ctx context.Context, l *cm.Listener, peer netip.Addr) error {
	s.conns = make([]*cm.Conn, len(s.qps))
	for q := 0; q < len(s.qps); {
		qp := s.qps[q]
		req, err := l.Accept(ctx)
		if err != nil {
			return fmt.Errorf("rdma_cm: waiting for the client's connection for QP %d of %d: %w", q+1, len(s.qps), err)
		}
		if req.Remote.Addr() != peer {
			_ = req.Reject([]byte("rperf: busy with another client"))
			continue
		}
		cn, err := req.Accept(qp, &cm.AcceptParams{Options: s.cmOptions()})
		if err != nil {
			return fmt.Errorf("rdma_cm: accepting %v's connection for QP %d: %w", req.Remote, q, err)
		}
		s.conns[q] = cn
		q++
	}
	return nil
}

// cmInit moves the QPs to INIT with the access the test needs, as rdma_create_qp leaves
// them, for the connection manager to take from there.
func (s *ptSide) cmInit() error {
	for _, qp := range s.qps {
		if err := cm.InitQP(qp, s.access()); err != nil {
			return fmt.Errorf("QP %#x to INIT: %w", qp.QPNum(), err)
		}
	}
	return nil
}

// cmConnected records what the connection manager settled: each QP's send PSN goes in
// its destination (perftest sends a random one, unused with -R), the path MTU in the
// session's parameters.
func (s *ptSide) cmConnected() {
	for q, qp := range s.qps {
		a, _ := qp.QueryQP()
		s.my[q].PSN = a.SQPSN
		if q == 0 {
			s.params.MTU = a.PathMTU
		}
	}
}

// Ends of -R connections: how long the server waits for the client's
// DisconnectRequests (data QPs, then the comm QP, which perftest leaves to its process's
// exit), and how long either side waits for the answers to its own.
const (
	ptAwaitData = 5 * time.Second
	ptAwaitComm = 2 * time.Second
	ptDiscWait  = 5 * time.Second
)

// disconnectWithin disconnects conns at once and waits for the answers, at most d (the
// rest go on in the background and end with the device at the latest). It returns the
// errors of those that ended.
func disconnectWithin(conns []*cm.Conn, d time.Duration) error {
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, cn := range conns {
		if cn == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cn.Disconnect(); err != nil {
				mu.Lock()
				errs[i] = fmt.Errorf("rdma_cm: disconnecting QP %d: %w", i, err)
				mu.Unlock()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(errs...)
}

// awaitPeer waits until the peer has ended every connection of conns, at most d.
func awaitPeer(conns []*cm.Conn, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, cn := range conns {
		if cn == nil {
			continue
		}
		select {
		case <-cn.Done():
		case <-t.C:
			return
		}
	}
}

// endCM ends a side's data connections: the client disconnects them, the server waits
// for the client to (at once after a failed run) and disconnects what is left.
func (s *ptSide) endCM(client, failed bool) error {
	if len(s.conns) == 0 {
		return nil
	}
	conns := s.conns
	s.conns = nil
	if client {
		return disconnectWithin(conns, ptDiscWait)
	}
	if !failed {
		awaitPeer(conns, ptAwaitData)
	}
	_ = disconnectWithin(conns, ptDiscWait)
	return nil
}

// perftestDialCM is perftest's -R client on dev: it connects the exchange's QP to the
// server at remote (its address and rdma_cm port; its device on c.RoCEPort) and runs the
// session over it, connecting the test's QPs through rdma_cm as well. traffic, if set,
// replaces the traffic (the exchange tests).
func perftestDialCM(c *Config, dev *verbs.Device, remote netip.AddrPort, stats bool, traffic func(int) (Result, error)) ([]Result, error) {
	base := dev.Counters()
	comm, err := newPtComm(dev)
	if err != nil {
		return nil, err
	}
	defer comm.close()
	ctx, cancel := context.WithTimeout(context.Background(), ptSetupTimeout)
	defer cancel()
	conn, err := cm.Dial(ctx, dev, remote, comm.qp, &cm.DialParams{DevicePort: uint16(c.RoCEPort), Options: ptCommOptions(c)})
	if err != nil {
		return nil, fmt.Errorf("%s (perftest mode, -R client): rdma_cm: connecting to %v (device port %d): %w", c.Test, remote, c.RoCEPort, err)
	}
	comm.conn = conn
	t := &ptSession{cfg: c, pc: &ptConn{rc: comm, client: true}, stats: stats, base: base, ownMTU: ptOwnMTU(c, dev.Addr().Addr()),
		cm: &ptCM{client: true, connect: func(s *ptSide) error { return s.dialAll(ctx, remote) }}}
	t.open = func(p ptParams) (*ptSide, error) { return newPtSide(c, true, dev, netip.Addr{}, p) }
	t.traffic = traffic
	rs, err := t.run()
	// perftest's client leaves the comm connection to its exit; this one ends it.
	derr := disconnectWithin([]*cm.Conn{conn}, ptDiscWait)
	if err != nil {
		return rs, fmt.Errorf("%s (perftest mode, -R client): %w", c.Test, err)
	}
	if derr != nil {
		return rs, fmt.Errorf("%s (perftest mode, -R client): the exchange's connection: %w", c.Test, derr)
	}
	return rs, nil
}

// perftestAcceptCM is perftest's -R server on dev for req, the request for the
// exchange's QP that came to l: it accepts it, runs the session over it and takes the
// test's QPs' requests from l. traffic, if set, replaces the traffic.
func perftestAcceptCM(c *Config, dev *verbs.Device, l *cm.Listener, req *cm.Request, stats bool, traffic func(int) (Result, error)) ([]Result, error) {
	base := dev.Counters()
	comm, err := newPtComm(dev)
	if err != nil {
		_ = req.Reject(nil)
		return nil, err
	}
	defer comm.close()
	conn, err := req.Accept(comm.qp, &cm.AcceptParams{Options: ptCommOptions(c)})
	if err != nil {
		return nil, fmt.Errorf("%s (perftest mode, -R server): rdma_cm: accepting %v: %w", c.Test, req.Remote, err)
	}
	comm.conn = conn
	ctx, cancel := context.WithTimeout(context.Background(), ptSetupTimeout)
	defer cancel()
	t := &ptSession{cfg: c, pc: &ptConn{rc: comm}, stats: stats, base: base, ownMTU: ptOwnMTU(c, dev.Addr().Addr()),
		cm: &ptCM{connect: func(s *ptSide) error { return s.acceptAll(ctx, l, req.Remote.Addr()) }}}
	t.open = func(p ptParams) (*ptSide, error) { return newPtSide(c, false, dev, netip.Addr{}, p) }
	t.traffic = traffic
	rs, err := t.run()
	if err == nil {
		awaitPeer([]*cm.Conn{conn}, ptAwaitComm)
	}
	_ = disconnectWithin([]*cm.Conn{conn}, ptDiscWait)
	if err != nil {
		return rs, fmt.Errorf("%s (perftest mode, -R server): %w", c.Test, err)
	}
	return rs, nil
}

// localAddrFor returns the address this host sends from toward remote (what
// rdma_resolve_addr binds to): the local address of a UDP socket connected there.
func localAddrFor(remote netip.Addr) (netip.Addr, error) {
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(remote, DefaultRoCEPort)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %v: %w", remote, err)
	}
	defer conn.Close()
	return conn.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// shareHostAddr is shareHost for a peer at addr.
func shareHostAddr(addr netip.Addr) (restore func()) {
	return shareHost(net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
}

// countersSince returns what a device's counters counted since base (a server's device
// serves client after client).
func countersSince(now, base verbs.Counters) verbs.Counters {
	d := now
	subUint64s(reflect.ValueOf(&d).Elem(), reflect.ValueOf(base))
	d.Queues = slices.Clone(now.Queues)
	for i := range d.Queues {
		if i < len(base.Queues) {
			subUint64s(reflect.ValueOf(&d.Queues[i]).Elem(), reflect.ValueOf(base.Queues[i]))
		}
	}
	return d
}

// subUint64s subtracts base's uint64 fields from v's (structs of the same type).
func subUint64s(v, base reflect.Value) {
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Uint64 {
			f.SetUint(f.Uint() - base.Field(i).Uint())
		}
	}
}
