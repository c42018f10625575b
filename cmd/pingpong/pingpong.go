package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/softrnic/softrnic/internal/perf"
	"github.com/softrnic/softrnic/verbs"
)

// Work request ids, as the C tools use them: each is also a bit of the pending mask.
const (
	recvWRID = 1
	sendWRID = 2
)

// udQKey is the Q_Key ibv_ud_pingpong gives its QP and sends with.
const udQKey = 0x11111111

// pageSize is the C tools' sysconf(_SC_PAGESIZE) for -c (4096 on the machines they run on).
const pageSize = 4096

// fillByte is what the C tools memset their buffers to.
const fillByte = 0x7b

// Config is one run of either tool.
type Config struct {
	Mode     string     // "rc" (ibv_rc_pingpong) or "ud" (ibv_ud_pingpong)
	Server   string     // the server to connect to; "" makes this side the server
	Port     int        // TCP port of the exchange (18515)
	DevAddr  netip.Addr // this side's device address (-d); invalid: the exchange's local address
	UDPPort  int        // this device's RoCEv2 UDP port and the one the peer listens on (4791)
	IBPort   int        // -i: must be 1
	Size     int        // -s: message size; negative: the default (rc 4096, ud 1024)
	MTU      int        // -m: path MTU in bytes (rc: 1024; ud: the port's active MTU)
	RxDepth  int        // -r: receives posted at a time (500)
	Iters    int        // -n: exchanges (1000)
	SL       int        // -l: service level (accepted; RoCEv2 carries none)
	Events   bool       // -e: sleep on the completion channel instead of polling
	GIDIndex int        // -g: accepted; the device's one GID (its address) is always sent
	Check    bool       // -c: validate the received buffer
	Stats    bool       // --stats: the device's and the QP's counters in the result
	Pcap     string     // --pcap: the device's packets to this file

	// Device, if set, is the device to use (not closed); DevAddr and UDPPort are then
	// ignored, except that UDPPort is still where the peer is sent to. For tests.
	Device *verbs.Device
	// Listener, if set, is where the server accepts its client (closed after the accept),
	// instead of a listener on Port.
	Listener net.Listener
}

// toolName returns the C tool the mode stands for.
func (c *Config) toolName() string { return c.Mode + "_pingpong" }

// defaults fills in what the C tools default to (the MTU is settled when the device is
// known: see open).
func (c *Config) defaults() {
	if c.Port == 0 {
		c.Port = 18515
	}
	if c.UDPPort == 0 {
		c.UDPPort = verbs.DefaultPort
	}
	if c.IBPort == 0 {
		c.IBPort = 1
	}
	if c.Size < 0 {
		if c.Mode == "ud" {
			c.Size = 1024
		} else {
			c.Size = 4096
		}
	}
	if c.RxDepth == 0 {
		c.RxDepth = 500
	}
	if c.Iters == 0 {
		c.Iters = 1000
	}
}

func (c *Config) validate() error {
	switch {
	case c.Mode != "rc" && c.Mode != "ud":
		return fmt.Errorf("mode %q: want rc or ud", c.Mode)
	case c.IBPort != 1:
		return fmt.Errorf("ib port %d: the device has one port, 1", c.IBPort)
	case c.Size > 1<<30:
		return fmt.Errorf("size %d: at most 1 GiB", c.Size)
	case c.RxDepth < 2 || c.RxDepth > 16384:
		return fmt.Errorf("rx-depth %d: want 2..16384 (max_qp_wr)", c.RxDepth)
	case c.Iters < 1:
		return fmt.Errorf("iters %d: want at least 1", c.Iters)
	case c.UDPPort < 1 || c.UDPPort > 65535:
		return fmt.Errorf("UDP port %d out of range", c.UDPPort)
	}
	if c.MTU != 0 {
		if _, err := verbs.MTUFromBytes(c.MTU); err != nil {
			return fmt.Errorf("mtu %d: want 256, 512, 1024, 2048 or 4096", c.MTU)
		}
	}
	return nil
}

// Latency summarises per-iteration times in microseconds, as rperf's lat_us.
type Latency = perf.Latency

