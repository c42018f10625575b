package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/internal/streamtool"
	"github.com/softrnic/softrnic/verbs"
)

// rstream's defaults (librdmacm/examples/rstream.c), and riostream's.
const (
	defaultPort   = streamtool.DefaultPort
	defaultBuffer = streamtool.DefaultBuffer
	defaultInline = streamtool.DefaultInline
	syncSize      = streamtool.SyncSize
)

// Config is one run of rstream: the C tool's options, softrnic's, and what tests set
// instead of opening a device.
type Config struct {
	ServerAddr netip.Addr // -s: the server to connect to (a client); unset: be the server
	Bind       netip.Addr // -b: the server's address; a client's source address
	Port       int        // -p (7471); 0 with -T s: an ephemeral port
	// Buffer is -B: the SO_SNDBUF and SO_RCVBUF rstream sets (0: 1<<19). An rsocket's
	// receive ring and send buffer are twice that, as rsockets double the value.
	Buffer int
	Inline int // -i: the inline size of the latency tests (64)
	// Custom is one test of Size bytes, Count transfers each way per iteration and Iters
	// iterations, on one connection (-S size, -C, -I); otherwise the size sets.
	Custom             bool
	Size, Count, Iters int
	AllSizes           bool // -S all: every size of rstream's table, not only the core ones
	KeepAlive          int  // -k seconds (0: off)
	Sockets            bool // -T s: the kernel's TCP (Go's net package) instead of rsockets
	Verify             bool // -T v
	Ordering           verbs.Ordering
	BusyPoll           time.Duration // rsocket.Options.BusyPoll (0: its default; negative: none)
	NoDelay            bool          // rsocket.Options.NoDelay
	// CountFor, if set, replaces the tools' counts (tests: short runs of the size sets).
	CountFor func(size int) int
	// Local is the device: --dev-addr (default -b; a client's: the route's source),
	// --udp-port, --pcap, and what tests set instead.
	cmtool.Local
}

// plan is what the command line asks for: a custom test, or the size sets.
func (c *Config) plan() streamtool.Plan {
	return streamtool.Plan{Custom: c.Custom, Size: c.Size, Count: c.Count, Iters: c.Iters, AllSizes: c.AllSizes, CountFor: c.CountFor}
}

func (c *Config) client() bool { return c.ServerAddr.IsValid() }

func (c *Config) defaults() {
	if c.Buffer == 0 {
		c.Buffer = defaultBuffer
	}
	if c.Inline == 0 {
		c.Inline = defaultInline
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
	case c.Port < 0 || c.Port > 65535 || c.Port == 0 && !c.Sockets:
		return fmt.Errorf("port %d out of range", c.Port)
	case c.Custom && (c.Size < 1 || c.Count < 1 || c.Iters < 1):
		return fmt.Errorf("-S %d -C %d -I %d: each at least 1", c.Size, c.Count, c.Iters)
	case c.Buffer < 1 || c.Buffer > 1<<29:
		return fmt.Errorf("-B %d: want 1..%d", c.Buffer, 1<<29)
	case c.Inline < 0:
		return fmt.Errorf("-i %d: negative", c.Inline)
	case c.KeepAlive < 0:
		return fmt.Errorf("-k %d: negative", c.KeepAlive)
	case !c.Sockets && !c.client() && c.Device == nil && !c.DevAddr.IsValid() && (!c.Bind.IsValid() || c.Bind.IsUnspecified()):
		return errors.New("an rsocket server needs an address to bind: -b ADDR or --dev-addr ADDR (a softrnic device is one IP address)")
	}
	return nil
}

// Result is one test's outcome: a line of rstream's table, and its JSON object with
// --json.
type Result = streamtool.Result

// output is where a run writes: Out takes rstream's table (stdout), Log its errors and
// notes (stderr), Emit each result.
type output = cmtool.Output[*Result]

