package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/verbs"
)

// cmatose's defaults (librdmacm/examples/cmatose.c).
const (
	defaultPort        = 7471
	defaultConnections = 1
	defaultCount       = 10
	defaultSize        = 100
)

// Config is one run of ucmatose: the C tool's options, and what tests set instead of
// opening a device.
type Config struct {
	ServerAddr    netip.Addr // -s: the server to connect to (a client); unset: be the server
	Bind          netip.Addr // -b: the address to bind
	Port          int        // -p (7471)
	Connections   int        // -c (1)
	Count         int        // -C messages each way per connection (10)
	Size          int        // -S message size (100); 0 means no messages, as cmatose
	AckTimeout    int        // -a: the QP's local ACK timeout code (with SetAckTimeout)
	SetAckTimeout bool
	Migrate       bool // -m: accepted (cmatose moves its IDs to a new event channel)
	Validate      bool // -V (softrnic): messages carry a pattern, checked on receipt
	// Local is the device: --dev-addr (default -b; a client's: the route's source),
	// --udp-port, --pcap, and what tests set instead.
	cmtool.Local
}

func (c *Config) client() bool { return c.ServerAddr.IsValid() }

func (c *Config) defaults() {
	if c.Port == 0 {
		c.Port = defaultPort
	}
	c.Local.Defaults()
	if c.Size == 0 {
		c.Count = 0 // cmatose: no message size, no messages
	}
}

func (c *Config) validate() error {
	if c.Connections < 1 {
		return fmt.Errorf("-c %d: at least one connection", c.Connections)
	}
	if c.Count < 0 || c.Size < 0 {
		return fmt.Errorf("-C %d -S %d: negative", c.Count, c.Size)
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("port %d out of range", c.Port)
	}
	if !c.client() && c.Device == nil && !c.DevAddr.IsValid() && (!c.Bind.IsValid() || c.Bind.IsUnspecified()) {
		return errors.New("a server needs an address to bind: -b ADDR or --dev-addr ADDR (a softrnic device is one IP address)")
	}
	return nil
}

// Result is a run's outcome, and its JSON object with --json.
type Result struct {
	Tool         string `json:"tool"`
	Role         string `json:"role"`
	Local        string `json:"local"`
	Peer         string `json:"peer,omitempty"` // the server's device (client)
	Port         int    `json:"port"`
	Connections  int    `json:"connections"` // asked for
	Established  int    `json:"established"`
	ConnectFails int    `json:"connect_failures"`
	MessageCount int    `json:"message_count"`
	MessageSize  int    `json:"message_size"`
	// Sent and Received count successful completions over all connections (each should
	// be established × message_count); BadLength receives of another size; Mismatches
	// (-V) receives whose bytes differed from the pattern; CompletionErrors completions
	// with an error status other than a flush; Flushed sends flushed when the peer
	// disconnected (delivered, their ACK overtaken by the DisconnectRequest).
	Sent             int     `json:"sent"`
	Received         int     `json:"received"`
	BadLength        int     `json:"bad_length"`
	Mismatches       int     `json:"mismatches"`
	CompletionErrors int     `json:"completion_errors"`
	Flushed          int     `json:"flushed"`
	Disconnected     int     `json:"disconnected"`
	ConnectSeconds   float64 `json:"connect_seconds"`
	TransferSeconds  float64 `json:"transfer_seconds"`
	DisconnectSecs   float64 `json:"disconnect_seconds"`
	Error            string  `json:"error,omitempty"`
	OK               bool    `json:"ok"`
	cmtool.Counters
}

// output is where a run writes: Out takes cmatose's progress lines (stdout), Log its
// errors (stderr). A run has one result, which run returns: Emit is not used.
type output = cmtool.Output[*Result]