// Address is one side's "LID, QPN, PSN, GID", as the tools print it.
type Address struct {
	LID uint16 `json:"lid"`
	QPN uint32 `json:"qpn"`
	PSN uint32 `json:"psn"`
	GID string `json:"gid"`
}

func (d dest) address() Address {
	return Address{LID: d.LID, QPN: d.QPN, PSN: d.PSN, GID: gidString(d.GID)}
}

// Result is one run's outcome: the C tools' two lines, and more.
type Result struct {
	Test    string  `json:"test"` // rc_pingpong or ud_pingpong
	Role    string  `json:"role"` // server or client
	Local   Address `json:"local"`
	Remote  Address `json:"remote"`
	Size    int     `json:"size"`
	Iters   int     `json:"iters"`
	MTU     int     `json:"mtu"`
	Events  bool    `json:"events,omitempty"`
	Bytes   int64   `json:"bytes"` // size * iters * 2: both directions
	Seconds float64 `json:"seconds"`
	Mbps    float64 `json:"mbit_per_sec"`
	UsecIt  float64 `json:"usec_per_iter"`
	BW      float64 `json:"bw_MiBps"` // both directions, as Bytes
	// Lat is one way: half of each iteration (a SEND each way), as perftest's send_lat,
	// over iterations 2..n (the first one includes the peer's start).
	Lat      *Latency `json:"lat_us,omitempty"`
	CQEvents int      `json:"cq_events,omitempty"`
	Checked  bool     `json:"checked,omitempty"`
	// With Checked: the pages whose first byte was not what the client wrote (the C
	// tools' check: "invalid data in page N"), and the received messages whose length or
	// bytes were not the client's pattern (a stricter check of every byte of every
	// message).
	InvalidPages []int `json:"invalid_pages,omitempty"`
	BadMessages  int   `json:"bad_messages,omitempty"`
	// With Config.Stats: the device's counters (after the QP was destroyed) and the QP's
	// (at the end of the loop).
	Device *verbs.Counters `json:"device_counters,omitempty"`
	QP     *verbs.Counters `json:"qp_counters,omitempty"`
}

// Lines returns the C tools' two result lines.
func (r *Result) Lines() string {
	usec := r.Seconds * 1e6
	return fmt.Sprintf("%d bytes in %.2f seconds = %.2f Mbit/sec\n%d iters in %.2f seconds = %.2f usec/iter\n",
		r.Bytes, usec/1e6, r.Mbps, r.Iters, usec/1e6, r.UsecIt)
}

// Invalid says whether the -c check failed.
func (r *Result) Invalid() bool { return len(r.InvalidPages) > 0 || r.BadMessages > 0 }

// pingpong is one side: pp_init_ctx's pingpong_context.
type pingpong struct {
	cfg     *Config
	info    io.Writer
	dev     *verbs.Device
	ownDev  bool
	ch      *verbs.CompChannel
	pd      *verbs.PD
	mr      *verbs.MR
	cq      *verbs.CQ
	qp      *verbs.QP
	ah      *verbs.AH
	buf     []byte
	mtu     int
	payload int // where a message's bytes start in buf: 0 (rc) or the GRH area (ud)
	my      dest
	rem     dest

	sendWR  []verbs.SendWR
	recvWRs []verbs.RecvWR
	wc      [2]verbs.WorkCompletion
	events  int
}

