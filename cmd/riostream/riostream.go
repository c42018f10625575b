package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/internal/streamtool"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// iomapSize is the iomap table riostream offers the peer on every rsocket
// (RDMA_IOMAPSIZE): one entry, for the transfer buffer of the test under way.
const iomapSize = 1

// Config is one run of riostream: the C tool's options, softrnic's, and what tests set
// instead of opening a device.
type Config struct {
	ServerAddr netip.Addr // -s: the server to connect to (a client); unset: be the server
	Bind       netip.Addr // -b: the server's address
	Port       int        // -p (7471)
	// Buffer is -B: the SO_SNDBUF and SO_RCVBUF riostream sets (0: 1<<19). An rsocket's
	// receive ring and send buffer are twice that, as rsockets double the value.
	Buffer int
	Inline int // -i: the inline size of the latency tests (64)
	// Custom is one test of Size bytes, Count transfers each way per iteration and Iters
	// iterations, on one connection (-S size, -C, -I); otherwise the size sets.
	Custom             bool
	Size, Count, Iters int
	AllSizes           bool // -S all: every size of the table, not only the core ones
	Verify             bool // -T v
	BusyPoll           time.Duration
	// CountFor, if set, replaces the tools' counts (tests: short runs of the size sets).
	CountFor func(size int) int
	// Local is the device: --dev-addr (default -b; a client's: the route's source),
	// --udp-port, --pcap, and what tests set instead.
	cmtool.Local
}

func (c *Config) client() bool { return c.ServerAddr.IsValid() }

func (c *Config) defaults() {
	if c.Buffer == 0 {
		c.Buffer = streamtool.DefaultBuffer
	}
	if c.Inline == 0 {
		c.Inline = streamtool.DefaultInline
	}
	if c.Custom {
		if c.Size == 0 {
			c.Size = streamtool.DefaultSize
		}
		if c.Count == 0 {
			c.Count = streamtool.DefaultCount
		}
		if c.Iters == 0 {
			c.Iters = streamtool.DefaultIters
		}
	}
	c.Local.Defaults()
}

func (c *Config) validate() error {
	switch {
	case c.Port < 1 || c.Port > 65535:
		return fmt.Errorf("port %d out of range", c.Port)
	case c.Custom && (c.Size < 1 || c.Count < 1 || c.Iters < 1):
		return fmt.Errorf("-S %d -C %d -I %d: each at least 1", c.Size, c.Count, c.Iters)
	case c.Buffer < 1 || c.Buffer > 1<<29:
		return fmt.Errorf("-B %d: want 1..%d", c.Buffer, 1<<29)
	case c.Inline < 0:
		return fmt.Errorf("-i %d: negative", c.Inline)
	case !c.client() && c.Device == nil && !c.DevAddr.IsValid() && (!c.Bind.IsValid() || c.Bind.IsUnspecified()):
		return errors.New("an rsocket server needs an address to bind: -b ADDR or --dev-addr ADDR (a softrnic device is one IP address)")
	}
	return nil
}

func (c *Config) plan() streamtool.Plan {
	return streamtool.Plan{Custom: c.Custom, Size: c.Size, Count: c.Count, Iters: c.Iters, AllSizes: c.AllSizes, CountFor: c.CountFor}
}

// options are a connection's rsocket options: an iomap table of one entry, rings of
// twice -B, and the inline size of the tuning (a send-side choice the wire does not
// show: the least rsockets take for the bandwidth set, where riostream asks for none).
func (c *Config) options(tune streamtool.Tuning) rsocket.Options {
	o := rsocket.Options{RecvBuffer: 2 * c.Buffer, SendBuffer: 2 * c.Buffer, IOMapSize: iomapSize,
		Ordering: verbs.OrderingOrdered, BusyPoll: c.BusyPoll}
	switch tune {
	case streamtool.TuneLatency:
		o.InlineSize = max(c.Inline, 1)
	case streamtool.TuneBandwidth:
		o.InlineSize = 1 // raised to the least an rsocket takes
	}
	return o
}