// node is one connection's objects, as cmatose's struct cmatest_node: a PD, a send and a
// receive CQ of message_count entries each, an RC QP (message_count sends and receives,
// every send signaled) and one registered buffer of message_size bytes, which cmatose
// uses for every send and receive alike. With -V the node has a slot per message
// instead, so that each message can be checked.
type node struct {
	id     int
	cfg    *Config
	pd     *verbs.PD
	cq     [2]*verbs.CQ // send, receive
	w      [2]*cmtool.Waiter
	qp     *verbs.QP
	mem    []byte
	mr     *verbs.MR
	sendAt func(i int) int // offset of send i's bytes in mem
	recvAt func(i int) int
	conn   *cm.Conn

	sent, received, badLen, mismatches, compErrs, flushed int
}

const (
	sendCQ = 0
	recvCQ = 1
)

func newNode(id int, cfg *Config, dev *verbs.Device) (*node, error) {
	n := &node{id: id, cfg: cfg}
	var err error
	if n.pd, err = dev.AllocPD(); err != nil {
		return n, fmt.Errorf("cmatose: unable to allocate PD: %w", err)
	}
	cqe := max(cfg.Count, 1)
	for i := range n.cq {
		ch, err := dev.CreateCompChannel()
		if err != nil {
			return n, fmt.Errorf("cmatose: unable to create CQ: %w", err)
		}
		if n.cq[i], err = dev.CreateCQ(cqe, ch, 0); err != nil {
			ch.DestroyCompChannel()
			return n, fmt.Errorf("cmatose: unable to create CQ: %w", err)
		}
		n.w[i] = cmtool.NewWaiter(n.cq[i])
	}
	if n.qp, err = n.pd.CreateQP(&verbs.QPInitAttr{SendCQ: n.cq[sendCQ], RecvCQ: n.cq[recvCQ], QPType: verbs.QPTypeRC, SQSigAll: true,
		Cap: verbs.QPCap{MaxSendWR: cqe, MaxRecvWR: cqe, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return n, fmt.Errorf("cmatose: unable to create QP: %w", err)
	}
	if err := cm.InitQP(n.qp, verbs.ConnectOptions{}.WithDefaults().Access); err != nil {
		return n, fmt.Errorf("cmatose: unable to create QP: %w", err)
	}
	if cfg.Count == 0 {
		return n, nil
	}
	size := cfg.Size
	if cfg.Validate {
		n.mem = make([]byte, 2*cfg.Count*size)
		n.sendAt = func(i int) int { return i * size }
		n.recvAt = func(i int) int { return (cfg.Count + i) * size }
		for i := range cfg.Count {
			fill(n.mem[n.sendAt(i):n.sendAt(i)+size], i)
		}
	} else {
		n.mem = make([]byte, size)
		n.sendAt = func(int) int { return 0 }
		n.recvAt = n.sendAt
	}
	if n.mr, err = n.pd.RegMR(n.mem, verbs.AccessLocalWrite); err != nil {
		return n, fmt.Errorf("failed to reg MR: %w", err)
	}
	return n, nil
}

// fill writes message i's pattern (-V).
func fill(b []byte, i int) {
	for j := range b {
		b[j] = byte(i*131 + j)
	}
}

// postRecvs posts message_count receives (post_recvs).
func (n *node) postRecvs() error {
	if n.cfg.Count == 0 {
		return nil
	}
	wrs := make([]verbs.RecvWR, n.cfg.Count)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{n.mr.SGE(n.recvAt(i), n.cfg.Size)}}
	}
	if err := n.qp.PostRecv(wrs); err != nil {
		return fmt.Errorf("failed to post receives: %w", err)
	}
	return nil
}

// postSends posts message_count SENDs (post_sends).
func (n *node) postSends() error {
	if n.conn == nil || n.cfg.Count == 0 {
		return nil
	}
	wrs := make([]verbs.SendWR, n.cfg.Count)
	for i := range wrs {
		wrs[i] = verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, SGList: []verbs.SGE{n.mr.SGE(n.sendAt(i), n.cfg.Size)}}
	}
	if err := n.qp.PostSend(wrs); err != nil {
		return fmt.Errorf("failed to post sends: %w", err)
	}
	return nil
}