// run runs one side of the ping-pong. Lines the C tools print go to info (the address
// lines and warnings; the result lines are the caller's to print from the Result).
func run(ctx context.Context, cfg *Config, info io.Writer) (*Result, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &pingpong{cfg: cfg, info: info}
	defer p.close()

	// A server listens first: once its local address line is printed, a client can
	// connect (scripts and tests wait for that line).
	ln := cfg.Listener
	if cfg.Server == "" && ln == nil {
		var err error
		if ln, err = net.Listen("tcp", ":"+strconv.Itoa(cfg.Port)); err != nil {
			return nil, fmt.Errorf("couldn't listen to port %d: %w", cfg.Port, err)
		}
	}
	if ln != nil {
		defer ln.Close()
	}
	// The device: the one given, the address given, or (below) the exchange's own local
	// address, known once the TCP connection is up.
	if cfg.Device != nil {
		if err := p.open(cfg.Device, false); err != nil {
			return nil, err
		}
	} else if cfg.DevAddr.IsValid() {
		if err := p.openAddr(cfg.DevAddr); err != nil {
			return nil, err
		}
	}

	var conn net.Conn
	if cfg.Server == "" {
		var err error
		conn, err = accept(ctx, ln)
		ln.Close() // one client, as the C tools
		if err != nil {
			return nil, fmt.Errorf("accept() failed: %w", err)
		}
	} else {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, "tcp", net.JoinHostPort(cfg.Server, strconv.Itoa(cfg.Port)))
		if err != nil {
			return nil, fmt.Errorf("couldn't connect to %s:%d: %w", cfg.Server, cfg.Port, err)
		}
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if p.dev == nil {
		local := addrOf(conn.LocalAddr())
		if err := p.openAddr(local); err != nil {
			return nil, err
		}
	}

	var err error
	if cfg.Server == "" {
		if p.rem, err = serverRead(conn); err == nil {
			p.fixPeerGID(conn)
			if err = p.connect(); err == nil {
				err = serverAnswer(conn, p.my)
			}
		}
	} else {
		if p.rem, err = clientExchange(conn, p.my); err == nil {
			p.fixPeerGID(conn)
		}
	}
	conn.Close()
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	fmt.Fprintf(info, "  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n",
		p.rem.LID, p.rem.QPN, p.rem.PSN, gidString(p.rem.GID))
	if cfg.Server != "" {
		if err := p.connect(); err != nil {
			return nil, err
		}
	}
	r, err := p.loop(ctx)
	if err != nil {
		return nil, err
	}
	// The device's counters once the QP is gone: its last ACK may have been held back
	// until then, to ride along with a send that never came.
	p.destroyQP()
	if cfg.Stats {
		dc := p.dev.Counters()
		r.Device = &dc
	}
	return r, nil
}

// accept waits for one connection on ln, or for ctx.
func accept(ctx context.Context, ln net.Listener) (net.Conn, error) {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	conn, err := ln.Accept()
	return conn, ctxErr(ctx, err)
}

func ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// addrOf returns a connection end's IP address (IPv4-mapped addresses unmapped).
func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap.Addr().Unmap()
}

// fixPeerGID stands in for a GID the peer did not send: the C tools send zeros without
// -g, with which no RoCE peer can be reached; the control connection's peer address is
// the best guess.
func (p *pingpong) fixPeerGID(conn net.Conn) {
	if !p.rem.GID.IsZero() {
		return
	}
	a := addrOf(conn.RemoteAddr())
	p.rem.GID = verbs.GIDFromAddr(a)
	fmt.Fprintf(p.info, "  peer sent no GID (run it with -g: rxe's RoCEv2 GID of an IPv4 address is usually index 1); using the control connection's %v\n", a)
}

// openAddr opens a device on addr.
func (p *pingpong) openAddr(addr netip.Addr) error {
	dev, err := verbs.OpenDevice(verbs.DeviceConfig{Addr: addr, Port: p.cfg.UDPPort, PcapFile: p.cfg.Pcap})
	if err != nil {
		return fmt.Errorf("couldn't open a device on %v: %w", addr, err)
	}
	return p.open(dev, true)
}

