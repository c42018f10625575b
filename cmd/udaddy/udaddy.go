package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/verbs"
)

// udaddy's defaults (librdmacm/examples/udaddy.c).
const (
	defaultPort        = 7174
	defaultConnections = 1
	defaultCount       = 10
	defaultSize        = 100
)

// Config is one run of udaddy: the C tool's options, and what tests set instead of
// opening a device.
type Config struct {
	Server      bool       // no -s
	Addr        netip.Addr // -s: the server's address (client)
	Bind        netip.Addr // -b: the address to bind (the device's)
	Port        int        // --port: the rdma_cm port (udaddy's fixed 7174)
	Connections int        // -c
	Count       int        // -C: messages each way per connection (0: none)
	Size        int        // -S: message size (0: no messages, as udaddy)
	// Local is the device: --dev-addr (default -b; a client without -b: the route's
	// source address), --udp-port, --pcap, and what tests set instead.
	cmtool.Local
}

func (c *Config) defaults() {
	if c.Port == 0 {
		c.Port = defaultPort
	}
	if c.Connections == 0 {
		c.Connections = defaultConnections
	}
	c.Local.Defaults()
	if c.Size == 0 {
		c.Count = 0 // udaddy: no message size, no messages
	}
}

func (c *Config) validate() error {
	switch {
	case c.Connections < 1:
		return fmt.Errorf("invalid number of connections %d", c.Connections)
	case c.Count < 0 || c.Size < 0:
		return fmt.Errorf("invalid message count %d or size %d", c.Count, c.Size)
	case c.Port < 1 || c.Port > 65535:
		return fmt.Errorf("port %d out of range", c.Port)
	case c.Server && c.Device == nil && !c.DevAddr.IsValid() && (!c.Bind.IsValid() || c.Bind.IsUnspecified()):
		return errors.New("a server needs an address to bind: -b ADDR or --dev-addr ADDR (a softrnic device is one IP address)")
	}
	return nil
}

// Result is one connection's outcome, and its JSON object with --json.
type Result struct {
	Tool    string `json:"tool"`
	Role    string `json:"role"`
	Index   int    `json:"index"` // the connection's number (udaddy's node id)
	Local   string `json:"local"` // this device's address and UDP port
	Peer    string `json:"peer"`  // the peer device's address and UDP port
	Port    int    `json:"port"`  // rdma_cm port (UDP port space)
	QPN     uint32 `json:"qpn"`
	PeerQPN uint32 `json:"peer_qpn"`
	// PeerQKey is the Q_Key the datagrams to the peer carry: the resolution's (client),
	// this QP's own (server, as udaddy answers with its QP's Q_Key).
	PeerQKey uint32 `json:"peer_qkey"`
	Count    int    `json:"count"`
	Size     int    `json:"size"`
	Sent     int    `json:"sent"`     // datagrams posted
	Received int    `json:"received"` // datagrams received
	// Bad counts completions that failed, or datagrams of another length than -S, or
	// not from the peer's QP.
	Bad   int    `json:"bad"`
	Error string `json:"error,omitempty"`
	OK    bool   `json:"ok"`
	cmtool.Counters
	SIDR cm.SIDRCounters `json:"sidr"`
	QP   verbs.Counters  `json:"qp"`
}

// output is where a run writes: Out takes udaddy's progress lines; Emit gets each
// connection's result. udaddy writes nothing to Log.
type output = cmtool.Output[*Result]

// node is one connection's verbs objects, as udaddy's struct cmatest_node.
type node struct {
	id    int
	pd    *verbs.PD
	ch    *verbs.CompChannel
	cq    *verbs.CQ
	w     *cmtool.Waiter
	qp    *verbs.QP
	mr    *verbs.MR
	buf   []byte // the receive buffer (GRH area + message), then the send buffer
	ah    *verbs.AH
	req   *cm.UDRequest  // server: the request it answered
	peer  netip.AddrPort // the peer device
	rqpn  uint32         // remote QPN
	rqkey uint32         // remote Q_Key
	up    bool           // udaddy's "connected"
	res   Result
}