// poll takes message_count completions from CQ which (poll_cqs for one node). It stops
// early when the connection ends (what is left is flushed) or ctx does.
func (n *node) poll(ctx context.Context, which int) error {
	if n.conn == nil {
		return nil
	}
	cctx, cancel := cmtool.ConnContext(ctx, n.conn.Done())
	defer cancel()
	for done := 0; done < n.cfg.Count; done++ {
		// Completions already queued come first: after the connection ended (its QP
		// went to ERR, which flushes at once) they are the flushed ones.
		wc, err := n.w[which].Next(cctx)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			return nil // the connection ended
		}
		switch {
		case wc.Status == verbs.WCWRFlushErr:
			n.flushed++
		case wc.Status != verbs.WCSuccess:
			n.compErrs++
			return fmt.Errorf("connection %d: %v completion failed: %v (%v)", n.id, wc.Opcode, wc.Status, wc.VendorErr)
		case which == sendCQ:
			n.sent++
		case int(wc.ByteLen) != n.cfg.Size:
			n.badLen++
		default:
			n.received++
			if n.cfg.Validate {
				off := n.recvAt(int(wc.WRID))
				want := make([]byte, n.cfg.Size)
				fill(want, int(wc.WRID))
				if string(want) != string(n.mem[off:off+n.cfg.Size]) {
					n.mismatches++
				}
			}
		}
	}
	return nil
}

func (n *node) destroy() {
	if n.qp != nil {
		n.qp.DestroyQP()
	}
	for _, cq := range n.cq {
		if cq != nil {
			ch := cq.Channel()
			cq.DestroyCQ()
			ch.DestroyCompChannel()
		}
	}
	if n.mr != nil {
		n.mr.DeregMR()
	}
	if n.pd != nil {
		n.pd.DeallocPD()
	}
}

// test is one run: its nodes and result.
type test struct {
	cfg   *Config
	dev   *verbs.Device
	o     *output
	mu    sync.Mutex
	nodes []*node
	res   Result
	first error
}

func (t *test) fail(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.first == nil {
		t.first = err
	}
}

func (t *test) failed() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.first
}

// run runs ucmatose and returns its result (the error is the run's failure, also in the
// result, or a check of the configuration).
func run(ctx context.Context, cfg *Config, o *output) (*Result, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var bind netip.Addr // -b 0.0.0.0 binds no device: a client's is then the route's
	if !cfg.Bind.IsUnspecified() {
		bind = cfg.Bind
	}
	dev, release, err := cfg.Open(bind, cfg.ServerAddr, "cmatose: failure getting addr")
	if err != nil {
		return nil, err
	}
	defer release()
	t := &test{cfg: cfg, dev: dev, o: o}
	t.res = Result{Tool: "ucmatose", Role: "server", Local: dev.Addr().String(), Port: cfg.Port, Connections: cfg.Connections,
		MessageCount: cfg.Count, MessageSize: cfg.Size}
	if cfg.client() {
		t.res.Role = "client"
		t.res.Peer = netip.AddrPortFrom(cfg.ServerAddr, uint16(cfg.PeerPort)).String()
		err = t.runClient(ctx)
	} else {
		err = t.runServer(ctx)
	}
	for _, n := range t.nodes {
		r := &t.res
		r.Sent += n.sent
		r.Received += n.received
		r.BadLength += n.badLen
		r.Mismatches += n.mismatches
		r.CompletionErrors += n.compErrs
		r.Flushed += n.flushed
	}
	r := &t.res
	if err == nil {
		want := r.Established * cfg.Count
		switch {
		case r.Established != cfg.Connections:
			err = fmt.Errorf("%d of %d connections established", r.Established, cfg.Connections)
		case r.Received != want || r.BadLength != 0:
			err = fmt.Errorf("received %d messages of %d bytes (and %d of another size), want %d", r.Received, cfg.Size, r.BadLength, want)
		case r.Mismatches != 0:
			err = fmt.Errorf("%d messages differed from the pattern", r.Mismatches)
		case r.Sent+r.Flushed != want:
			err = fmt.Errorf("%d sends completed (and %d flushed), want %d", r.Sent, r.Flushed, want)
		case !cfg.client() && r.Flushed != 0:
			err = fmt.Errorf("%d sends flushed", r.Flushed)
		}
	}
	r.Counters = cmtool.Read(dev)
	for _, n := range t.nodes {
		n.destroy()
	}
	status := 0
	if err != nil {
		r.Error = err.Error()
		o.Logf("cmatose: %v\n", err)
		status = 1
	}
	r.OK = err == nil
	o.Printf("test complete\n")
	o.Printf("return status %d\n", status)
	return r, err
}

