package main

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
	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/verbs"
)

// rping's constants (librdmacm/examples/rping.c).
const (
	defaultPort = 7174
	defaultSize = 64
	// minSize is rping.c's RPING_MIN_BUFSIZE, sizeof(stringify(INT_MAX)) +
	// sizeof(RPING_MSG_FMT): INT_MAX is not expanded there, so 8 + 15.
	minSize = 23
	maxSize = 64*1024 - 1 // sizes up to RPING_BUFSIZE - 1
	sqDepth = 16          // RPING_SQ_DEPTH: send queue; the CQ has twice as many entries
	infoLen = 16          // struct rping_rdma_info: __be64 buf, __be32 rkey, __be32 size
	msgFmt  = "rdma-ping-%d: "
)

// Config is one run of rping: the C tool's options, and what tests set instead of
// opening a device.
type Config struct {
	Server     bool       // -s (else -c)
	Addr       netip.Addr // -a: the server's address (client), the address to bind (server)
	Source     netip.Addr // -I: the client's source address
	Port       int        // -p: rdma_cm port (7174)
	Count      int        // -C: pings (0: until interrupted)
	Size       int        // -S: ping data size (64)
	Verbose    bool       // -v: print the ping data
	Validate   bool       // -V: the client compares what came back with what it sent
	Debug      bool       // -d: progress lines
	Persistent bool       // -P: the server serves one connection after another, several at once
	// Local is the device: --dev-addr (default: -a for a server, -I or the route's source
	// for a client), --udp-port, --pcap, and what tests set instead.
	cmtool.Local
}

func (c *Config) defaults() {
	if c.Port == 0 {
		c.Port = defaultPort
	}
	if c.Size == 0 {
		c.Size = defaultSize
	}
	c.Local.Defaults()
}

func (c *Config) validate() error {
	if c.Size < minSize || c.Size > maxSize {
		return fmt.Errorf("invalid size %d (valid range is %d to %d)", c.Size, minSize, maxSize)
	}
	if c.Count < 0 {
		return fmt.Errorf("invalid count %d", c.Count)
	}
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("port %d out of range", c.Port)
	}
	if !c.Server && !c.Addr.IsValid() {
		return errors.New("a client needs the server's address: -a ADDR")
	}
	if c.Server && c.Device == nil && !c.DevAddr.IsValid() && (!c.Addr.IsValid() || c.Addr.IsUnspecified()) {
		return errors.New("a server needs an address to bind: -a ADDR or --dev-addr ADDR (a softrnic device is one IP address)")
	}
	return nil
}

// Result is one connection's outcome, and its JSON object with --json.
type Result struct {
	Tool     string `json:"tool"`
	Role     string `json:"role"`
	Local    string `json:"local"` // this device's address and UDP port
	Peer     string `json:"peer"`  // the peer device's address and UDP port
	Port     int    `json:"port"`  // rdma_cm port
	QPN      uint32 `json:"qpn"`
	PeerQPN  uint32 `json:"peer_qpn"`
	Count    int    `json:"count"` // pings asked for (client; 0: unbounded)
	Size     int    `json:"size"`
	Pings    int    `json:"pings"` // round trips completed
	Validate bool   `json:"validate"`
	// Mismatches counts pings whose data differed: on the client what came back from
	// what was sent (-V, as rping), on the server what it read from rping's pattern (-V,
	// a softrnic addition).
	Mismatches int     `json:"mismatches"`
	Seconds    float64 `json:"seconds"` // from the first ping to the last
	// Ended says how the connection ended: "disconnected" (this side), "disconnected by
	// the peer", or the error.
	Ended string `json:"ended"`
	Error string `json:"error,omitempty"`
	OK    bool   `json:"ok"`
	cmtool.Counters
	QP verbs.Counters `json:"qp"`
}

var errDisconnected = errors.New("disconnected by the peer")