// open is pp_init_ctx, the receives posted, the CQ armed and the local address printed.
func (p *pingpong) open(dev *verbs.Device, own bool) error {
	c := p.cfg
	p.dev, p.ownDev = dev, own
	gid, err := dev.QueryGID(1, 0)
	if err != nil {
		return err
	}
	switch {
	case c.MTU != 0:
		p.mtu = c.MTU
	case c.Mode == "rc":
		p.mtu = 1024 // IBV_MTU_1024, rc_pingpong's default
	default:
		// ud_pingpong: the port's active MTU (ibv_query_port), which follows the link's
		// MTU as rxe's does (1500 -> 1024).
		pa, err := dev.QueryPort(uint8(c.IBPort))
		if err != nil {
			return err
		}
		p.mtu = pa.ActiveMTU.Bytes()
	}
	if c.Mode == "ud" {
		// ud_pingpong: the message must fit one packet of the port's MTU; the receive
		// buffer has the GRH area before it.
		if c.Size > p.mtu {
			return fmt.Errorf("requested size larger than port MTU (%d)", p.mtu)
		}
		p.payload = verbs.GRHLen
	}
	if c.Events {
		if p.ch, err = dev.CreateCompChannel(); err != nil {
			return fmt.Errorf("couldn't create completion channel: %w", err)
		}
	}
	if p.pd, err = dev.AllocPD(); err != nil {
		return fmt.Errorf("couldn't allocate PD: %w", err)
	}
	p.buf = make([]byte, max(p.payload+c.Size, 1))
	for i := range p.buf {
		p.buf[i] = fillByte
	}
	if p.mr, err = p.pd.RegMR(p.buf, verbs.AccessLocalWrite); err != nil {
		return fmt.Errorf("couldn't register MR: %w", err)
	}
	if p.cq, err = dev.CreateCQ(c.RxDepth+1, p.ch, 0); err != nil {
		return fmt.Errorf("couldn't create CQ: %w", err)
	}
	qpType := verbs.QPTypeRC
	if c.Mode == "ud" {
		qpType = verbs.QPTypeUD
	}
	if p.qp, err = p.pd.CreateQP(&verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq, QPType: qpType,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: c.RxDepth, MaxSendSGE: 1, MaxRecvSGE: 1,
			MaxInlineData: dev.QueryDevice().MaxInlineData}}); err != nil {
		return fmt.Errorf("couldn't create QP: %w", err)
	}
	flags := verbs.SendSignaled
	if _, init := p.qp.QueryQP(); init.Cap.MaxInlineData >= c.Size {
		flags |= verbs.SendInline
	}
	init := verbs.QPAttr{QPState: verbs.StateInit, PortNum: uint8(c.IBPort)}
	mask := verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort
	if c.Mode == "ud" {
		init.QKey, mask = udQKey, mask|verbs.QPAttrQKey
	} else {
		mask |= verbs.QPAttrAccessFlags // 0: no remote access
	}
	if err := p.qp.ModifyQP(&init, mask); err != nil {
		return fmt.Errorf("failed to modify QP to INIT: %w", err)
	}

	// The work requests, built once: every receive takes the whole buffer, every send
	// goes out of it (ud: after the GRH area).
	p.recvWRs = make([]verbs.RecvWR, c.RxDepth)
	rsge := []verbs.SGE{p.mr.SGE(0, p.payload+c.Size)}
	for i := range p.recvWRs {
		p.recvWRs[i] = verbs.RecvWR{WRID: recvWRID, SGList: rsge}
	}
	p.sendWR = []verbs.SendWR{{WRID: sendWRID, Opcode: verbs.WRSend, SendFlags: flags,
		SGList: []verbs.SGE{p.mr.SGE(p.payload, c.Size)}}}
	if err := p.qp.PostRecv(p.recvWRs); err != nil {
		return fmt.Errorf("couldn't post receive: %w", err)
	}
	if c.Events {
		if err := p.cq.ReqNotifyCQ(false); err != nil {
			return fmt.Errorf("couldn't request CQ notification: %w", err)
		}
	}
	p.my = dest{QPN: p.qp.QPNum(), PSN: verbs.RandomPSN(), GID: gid}
	sep := ","
	if c.Mode == "ud" {
		sep = ":" // sic: ud_pingpong's local line
	}
	fmt.Fprintf(p.info, "  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x%s GID %s\n",
		p.my.LID, p.my.QPN, p.my.PSN, sep, gidString(p.my.GID))
	return nil
}