// connected records the nodes whose connection is up.
func (t *test) connected(n *node, conn *cm.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n.conn = conn
	t.res.Established++
}

// transfer runs the data phase: a server sends, completes its sends, then receives; a
// client receives, then replies (cmatose's run_server and run_client).
func (t *test) transfer(ctx context.Context) error {
	cfg := t.cfg
	if cfg.Count == 0 {
		return nil
	}
	t0 := time.Now()
	defer func() { t.res.TransferSeconds = time.Since(t0).Seconds() }()
	if !cfg.client() {
		t.o.Printf("initiating data transfers\n")
		for _, n := range t.nodes {
			if err := n.postSends(); err != nil {
				return err
			}
		}
		t.o.Printf("completing sends\n")
		for _, n := range t.nodes {
			if err := n.poll(ctx, sendCQ); err != nil {
				return err
			}
		}
		t.o.Printf("receiving data transfers\n")
		for _, n := range t.nodes {
			if err := n.poll(ctx, recvCQ); err != nil {
				return err
			}
		}
		t.o.Printf("data transfers complete\n")
		return nil
	}
	t.o.Printf("receiving data transfers\n")
	for _, n := range t.nodes {
		if err := n.poll(ctx, recvCQ); err != nil {
			return err
		}
	}
	t.o.Printf("sending replies\n")
	for _, n := range t.nodes {
		if err := n.postSends(); err != nil {
			return err
		}
	}
	t.o.Printf("data transfers complete\n")
	return nil
}

func (t *test) migrate() {
	if t.cfg.Migrate {
		t.o.Printf("migrating to new event channel\n") // nothing to move: package cm has no event channel
	}
}

// disconnectAll disconnects every connection at once and waits for the answers.
func (t *test) disconnectAll() error {
	t0 := time.Now()
	var wg sync.WaitGroup
	for _, n := range t.nodes {
		if n.conn == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.conn.Disconnect(); err != nil {
				t.fail(fmt.Errorf("connection %d: rdma_disconnect: %w", n.id, err))
				return
			}
			t.mu.Lock()
			t.res.Disconnected++
			t.mu.Unlock()
		}()
	}
	wg.Wait()
	t.res.DisconnectSecs = time.Since(t0).Seconds()
	return t.failed()
}