// output is where a run writes: Out takes what rping prints on stdout (the ping data),
// Log what it prints on stderr; Emit gets each connection's result.
type output = cmtool.Output[*Result]

// run runs rping: a server serves one connection (or, -P, connections until ctx ends), a
// client pings. The error is the run's failure; each connection's result goes to o.emit.
func run(ctx context.Context, cfg *Config, o *output) error {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	// A server's device is at -a (validate saw that it is set), a client's at -I.
	bind := cfg.Source
	if cfg.Server {
		bind = cfg.Addr
	}
	dev, release, err := cfg.Open(bind, cfg.Addr, "rdma_resolve_addr")
	if err != nil {
		return err
	}
	defer release()
	if cfg.Debug {
		o.Printf("device %v\n", dev.Addr())
	}
	if cfg.Server {
		return runServer(ctx, cfg, dev, o)
	}
	return runClient(ctx, cfg, dev, o)
}

// session is one connection's verbs objects and buffers, as rping's control block.
type session struct {
	cfg  *Config
	o    *output
	dev  *verbs.Device
	pd   *verbs.PD
	ch   *verbs.CompChannel
	cq   *verbs.CQ
	qp   *verbs.QP
	w    *cmtool.Waiter
	conn *cm.Conn

	recvBuf, sendBuf   []byte // rping_rdma_info each
	rdmaBuf, startBuf  []byte // the RDMA sink/source; the client's start buffer
	recvMR, sendMR     *verbs.MR
	rdmaMR, startMR    *verbs.MR
	remoteAddr         uint64 // the peer's last advertisement
	remoteRKey, remLen uint32

	res Result
}

func (s *session) debugf(format string, a ...any) {
	if s.cfg.Debug {
		s.o.Printf(format, a...)
	}
}

// setup creates what rping_setup_qp and rping_setup_buffers do: a PD, a completion
// channel, a CQ of 2 x RPING_SQ_DEPTH armed on it, an RC QP (16 sends, 2 receives, one
// SGE each) in INIT, and the registered buffers; and posts the receive.
func (s *session) setup() error {
	var err error
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return fmt.Errorf("ibv_alloc_pd failed: %w", err)
	}
	if s.ch, err = s.dev.CreateCompChannel(); err != nil {
		return fmt.Errorf("ibv_create_comp_channel failed: %w", err)
	}
	if s.cq, err = s.dev.CreateCQ(2*sqDepth, s.ch, 0); err != nil {
		return fmt.Errorf("ibv_create_cq failed: %w", err)
	}
	s.w = cmtool.NewWaiter(s.cq)
	if s.qp, err = s.pd.CreateQP(&verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, QPType: verbs.QPTypeRC,
		Cap: verbs.QPCap{MaxSendWR: sqDepth, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return fmt.Errorf("rdma_create_qp: %w", err)
	}
	if err := cm.InitQP(s.qp, verbs.ConnectOptions{}.WithDefaults().Access); err != nil {
		return fmt.Errorf("rdma_create_qp: %w", err)
	}
	s.debugf("created pd, cq and qp %#x\n", s.qp.QPNum())
	remote := verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	reg := func(buf []byte, access verbs.AccessFlags, what string) (*verbs.MR, error) {
		mr, err := s.pd.RegMR(buf, access)
		if err != nil {
			return nil, fmt.Errorf("%s reg_mr failed: %w", what, err)
		}
		return mr, nil
	}
	s.recvBuf, s.sendBuf = make([]byte, infoLen), make([]byte, infoLen)
	if s.recvMR, err = reg(s.recvBuf, verbs.AccessLocalWrite, "recv_buf"); err != nil {
		return err
	}
	if s.sendMR, err = reg(s.sendBuf, 0, "send_buf"); err != nil {
		return err
	}
	s.rdmaBuf = make([]byte, s.cfg.Size)
	if s.rdmaMR, err = reg(s.rdmaBuf, remote, "rdma_buf"); err != nil {
		return err
	}
	if !s.cfg.Server {
		s.startBuf = make([]byte, s.cfg.Size)
		if s.startMR, err = reg(s.startBuf, remote, "start_buf"); err != nil {
			return err
		}
	}
	s.debugf("allocated & registered buffers...\n")
	return s.postRecv()
}