// connect is pp_connect_ctx: rc connects the QP to the peer's (RTR, RTS); ud moves its
// QP to RTS and makes the address handle.
func (p *pingpong) connect() error {
	c := p.cfg
	if c.Mode == "rc" {
		mtu, _ := verbs.MTUFromBytes(p.mtu)
		// A standard RoCEv2 peer (rxe, a NIC) sends each QP's packets from a UDP source
		// port of its own choosing, always to 4791; the exchange carries no port.
		err := p.qp.Connect(p.my.PSN, verbs.Endpoint{GID: p.rem.GID, Port: uint16(c.UDPPort), QPNum: p.rem.QPN,
			PSN: p.rem.PSN, AnySourcePort: true},
			verbs.ConnectOptions{MTU: mtu, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12,
				MaxRdAtomic: 1, NoRemoteAccess: true})
		if err != nil {
			return fmt.Errorf("couldn't connect to remote QP: %w", err)
		}
		return nil
	}
	if err := p.qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateRTR}, verbs.QPAttrState); err != nil {
		return fmt.Errorf("failed to modify QP to RTR: %w", err)
	}
	if err := p.qp.ModifyQP(&verbs.QPAttr{QPState: verbs.StateRTS, SQPSN: p.my.PSN}, verbs.QPAttrState|verbs.QPAttrSQPSN); err != nil {
		return fmt.Errorf("failed to modify QP to RTS: %w", err)
	}
	var err error
	p.ah, err = p.pd.CreateAH(&verbs.AHAttr{DGID: p.rem.GID, DestPort: uint16(c.UDPPort), IsGlobal: true,
		HopLimit: 64, SL: uint8(c.SL), PortNum: uint8(c.IBPort)})
	if err != nil {
		return fmt.Errorf("failed to create AH: %w", err)
	}
	p.sendWR[0].AH, p.sendWR[0].RemoteQPN, p.sendWR[0].RemoteQKey = p.ah, p.rem.QPN, udQKey
	return nil
}

// emptyPollsPerCheck is how many empty polls pass between looks at the context.
const emptyPollsPerCheck = 1 << 12

// loop is the C tools' main loop: the client sends first; each side sends again once its
// last send completed and a message arrived; receives are reposted when one is left.
func (p *pingpong) loop(ctx context.Context) (*Result, error) {
	c := p.cfg
	client := c.Server != ""
	pending := recvWRID
	// posts[i] is when the i-th send after the start was posted (ns since start): the
	// iterations' lengths.
	posts := make([]int64, 0, c.Iters)
	if client {
		if c.Check {
			for i := 0; i < c.Size; i += pageSize {
				// The C tools write i / page_size % sizeof(char) there: always 0.
				p.buf[p.payload+i] = 0
			}
		}
		if err := p.qp.PostSend(p.sendWR); err != nil {
			return nil, fmt.Errorf("couldn't post send: %w", err)
		}
		pending |= sendWRID
	}
	start := time.Now()
	if client {
		posts = append(posts, 0)
	}
	routs := c.RxDepth
	rcnt, scnt, bad := 0, 0, 0
	empty := 0
	for rcnt < c.Iters || scnt < c.Iters {
		if c.Events {
			evcq, err := p.ch.GetCQEvent(ctx)
			if err != nil {
				return nil, fmt.Errorf("failed to get cq_event: %w", err)
			}
			p.events++
			if evcq != p.cq {
				return nil, fmt.Errorf("CQ event for unknown CQ %p", evcq)
			}
			if err := p.cq.ReqNotifyCQ(false); err != nil {
				return nil, fmt.Errorf("couldn't request CQ notification: %w", err)
			}
		}
		ne := p.cq.PollCQ(p.wc[:])
		if ne == 0 && !c.Events {
			if empty++; empty%emptyPollsPerCheck == 0 && ctx.Err() != nil {
				return nil, fmt.Errorf("%w after %d of %d iterations (received %d, sent %d)", ctx.Err(), min(rcnt, scnt), c.Iters, rcnt, scnt)
			}
			continue
		}
		for i := range ne {
			wc := &p.wc[i]
			if wc.Status != verbs.WCSuccess {
				return nil, fmt.Errorf("failed status %v (%d) for wr_id %d (%v) after %d of %d iterations (received %d, sent %d)",
					wc.Status, int(wc.Status), wc.WRID, wc.VendorErr, min(rcnt, scnt), c.Iters, rcnt, scnt)
			}
			switch wc.WRID {
			case sendWRID:
				scnt++
			case recvWRID:
				if routs--; routs <= 1 {
					if err := p.qp.PostRecv(p.recvWRs[:c.RxDepth-routs]); err != nil {
						return nil, fmt.Errorf("couldn't post receive (%d): %w", routs, err)
					}
					routs = c.RxDepth
				}
				rcnt++
				if c.Check && !p.messageOK(wc) {
					bad++
				}
			default:
				return nil, fmt.Errorf("completion for unknown wr_id %d", wc.WRID)
			}
			pending &^= int(wc.WRID)
			if scnt < c.Iters && pending == 0 {
				if err := p.qp.PostSend(p.sendWR); err != nil {
					return nil, fmt.Errorf("couldn't post send: %w", err)
				}
				pending = recvWRID | sendWRID
				posts = append(posts, int64(time.Since(start)))
			}
		}
	}
	elapsed := time.Since(start)
	return p.result(elapsed, posts, bad), nil
}