func (t *test) runServer(ctx context.Context) error {
	cfg := t.cfg
	t.o.Printf("cmatose: starting server\n")
	l, err := cm.Listen(t.dev, uint16(cfg.Port))
	if err != nil {
		return fmt.Errorf("cmatose: failure trying to listen: %w", err)
	}
	defer l.Close()
	// Scripts wait for this line before they start a client.
	t.o.Logf("ucmatose: listening on %v (device %v)\n", l.Addr(), t.dev.Addr())
	if cfg.Listening != nil {
		cfg.Listening(l.Addr())
	}
	// connect_events: accept -c requests, each on a node of its own with its receives
	// posted; the connections come up in parallel (rdma_accept does not wait for the RTU).
	var t0 time.Time // from the first request
	var wg sync.WaitGroup
	for len(t.nodes) < cfg.Connections {
		req, err := l.Accept(ctx)
		if err != nil {
			wg.Wait()
			return err
		}
		if t0.IsZero() {
			t0 = time.Now()
		}
		n, err := newNode(len(t.nodes), cfg, t.dev)
		if err == nil {
			err = n.postRecvs()
		}
		t.nodes = append(t.nodes, n)
		if err != nil {
			t.o.Printf("cmatose: failing connection request\n")
			req.Reject(nil)
			t.res.ConnectFails++
			wg.Wait()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := req.Accept(n.qp, &cm.AcceptParams{Options: t.connectOptions()})
			if err != nil {
				t.mu.Lock()
				t.res.ConnectFails++
				t.mu.Unlock()
				t.o.Logf("cmatose: failure accepting: %v\n", err)
				t.fail(err)
				return
			}
			t.connected(n, conn)
		}()
	}
	// Requests beyond -c are refused, as cmatose does, until the run ends.
	extra := make(chan struct{})
	defer func() { <-extra }()
	lctx, stopExtra := context.WithCancel(ctx)
	defer stopExtra()
	go func() {
		defer close(extra)
		for {
			req, err := l.Accept(lctx)
			if err != nil {
				return
			}
			t.o.Printf("cmatose: failing connection request\n")
			req.Reject(nil)
		}
	}()
	wg.Wait()
	t.res.ConnectSeconds = time.Since(t0).Seconds()
	if err := t.failed(); err != nil {
		t.disconnectAll()
		return err
	}
	if err := t.transfer(ctx); err != nil {
		t.disconnectAll()
		return err
	}
	t.migrate()
	t.o.Printf("cmatose: disconnecting\n")
	err = t.disconnectAll()
	t.o.Printf("disconnected\n")
	return err
}

// connectOptions are a node's QP attributes: cmatose's conn_param (responder resources
// and initiator depth 1, retry count 5, RNR retry count 0 as the memset leaves it) and
// the ACK timeout: -a's, or the one rdma_cm gives a RoCE QP (cmtool.RDMACMAckTimeout).
func (t *test) connectOptions() verbs.ConnectOptions {
	o := verbs.ConnectOptions{MaxRdAtomic: 1, RetryCnt: 5, Zero: verbs.ZeroRNRRetry, Timeout: cmtool.RDMACMAckTimeout}
	if a := t.cfg.AckTimeout; t.cfg.SetAckTimeout {
		o.Timeout = uint8(a)
		if a == 0 {
			o.Zero |= verbs.ZeroTimeout
		}
	}
	return o
}

func (t *test) runClient(ctx context.Context) error {
	cfg := t.cfg
	t.o.Printf("cmatose: starting client\n")
	t.o.Printf("cmatose: connecting\n")
	remote := netip.AddrPortFrom(cfg.ServerAddr, uint16(cfg.Port))
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range cfg.Connections {
		n, err := newNode(i, cfg, t.dev)
		if err == nil {
			err = n.postRecvs()
		}
		t.nodes = append(t.nodes, n)
		if err != nil {
			t.res.ConnectFails++
			t.fail(err)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := cm.Dial(ctx, t.dev, remote, n.qp, &cm.DialParams{DevicePort: uint16(cfg.PeerPort), Options: t.connectOptions()})
			if err != nil {
				t.mu.Lock()
				t.res.ConnectFails++
				t.mu.Unlock()
				t.o.Printf("cmatose: event: %v\n", err)
				t.fail(err)
				return
			}
			t.connected(n, conn)
		}()
	}
	wg.Wait()
	t.res.ConnectSeconds = time.Since(t0).Seconds()
	if err := t.failed(); err != nil {
		t.disconnectAll()
		return err
	}
	if err := t.transfer(ctx); err != nil {
		t.disconnectAll()
		return err
	}
	t.migrate()
	// disconnect_events: the server disconnects. Meanwhile the replies' completions come
	// (or are flushed by the disconnect).
	t0 = time.Now()
	for _, n := range t.nodes {
		if err := n.poll(ctx, sendCQ); err != nil {
			t.disconnectAll()
			return err
		}
	}
	for _, n := range t.nodes {
		select {
		case <-n.conn.Done():
			t.res.Disconnected++
		case <-ctx.Done():
			t.disconnectAll()
			return ctx.Err()
		}
	}
	t.res.DisconnectSecs = time.Since(t0).Seconds()
	return nil
}