// Result is one test's outcome: a line of riostream's table, and its JSON object with
// --json.
type Result = streamtool.Result

// output is where a run writes: Out takes riostream's table (stdout), Log its errors
// and notes (stderr), Emit each result.
type output = cmtool.Output[*Result]

// A role is how a side makes its connections and which way it moves first: the client
// dials and writes first, the server accepts and answers.
type role interface {
	connect(ctx context.Context, tune streamtool.Tuning) (*rsocket.Conn, error)
	name() string
	leads() bool
}

type client struct {
	cfg *Config
	dev *verbs.Device
}

func (c *client) connect(ctx context.Context, tune streamtool.Tuning) (*rsocket.Conn, error) {
	d := rsocket.Dialer{Options: c.cfg.options(tune), DevicePort: uint16(c.cfg.PeerPort)}
	return d.Dial(ctx, c.dev, netip.AddrPortFrom(c.cfg.ServerAddr, uint16(c.cfg.Port)))
}
func (c *client) name() string { return "client" }
func (c *client) leads() bool  { return true }

// server accepts on one listener, which gives every connection its options: those of
// the run's first connection (the phases differ only in the inline size).
type server struct{ l *rsocket.Listener }

func (s *server) connect(ctx context.Context, _ streamtool.Tuning) (*rsocket.Conn, error) {
	stop := context.AfterFunc(ctx, func() { s.l.Close() })
	defer stop()
	c, err := s.l.AcceptRsocket()
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return c, err
}
func (s *server) name() string { return "server" }
func (s *server) leads() bool  { return false }

// run runs riostream: as a client if cfg has a server address, else as a server.
func run(ctx context.Context, cfg *Config, o *output) error {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	var bind netip.Addr // -b 0.0.0.0 binds no device: a client's is then the route's
	if !cfg.Bind.IsUnspecified() {
		bind = cfg.Bind
	}
	dev, release, err := cfg.Open(bind, cfg.ServerAddr, "riostream: getaddrinfo")
	if err != nil {
		return err
	}
	defer release()
	phases := cfg.plan().Phases()
	var r role
	if cfg.client() {
		r = &client{cfg: cfg, dev: dev}
	} else {
		tune := streamtool.TuneLatency
		if cfg.Custom {
			tune = streamtool.TuneMixed
		}
		l, err := (&rsocket.ListenConfig{Options: cfg.options(tune)}).Listen(dev, uint16(cfg.Port))
		if err != nil {
			return err
		}
		defer l.Close()
		if cfg.Listening != nil {
			cfg.Listening(l.Addr().(*rsocket.Addr).AddrPort)
		}
		r = &server{l: l}
	}
	s := &session{cfg: cfg, dev: dev, role: r, o: o, buf: newBuffer(max(streamtool.MaxSize(phases), streamtool.SyncSize))}
	if cfg.Verify {
		s.pat = &streamtool.Pattern{}
	}
	o.Printf("%s", streamtool.Header())
	for i, p := range phases {
		if err := s.runPhase(ctx, i+1, p); err != nil {
			return err
		}
	}
	return nil
}

// session is a run under way: the one buffer, which each test maps for the peer and
// writes from, and the pattern of -T v, which runs on across the run's tests.
type session struct {
	cfg  *Config
	dev  *verbs.Device
	role role
	o    *output
	buf  *buffer
	pat  *streamtool.Pattern // nil without -T v
}

// runPhase makes a connection, runs a phase's tests on it, then closes it (riostream's
// shutdown of both directions, then close).
func (s *session) runPhase(ctx context.Context, conn int, p streamtool.Phase) (err error) {
	c, err := s.role.connect(ctx, p.Tune)
	if err != nil {
		return err
	}
	// An interrupt or --timeout wakes a transfer that waits in the stream.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		stop()
		if cerr := c.Close(); err == nil && cerr != nil && ctx.Err() == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
		if err != nil && ctx.Err() != nil {
			err = ctx.Err()
		}
	}()
	for _, t := range p.Tests {
		r, err := s.runTest(ctx, c, t)
		if err != nil {
			return fmt.Errorf("%s: %w", t.Name, err)
		}
		r.Connection = conn
		s.o.Printf("%s", r.Row())
		s.o.Result(r)
	}
	return nil
}