// run runs udaddy: a server answers -c resolution requests and echoes datagrams, a
// client resolves -c times and sends. It returns udaddy's return status as an error.
func run(ctx context.Context, cfg *Config, o *output) error {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	dev, release, err := cfg.Open(cfg.Bind, cfg.Addr, "udaddy: failure getting addr")
	if err != nil {
		return err
	}
	defer release()
	nodes := make([]*node, cfg.Connections)
	for i := range nodes {
		nodes[i] = &node{id: i}
	}
	defer func() {
		for _, n := range nodes {
			n.free()
		}
	}()
	if cfg.Server {
		err = runServer(ctx, cfg, dev, nodes, o)
	} else {
		err = runClient(ctx, cfg, dev, nodes, o)
	}
	o.Printf("test complete\n")
	counters := cmtool.Read(dev)
	sidr := cm.DeviceSIDRCounters(dev)
	for _, n := range nodes {
		r := &n.res
		r.Tool, r.Role, r.Index, r.Local, r.Port, r.Count, r.Size = "udaddy", role(cfg), n.id, dev.Addr().String(), cfg.Port, cfg.Count, cfg.Size
		if n.qp != nil {
			r.QPN, r.QP = n.qp.QPNum(), n.qp.Counters()
		}
		if n.up {
			r.Peer, r.PeerQPN, r.PeerQKey = n.peer.String(), n.rqpn, n.rqkey
		}
		if r.Error == "" && err != nil {
			r.Error = err.Error()
		}
		r.OK = n.up && r.Error == "" && r.Bad == 0 && r.Received == cfg.Count && r.Sent == cfg.Count
		r.Counters, r.SIDR = counters, sidr
		o.Result(r)
	}
	if err != nil {
		o.Printf("return status %s\n", err)
		return err
	}
	for _, n := range nodes {
		if !n.res.OK {
			o.Printf("return status 1\n")
			return fmt.Errorf("connection %d: %d of %d datagrams received, %d bad", n.id, n.res.Received, cfg.Count, n.res.Bad)
		}
	}
	o.Printf("return status 0\n")
	return nil
}

func role(cfg *Config) string {
	if cfg.Server {
		return "server"
	}
	return "client"
}