// messageOK checks a received message: its length, and every byte against what a
// client with -c sends (the C tools' buffer: 0x7b, and 0 at the start of every page).
func (p *pingpong) messageOK(wc *verbs.WorkCompletion) bool {
	if int(wc.ByteLen) != p.payload+p.cfg.Size {
		return false
	}
	msg := p.buf[p.payload : p.payload+p.cfg.Size]
	for i, b := range msg {
		want := byte(fillByte)
		if i%pageSize == 0 {
			want = 0
		}
		if b != want {
			return false
		}
	}
	return true
}

func (p *pingpong) result(elapsed time.Duration, posts []int64, bad int) *Result {
	c := p.cfg
	usec := float64(elapsed.Nanoseconds()) / 1e3
	r := &Result{
		Test: c.toolName(), Role: "server", Local: p.my.address(), Remote: p.rem.address(),
		Size: c.Size, Iters: c.Iters, MTU: p.mtu, Events: c.Events,
		Bytes: int64(c.Size) * int64(c.Iters) * 2, Seconds: usec / 1e6, CQEvents: p.events,
	}
	if c.Server != "" {
		r.Role = "client"
	}
	r.Mbps = float64(r.Bytes) * 8 / usec
	r.UsecIt = usec / float64(c.Iters)
	r.BW = float64(r.Bytes) / elapsed.Seconds() / (1 << 20)
	if len(posts) > 2 {
		// One-way: half of each iteration after the first.
		samples := make([]int64, 0, len(posts)-1)
		for i := 1; i < len(posts)-1; i++ {
			samples = append(samples, (posts[i+1]-posts[i])/2)
		}
		samples = append(samples, (int64(elapsed)-posts[len(posts)-1])/2)
		r.Lat = perf.Summarize(samples)
	}
	if c.Check {
		r.Checked = true
		r.BadMessages = bad
		// The C tools' check, done by the server (the client's buffer holds the
		// server's echo of the same bytes, so the client checks too).
		for i := 0; i < c.Size; i += pageSize {
			if p.buf[p.payload+i] != 0 {
				r.InvalidPages = append(r.InvalidPages, i/pageSize)
			}
		}
	}
	if c.Stats {
		qc := p.qp.Counters()
		r.QP = &qc
	}
	return r
}

// destroyQP destroys the QP (once).
func (p *pingpong) destroyQP() {
	if p.qp != nil {
		if err := p.qp.DestroyQP(); err != nil {
			fmt.Fprintln(p.info, "  couldn't destroy QP:", err)
		}
		p.qp = nil
	}
}

// close is pp_close_ctx.
func (p *pingpong) close() {
	p.destroyQP()
	var errs []error
	if p.ah != nil {
		errs = append(errs, p.ah.DestroyAH())
	}
	if p.cq != nil {
		if p.events > 0 {
			p.cq.AckCQEvents(p.events)
		}
		errs = append(errs, p.cq.DestroyCQ())
	}
	if p.mr != nil {
		errs = append(errs, p.mr.DeregMR())
	}
	if p.pd != nil {
		errs = append(errs, p.pd.DeallocPD())
	}
	if p.ch != nil {
		errs = append(errs, p.ch.DestroyCompChannel())
	}
	if p.ownDev && p.dev != nil {
		errs = append(errs, p.dev.Close())
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(p.info, "  cleanup:", err)
	}
}