func (s *session) postRecv() error {
	if err := s.qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{s.recvMR.SGE(0, infoLen)}}}); err != nil {
		return fmt.Errorf("post recv error: %w", err)
	}
	return nil
}

// free destroys what setup created.
func (s *session) free() {
	if s.qp != nil {
		s.qp.DestroyQP()
	}
	for _, mr := range []*verbs.MR{s.recvMR, s.sendMR, s.rdmaMR, s.startMR} {
		if mr != nil {
			mr.DeregMR()
		}
	}
	if s.cq != nil {
		s.cq.DestroyCQ()
	}
	if s.ch != nil {
		s.ch.DestroyCompChannel()
	}
	if s.pd != nil {
		s.pd.DeallocPD()
	}
}

// await waits for the completion of kind want, as rping's CQ thread and semaphore do:
// SEND completions pass by, a RECV (the peer's advertisement, 16 bytes) is recorded and
// its receive posted again, a flush means the connection ended (errDisconnected once the
// connection manager says so), any other status fails the run.
func (s *session) await(ctx context.Context, want verbs.WCOpcode) error {
	for {
		wc, err := s.w.Next(ctx)
		if err != nil {
			return s.why(err)
		}
		if wc.Status != verbs.WCSuccess {
			if wc.Status == verbs.WCWRFlushErr {
				// The QP went to ERR: the connection is ending (the connection manager
				// moves the QP before it ends the connection).
				select {
				case <-s.conn.Done():
				case <-ctx.Done():
				}
				return s.why(ctx.Err())
			}
			return fmt.Errorf("cq completion failed status %d (%v, %v)", int(wc.Status), wc.Status, wc.VendorErr)
		}
		switch wc.Opcode {
		case verbs.WCSend:
			s.debugf("send completion\n")
			continue
		case verbs.WCRecv:
			s.debugf("recv completion\n")
			if wc.ByteLen != infoLen {
				return fmt.Errorf("received bogus data, size %d", wc.ByteLen)
			}
			s.remoteAddr = binary.BigEndian.Uint64(s.recvBuf)
			s.remoteRKey = binary.BigEndian.Uint32(s.recvBuf[8:])
			s.remLen = binary.BigEndian.Uint32(s.recvBuf[12:])
			if err := s.postRecv(); err != nil {
				return err
			}
		case verbs.WCRDMARead:
			s.debugf("rdma read completion\n")
		case verbs.WCRDMAWrite:
			s.debugf("rdma write completion\n")
		default:
			return fmt.Errorf("unknown completion %v", wc.Opcode)
		}
		if wc.Opcode != want {
			return fmt.Errorf("got a %v completion waiting for %v", wc.Opcode, want)
		}
		return nil
	}
}

// why returns errDisconnected if the connection ended, else err.
func (s *session) why(err error) error {
	select {
	case <-s.conn.Done():
		return errDisconnected
	default:
		return err
	}
}

// post posts one signaled work request.
func (s *session) post(wr verbs.SendWR) error {
	wr.SendFlags |= verbs.SendSignaled
	if err := s.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		return fmt.Errorf("post send error: %w", err)
	}
	return nil
}

// sendInfo SENDs the 16-byte advertisement of mr (rping_format_send: its address and
// rkey, and this side's size), or, with mr nil, the server's go-ahead (its send buffer,
// which rping never fills).
func (s *session) sendInfo(mr *verbs.MR) error {
	if mr != nil {
		binary.BigEndian.PutUint64(s.sendBuf, mr.Addr())
		binary.BigEndian.PutUint32(s.sendBuf[8:], mr.RKey())
		binary.BigEndian.PutUint32(s.sendBuf[12:], uint32(s.cfg.Size))
		s.debugf("RDMA addr %x rkey %x len %d\n", mr.Addr(), mr.RKey(), s.cfg.Size)
	}
	return s.post(verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SGList: []verbs.SGE{s.sendMR.SGE(0, infoLen)}})
}