// run runs rstream: as a client if cfg has a server address, else as a server.
func run(ctx context.Context, cfg *Config, o *output) error {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	var tr transport
	if cfg.Sockets {
		tr = &tcpTransport{cfg: cfg}
	} else {
		var bind netip.Addr // -b 0.0.0.0 binds no device: a client's is then the route's
		if !cfg.Bind.IsUnspecified() {
			bind = cfg.Bind
		}
		dev, release, err := cfg.Open(bind, cfg.ServerAddr, "rstream: getaddrinfo")
		if err != nil {
			return err
		}
		defer release()
		tr = &rsocketTransport{cfg: cfg, dev: dev}
	}
	var end endpoint
	if cfg.client() {
		end = &client{tr: tr}
	} else {
		l, err := tr.listen(ctx)
		if err != nil {
			return err
		}
		defer l.Close()
		if cfg.Listening != nil {
			cfg.Listening(l.addr())
		}
		end = &server{l: l}
	}
	phases := cfg.plan().Phases()
	s := &session{cfg: cfg, tr: tr, end: end, o: o, buf: make([]byte, max(streamtool.MaxSize(phases), syncSize))}
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

// An endpoint makes a run's connections: a client dials, a server accepts. The client
// moves each test's bytes first; the server answers.
type endpoint interface {
	connect(ctx context.Context, tune streamtool.Tuning) (net.Conn, error)
	role() string
	// leads says whether this side sends first.
	leads() bool
}

type client struct{ tr transport }

func (c *client) connect(ctx context.Context, tune streamtool.Tuning) (net.Conn, error) {
	return c.tr.dial(ctx, tune)
}
func (c *client) role() string { return "client" }
func (c *client) leads() bool  { return true }

type server struct{ l listener }

func (s *server) connect(ctx context.Context, _ streamtool.Tuning) (net.Conn, error) {
	return s.l.accept(ctx)
}
func (s *server) role() string { return "server" }
func (s *server) leads() bool  { return false }

// session is a run under way: the buffer every transfer goes through, as rstream has
// one, and the pattern of -T v, which runs on across the run's connections.
type session struct {
	cfg *Config
	tr  transport
	end endpoint
	o   *output
	buf []byte
	pat *streamtool.Pattern // nil without -T v
}

// runPhase makes a connection, runs a phase's tests on it, then closes it (rstream's
// shutdown of both directions, then close).
func (s *session) runPhase(ctx context.Context, conn int, p streamtool.Phase) (err error) {
	c, err := s.end.connect(ctx, p.Tune)
	if err != nil {
		return err
	}
	if s.cfg.KeepAlive > 0 {
		s.o.Printf("Keepalive: ON\n  time: %d\n", s.cfg.KeepAlive)
	}
	// An interrupt or --timeout wakes the transfer that waits.
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
		r, err := s.runTest(c, t)
		if err != nil {
			return fmt.Errorf("%s: %w", t.Name, err)
		}
		r.Connection = conn
		s.o.Printf("%s", r.Row())
		s.o.Result(r)
	}
	return nil
}

// runTest runs one test on c as rstream's run_test: the 16-byte exchange (the client
// sends, the server answers), then per iteration the client's transfers and the
// server's as many back. Only the iterations are timed.
func (s *session) runTest(c net.Conn, t streamtool.Test) (*Result, error) {
	send, recv := s.send, s.recv
	first, then := recv, send
	if s.end.leads() {
		first, then = send, recv
	}
	if err := first(c, syncSize); err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	if err := then(c, syncSize); err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	clock := streamtool.Start()
	for range t.Iters {
		for range t.Count {
			if err := first(c, t.Size); err != nil {
				return nil, err
			}
		}
		for range t.Count {
			if err := then(c, t.Size); err != nil {
				return nil, err
			}
		}
	}
	r := &Result{Tool: "rstream", Test: t.Name, Transport: s.tr.name(), Role: s.end.role(),
		Size: t.Size, Xfers: t.Count, Iters: t.Iters, Verified: s.pat != nil}
	clock.Stop(r)
	s.tr.describe(c, r)
	return r, nil
}

// send sends n bytes of the buffer (the next n of the pattern with -T v).
func (s *session) send(c net.Conn, n int) error {
	b := s.buf[:n]
	if s.pat != nil {
		s.pat.Fill(b)
	}
	_, err := c.Write(b)
	return err
}

// recv receives n bytes into the buffer (and checks them with -T v).
func (s *session) recv(c net.Conn, n int) error {
	b := s.buf[:n]
	if _, err := io.ReadFull(c, b); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return fmt.Errorf("the peer closed the connection: %w", io.ErrUnexpectedEOF)
		}
		return err
	}
	if s.pat != nil {
		return s.pat.Check(b)
	}
	return nil
}