// runTest runs one test on c as riostream's run_test: the buffer's first t.Size bytes
// mapped for the peer at offset 0 (riomap), its last byte set to 0xff, which no marker
// of the first iteration is; the 16-byte exchange in the stream (the client sends, the
// server answers), which also says the peer's mapping has come; then per iteration the
// client writes the buffer into the server's t.Count times (riowrite), the last time
// with its marker in the last byte, and waits for the server's marker in its own
// buffer, and the server the mirror image. The markers count up from 0, one per
// message. With -T v the bytes before the marker of each iteration's last write are the
// pattern's next ones, checked once the marker is seen. Only the iterations are timed;
// the buffer is unmapped after them (riounmap).
func (s *session) runTest(ctx context.Context, c *rsocket.Conn, t streamtool.Test) (*Result, error) {
	buf := s.buf.b[:t.Size]
	last := t.Size - 1
	buf[last] = 0xff
	m, err := c.IOMap(buf, 0)
	if err != nil {
		return nil, err
	}
	defer func() {
		if m != nil {
			m.Close() // a test that failed: the connection ends too
		}
	}()
	sync := [2]func() error{func() error { return s.send(c) }, func() error { return s.recv(c) }}
	if !s.role.leads() {
		sync[0], sync[1] = sync[1], sync[0]
	}
	for _, step := range sync {
		if err := step(); err != nil {
			return nil, fmt.Errorf("sync: %w", err)
		}
	}
	var marker byte
	write := func() error {
		for range t.Count - 1 {
			if err := s.write(c, buf); err != nil {
				return err
			}
		}
		buf[last] = marker
		marker++
		if s.pat != nil {
			s.pat.Fill(buf[:last])
		}
		return s.write(c, buf)
	}
	wait := func() error {
		if err := s.buf.waitMarker(ctx, last, marker); err != nil {
			return err
		}
		marker++
		if s.pat != nil {
			return s.pat.Check(buf[:last])
		}
		return nil
	}
	first, then := wait, write
	if s.role.leads() {
		first, then = write, wait
	}
	clock := streamtool.Start()
	for range t.Iters {
		if err := first(); err != nil {
			return nil, err
		}
		if err := then(); err != nil {
			return nil, err
		}
	}
	r := &Result{Tool: "riostream", Test: t.Name, Transport: "rsocket", Role: s.role.name(),
		Size: t.Size, Xfers: t.Count, Iters: t.Iters, Verified: s.pat != nil}
	clock.Stop(r)
	st := c.Stats()
	r.Rsocket = &st
	r.Ordering = c.Ordering().String()
	counters := cmtool.Read(s.dev)
	r.Counters = &counters
	err = m.Close()
	m = nil
	if err != nil {
		return nil, fmt.Errorf("unmap: %w", err)
	}
	return r, nil
}

// write writes b into the peer's mapping at offset 0 (riostream's send_xfer).
func (s *session) write(c *rsocket.Conn, b []byte) error {
	_, err := c.IOWrite(b, 0)
	return err
}

// send and recv are the sync's 16 bytes, in the stream, through the buffer's first
// bytes (riostream's send_msg and recv_msg; what they carry is not checked).
func (s *session) send(c *rsocket.Conn) error {
	_, err := c.Write(s.buf.b[:streamtool.SyncSize])
	return err
}

func (s *session) recv(c *rsocket.Conn) error {
	if _, err := io.ReadFull(c, s.buf.b[:streamtool.SyncSize]); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return fmt.Errorf("the peer closed the connection: %w", io.ErrUnexpectedEOF)
		}
		return err
	}
	return nil
}