func (s *session) finish(err error) *Result {
	r := &s.res
	r.Tool = "rping"
	r.Role = "client"
	if s.cfg.Server {
		r.Role = "server"
	}
	r.Local = s.dev.Addr().String()
	r.Port, r.Size, r.Validate = s.cfg.Port, s.cfg.Size, s.cfg.Validate
	if !s.cfg.Server {
		r.Count = s.cfg.Count
	}
	if s.qp != nil {
		r.QPN = s.qp.QPNum()
		r.QP = s.qp.Counters()
		r.QP.Queues = nil
	}
	if s.conn != nil {
		r.Peer, r.PeerQPN = s.conn.RemoteAddr().String(), s.conn.RemoteQPN()
	}
	r.Counters = cmtool.Read(s.dev)
	switch {
	case errors.Is(err, errDisconnected):
		r.Ended = errDisconnected.Error()
		err = nil
	case err == nil:
		r.Ended = "disconnected"
	default:
		r.Ended = err.Error()
	}
	if err == nil && r.Mismatches > 0 {
		err = errors.New("data mismatch")
	}
	if err != nil {
		r.Error = err.Error()
	}
	r.OK = err == nil
	return r
}

// fillPing writes ping number ping into buf as rping_test_client does: "rdma-ping-N: "
// (snprintf: at most len(buf)-1 bytes and a NUL), then letters from start, 'A'..'z'
// round and round, and a NUL in the last byte.
func fillPing(buf []byte, ping int, start byte) {
	s := fmt.Sprintf(msgFmt, ping)
	n := copy(buf[:len(buf)-1], s)
	buf[n] = 0
	c := start
	for i := len(s); i < len(buf); i++ {
		buf[i] = c
		c++
		if c > 122 {
			c = 65
		}
	}
	buf[len(buf)-1] = 0
}

// nextStart is the first letter of the next ping's data.
func nextStart(start byte) byte {
	if start++; start > 122 {
		start = 65
	}
	return start
}

// cstring is buf up to its first NUL, as printf's %s reads it.
func cstring(buf []byte) []byte {
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		return buf[:i]
	}
	return buf
}

// runClient connects, pings cfg.Count times (rping_test_client) and disconnects.
func runClient(ctx context.Context, cfg *Config, dev *verbs.Device, o *output) error {
	s := &session{cfg: cfg, o: o, dev: dev}
	defer s.free()
	r := s.finish(s.client(ctx))
	o.Result(r)
	if !r.OK {
		return fmt.Errorf("rping client failed: %s", r.Error)
	}
	return nil
}

func (s *session) client(ctx context.Context) error {
	cfg := s.cfg
	if err := s.setup(); err != nil {
		return err
	}
	remote := netip.AddrPortFrom(cfg.Addr, uint16(cfg.Port))
	// rping_init_conn_param: responder resources and initiator depth 1, retry and RNR
	// retry counts 7; the ACK timeout rdma_cm gives a RoCE QP.
	conn, err := cm.Dial(ctx, s.dev, remote, s.qp, &cm.DialParams{DevicePort: uint16(cfg.PeerPort),
		Options: verbs.ConnectOptions{MaxRdAtomic: 1, RetryCnt: 7, RNRRetry: 7, Timeout: cmtool.RDMACMAckTimeout}})
	if err != nil {
		return fmt.Errorf("connect error: %w", err)
	}
	s.conn = conn
	s.debugf("rdma_connect successful\n")
	cctx, cancel := cmtool.ConnContext(ctx, s.conn.Done())
	defer cancel()
	err = s.pingLoop(cctx)
	if errors.Is(err, errDisconnected) {
		s.o.Logf("client DISCONNECT EVENT...\n")
		return errDisconnected
	}
	if ctx.Err() != nil && cfg.Count == 0 {
		err = nil // an unbounded run ends when interrupted
	}
	derr := conn.Disconnect()
	s.o.Logf("client DISCONNECT EVENT...\n")
	if err == nil && derr != nil {
		err = fmt.Errorf("rdma_disconnect: %w", derr)
	}
	return err
}