// init creates the node's PD, CQ (with a completion channel), UD QP (in RTS with rdma_cm's
// Q_Key, as rdma_create_qp leaves a UDP id's QP) and message buffer, as udaddy's
// init_node, after checking the message size against the active MTU (verify_test_params).
func (n *node) init(dev *verbs.Device, cfg *Config) error {
	port, err := dev.QueryPort(1)
	if err != nil {
		return err
	}
	if cfg.Count > 0 && cfg.Size > port.ActiveMTU.Bytes() {
		return fmt.Errorf("udaddy: message_size %d is larger than active mtu %d", cfg.Size, port.ActiveMTU.Bytes())
	}
	if n.pd, err = dev.AllocPD(); err != nil {
		return fmt.Errorf("udaddy: unable to allocate PD: %w", err)
	}
	if n.ch, err = dev.CreateCompChannel(); err != nil {
		return err
	}
	depth := max(cfg.Count, 1)
	if n.cq, err = dev.CreateCQ(2*depth, n.ch, 0); err != nil {
		return fmt.Errorf("udaddy: unable to create CQ: %w", err)
	}
	n.w = cmtool.NewWaiter(n.cq)
	if n.qp, err = n.pd.CreateQP(&verbs.QPInitAttr{QPType: verbs.QPTypeUD, SendCQ: n.cq, RecvCQ: n.cq,
		Cap: verbs.QPCap{MaxSendWR: depth, MaxRecvWR: depth, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return fmt.Errorf("udaddy: unable to create QP: %w", err)
	}
	if err := cm.InitUDQP(n.qp, cm.UDPQKey); err != nil {
		return fmt.Errorf("udaddy: unable to create QP: %w", err)
	}
	if cfg.Count == 0 {
		return nil
	}
	n.buf = make([]byte, verbs.GRHLen+cfg.Size)
	if n.mr, err = n.pd.RegMR(n.buf, verbs.AccessLocalWrite); err != nil {
		return fmt.Errorf("failed to reg MR: %w", err)
	}
	// Receives, as udaddy's post_recvs: -C of them, all into the one buffer.
	wrs := make([]verbs.RecvWR, cfg.Count)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{WRID: uint64(n.id), SGList: []verbs.SGE{n.mr.SGE(0, len(n.buf))}}
	}
	if err := n.qp.PostRecv(wrs); err != nil {
		return fmt.Errorf("failed to post receives: %w", err)
	}
	return nil
}

func (n *node) free() {
	if n.ah != nil {
		n.ah.DestroyAH()
	}
	if n.qp != nil {
		n.qp.DestroyQP()
	}
	if n.mr != nil {
		n.mr.DeregMR()
	}
	if n.cq != nil {
		n.cq.DestroyCQ()
	}
	if n.ch != nil {
		n.ch.DestroyCompChannel()
	}
	if n.pd != nil {
		n.pd.DeallocPD()
	}
}

// postSends posts -C SENDs with immediate data (this QP's number, which the server
// answers to) of -S bytes from the start of the node's buffer, as udaddy's post_sends.
func (n *node) postSends(cfg *Config, flags verbs.SendFlags) error {
	if !n.up || cfg.Count == 0 {
		return nil
	}
	wr := verbs.SendWR{WRID: uint64(n.id), Opcode: verbs.WRSendWithImm, SendFlags: flags, ImmData: n.qp.QPNum(),
		SGList: []verbs.SGE{n.mr.SGE(0, cfg.Size)}, AH: n.ah, RemoteQPN: n.rqpn, RemoteQKey: n.rqkey}
	for range cfg.Count {
		if err := n.qp.PostSend([]verbs.SendWR{wr}); err != nil {
			return fmt.Errorf("failed to post sends: %w", err)
		}
		n.res.Sent++
	}
	return nil
}

// poll waits for -C completions on each connected node's CQ, as udaddy's poll_cqs;
// first is called with the first completion of a node (the server makes its reply
// address from it). Received datagrams are checked: success, -S bytes after the GRH
// area, and, once the peer's QP is known, from it.
func poll(ctx context.Context, cfg *Config, nodes []*node, first func(*node, *verbs.WorkCompletion) error) error {
	for _, n := range nodes {
		if !n.up {
			continue
		}
		for done := 0; done < cfg.Count; done++ {
			wc, err := n.w.Next(ctx)
			if err != nil {
				return fmt.Errorf("udaddy: failed polling CQ: %w", err)
			}
			if wc.Status != verbs.WCSuccess {
				n.res.Bad++
				n.res.Error = fmt.Sprintf("completion status %v (%v)", wc.Status, wc.VendorErr)
				continue
			}
			if wc.Opcode == verbs.WCRecv {
				n.res.Received++
				if wc.ByteLen != uint32(verbs.GRHLen+cfg.Size) || wc.WCFlags&verbs.WCWithImm == 0 || (n.rqpn != 0 && wc.SrcQP != n.rqpn) {
					n.res.Bad++
				}
			}
			if first != nil && n.ah == nil {
				if err := first(n, &wc); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// runServer is udaddy's run_server: listen, answer -c requests (each with a node whose
// receives are posted), receive -C datagrams per node, answer each node's sender from
// the first datagram's source (GRH) and immediate data (its QP), then wait for the
// replies' completions.
func runServer(ctx context.Context, cfg *Config, dev *verbs.Device, nodes []*node, o *output) error {
	l, err := cm.ListenUD(dev, uint16(cfg.Port))
	if err != nil {
		return fmt.Errorf("udaddy: failure trying to listen: %w", err)
	}
	defer l.Close()
	// Printed once listening (udaddy prints it just before): a script may start the
	// client when it sees the line.
	o.Printf("udaddy: starting server\n")
	if cfg.Listening != nil {
		cfg.Listening(l.Addr())
	}
	for _, n := range nodes {
		req, err := l.Accept(ctx)
		if err != nil {
			return fmt.Errorf("udaddy: waiting for connection requests: %w", err)
		}
		if err := n.init(dev, cfg); err != nil {
			o.Printf("udaddy: failing connection request\n")
			_ = req.Reject(nil)
			return err
		}
		if err := req.Accept(n.qp, nil); err != nil {
			o.Printf("udaddy: failure accepting: %v\n", err)
			return err
		}
		n.req, n.peer, n.up = req, req.Remote, true
	}
	if cfg.Count == 0 {
		return nil
	}
	o.Printf("receiving data transfers\n")
	if err := poll(ctx, cfg, nodes, replyAH); err != nil {
		return err
	}
	o.Printf("sending replies\n")
	for _, n := range nodes {
		if err := n.postSends(cfg, verbs.SendSignaled); err != nil {
			return err
		}
	}
	if err := poll(ctx, cfg, nodes, nil); err != nil {
		return err
	}
	o.Printf("data transfers complete\n")
	return nil
}

// replyAH is udaddy's create_reply_ah: the address handle from the datagram's source
// (ibv_create_ah_from_wc reads the GRH), the peer QP from its immediate data, the Q_Key
// this QP's own. The source's UDP port is where its device listens: 4791 for a standard
// peer, whatever port its datagrams came from; a softrnic device's own port, which the
// resolution request told.
func replyAH(n *node, wc *verbs.WorkCompletion) error {
	src, ok := verbs.ParseGRH(n.buf[:verbs.GRHLen])
	if !ok {
		return errors.New("udaddy: failure creating address handle: no GRH")
	}
	port := uint16(cm.RoCEv2Port)
	if src.Addr() == n.req.Remote.Addr() {
		port = n.req.Remote.Port()
	}
	var err error
	if n.ah, err = n.pd.CreateAH(&verbs.AHAttr{DGID: src, DestPort: port, PortNum: 1, IsGlobal: true, HopLimit: 64}); err != nil {
		return fmt.Errorf("udaddy: failure creating address handle: %w", err)
	}
	n.peer = netip.AddrPortFrom(src.Addr(), port)
	n.rqpn = wc.ImmData
	attr, _ := n.qp.QueryQP()
	n.rqkey = attr.QKey
	return nil
}

// runClient is udaddy's run_client: for each connection a node (receives posted) and a
// resolution of the server's port, all at once; then -C datagrams from each connected
// node to the server's QP, and -C replies awaited.
func runClient(ctx context.Context, cfg *Config, dev *verbs.Device, nodes []*node, o *output) error {
	o.Printf("udaddy: starting client\n")
	o.Printf("udaddy: connecting\n")
	remote := netip.AddrPortFrom(cfg.Addr, uint16(cfg.Port))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		if err := n.init(dev, cfg); err != nil {
			errs[i] = err
			n.res.Error = err.Error()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rem, err := cm.ResolveUD(ctx, dev, remote, &cm.ResolveParams{DevicePort: uint16(cfg.PeerPort)})
			if err != nil {
				errs[i] = err
				return
			}
			n.ah, err = n.pd.CreateAH(&rem.AHAttr)
			if err != nil {
				errs[i] = fmt.Errorf("udaddy: failure creating address handle: %w", err)
				return
			}
			n.peer, n.rqpn, n.rqkey, n.up = rem.Addr, rem.QPN, rem.QKey, true
		}()
	}
	wg.Wait()
	var first error
	for i, err := range errs {
		if err == nil {
			continue
		}
		o.Printf("udaddy: event: %s, error: %v\n", eventName(err), err)
		nodes[i].res.Error = err.Error()
		if first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	if cfg.Count == 0 {
		return nil
	}
	o.Printf("initiating data transfers\n")
	for _, n := range nodes {
		if err := n.postSends(cfg, 0); err != nil {
			return err
		}
	}
	o.Printf("receiving data transfers\n")
	if err := poll(ctx, cfg, nodes, nil); err != nil {
		return err
	}
	o.Printf("data transfers complete\n")
	return nil
}

// eventName is the rdma_cm event a failed resolution would have been.
func eventName(err error) string {
	var se *cm.SIDRError
	switch {
	case errors.As(err, &se), errors.Is(err, cm.ErrTimeout):
		return "RDMA_CM_EVENT_UNREACHABLE" // cma_sidr_rep_handler: a status, or IB_CM_SIDR_REQ_ERROR
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "interrupted"
	}
	return "RDMA_CM_EVENT_ADDR_ERROR"
}