func (s *session) pingLoop(ctx context.Context) error {
	cfg := s.cfg
	start := byte(65)
	var t0 time.Time
	for ping := 0; cfg.Count == 0 || ping < cfg.Count; ping++ {
		if ping == 0 {
			t0 = time.Now()
		}
		fillPing(s.startBuf, ping, start)
		start = nextStart(start)
		if err := s.sendInfo(s.startMR); err != nil {
			return err
		}
		// Wait for the server's go-ahead: it has read the start buffer.
		if err := s.await(ctx, verbs.WCRecv); err != nil {
			return err
		}
		if err := s.sendInfo(s.rdmaMR); err != nil {
			return err
		}
		// Wait for the server to say the RDMA WRITE is complete.
		if err := s.await(ctx, verbs.WCRecv); err != nil {
			return err
		}
		if cfg.Validate && !bytes.Equal(s.startBuf, s.rdmaBuf) {
			s.o.Logf("data mismatch!\n")
			s.res.Mismatches++
			return errors.New("data mismatch")
		}
		s.res.Pings++
		s.res.Seconds = time.Since(t0).Seconds()
		if cfg.Verbose {
			s.o.Printf("ping data: %s\n", cstring(s.rdmaBuf))
		}
	}
	return nil
}

// runServer listens; it serves one connection, or with -P connections until ctx ends.
func runServer(ctx context.Context, cfg *Config, dev *verbs.Device, o *output) error {
	l, err := cm.Listen(dev, uint16(cfg.Port))
	if err != nil {
		return fmt.Errorf("rdma_listen: %w", err)
	}
	defer l.Close()
	// Scripts wait for this line before they start a client.
	o.Logf("rping: listening on %v (device %v)\n", l.Addr(), dev.Addr())
	if cfg.Listening != nil {
		cfg.Listening(l.Addr())
	}
	if !cfg.Persistent {
		req, err := l.Accept(ctx)
		if err != nil {
			return err
		}
		l.Close() // one connection, as rping without -P
		r := serve(ctx, cfg, dev, o, req)
		if !r.OK {
			return fmt.Errorf("rping server failed: %s", r.Error)
		}
		return nil
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		req, err := l.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil // a persistent server ends when interrupted
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := serve(ctx, cfg, dev, o, req); !r.OK {
				o.Logf("rping server: connection from %v failed: %s\n", req.Remote, r.Error)
			}
		}()
	}
}

// serve answers one connection request and serves it until the client disconnects.
func serve(ctx context.Context, cfg *Config, dev *verbs.Device, o *output, req *cm.Request) *Result {
	s := &session{cfg: cfg, o: o, dev: dev}
	defer s.free()
	s.debugf("child cma: request from %v qpn %#x\n", req.Remote, req.RemoteQPN)
	err := s.server(ctx, req)
	r := s.finish(err)
	o.Result(r)
	return r
}

func (s *session) server(ctx context.Context, req *cm.Request) error {
	if err := s.setup(); err != nil {
		req.Reject(nil)
		return fmt.Errorf("setup_qp failed: %w", err)
	}
	// rdma_accept(NULL): the requester's responder resources and initiator depth (within
	// the device's), retry and RNR retry counts 7; the ACK timeout rdma_cm gives a RoCE QP.
	conn, err := req.Accept(s.qp, &cm.AcceptParams{Options: verbs.ConnectOptions{RetryCnt: 7, RNRRetry: 7, Timeout: cmtool.RDMACMAckTimeout}})
	if err != nil {
		return fmt.Errorf("connect error: %w", err)
	}
	s.conn = conn
	s.debugf("accepted: connected to %v qpn %#x\n", conn.RemoteAddr(), conn.RemoteQPN())
	cctx, cancel := cmtool.ConnContext(ctx, s.conn.Done())
	defer cancel()
	err = s.serveLoop(cctx)
	if errors.Is(err, errDisconnected) {
		s.o.Logf("server DISCONNECT EVENT...\n")
		return errDisconnected
	}
	if ctx.Err() != nil && s.cfg.Persistent {
		err = nil // a persistent server ends when interrupted
	}
	if derr := conn.Disconnect(); err == nil && derr != nil {
		err = fmt.Errorf("rdma_disconnect: %w", derr)
	}
	return err
}

// serveLoop is rping_test_server: READ the client's start buffer, go-ahead, WRITE it back
// into the client's rdma buffer, go-ahead, until the client disconnects.
func (s *session) serveLoop(ctx context.Context) error {
	start := byte(65)
	var t0 time.Time
	for ping := 0; ; ping++ {
		// Wait for the client's start buffer address, rkey and length.
		if err := s.await(ctx, verbs.WCRecv); err != nil {
			return err
		}
		if ping == 0 {
			t0 = time.Now()
		}
		s.debugf("Received rkey %x addr %x len %d from peer\n", s.remoteRKey, s.remoteAddr, s.remLen)
		if int(s.remLen) > len(s.rdmaBuf) {
			return fmt.Errorf("post send error: the client's %d bytes do not fit the %d-byte rdma buffer (-S)", s.remLen, len(s.rdmaBuf))
		}
		if err := s.post(verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMARead, SGList: []verbs.SGE{s.rdmaMR.SGE(0, int(s.remLen))},
			RemoteAddr: s.remoteAddr, RKey: s.remoteRKey}); err != nil {
			return err
		}
		s.debugf("server posted rdma read req\n")
		if err := s.await(ctx, verbs.WCRDMARead); err != nil {
			return err
		}
		s.debugf("server received read complete\n")
		if s.cfg.Verbose {
			s.o.Printf("server ping data: %s\n", cstring(s.rdmaBuf))
		}
		if s.cfg.Validate && s.remLen > 0 {
			want := make([]byte, s.remLen)
			fillPing(want, ping, start)
			if !bytes.Equal(want, s.rdmaBuf[:s.remLen]) {
				s.o.Logf("data mismatch! ping %d read %q\n", ping, cstring(s.rdmaBuf))
				s.res.Mismatches++
			}
		}
		start = nextStart(start)
		// Tell the client to continue.
		if err := s.sendInfo(nil); err != nil {
			return err
		}
		s.debugf("server posted go ahead\n")
		// Wait for the client's rdma buffer address, rkey and length.
		if err := s.await(ctx, verbs.WCRecv); err != nil {
			return err
		}
		s.debugf("server received sink adv\n")
		// RDMA WRITE the data back: strlen(rdma_buf) + 1 bytes.
		n := len(cstring(s.rdmaBuf)) + 1
		n = min(n, len(s.rdmaBuf))
		if err := s.post(verbs.SendWR{WRID: 4, Opcode: verbs.WRRDMAWrite, SGList: []verbs.SGE{s.rdmaMR.SGE(0, n)},
			RemoteAddr: s.remoteAddr, RKey: s.remoteRKey}); err != nil {
			return err
		}
		s.debugf("rdma write from lkey %x laddr %x len %d\n", s.rdmaMR.LKey(), s.rdmaMR.Addr(), n)
		if err := s.await(ctx, verbs.WCRDMAWrite); err != nil {
			return err
		}
		s.debugf("server rdma write complete\n")
		// Tell the client to begin again.
		if err := s.sendInfo(nil); err != nil {
			return err
		}
		s.debugf("server posted go ahead\n")
		s.res.Pings++
		s.res.Seconds = time.Since(t0).Seconds()
	}
}
