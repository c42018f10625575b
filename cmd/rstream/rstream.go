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
	"github.com/softrnic/softrnic/internal/perf"
	"github.com/softrnic/softrnic/rsocket"
	"github.com/softrnic/softrnic/verbs"
)

// rstream's defaults (librdmacm/examples/rstream.c).
const (
	defaultPort   = 7471
	defaultBuffer = 1 << 19 // SO_SNDBUF and SO_RCVBUF: rsockets' rings are twice that
	defaultInline = 64
	defaultIters  = 1
	defaultCount  = 1000
	defaultSize   = 1000
	syncSize      = 16 // the bytes each way of the exchange before every test
)

// sizeSet is rstream's table of sizes: the default run takes those marked core, -S all
// takes them all.
var sizeSet = []struct {
	size int
	core bool
}{
	{1 << 6, true},
	{1 << 7, false}, {1<<7 + 1<<6, false},
	{1 << 8, false}, {1<<8 + 1<<7, false},
	{1 << 9, false}, {1<<9 + 1<<8, false},
	{1 << 10, false}, {1<<10 + 1<<9, false},
	{1 << 11, false}, {1<<11 + 1<<10, false},
	{1 << 12, true}, {1<<12 + 1<<11, false},
	{1 << 13, false}, {1<<13 + 1<<12, false},
	{1 << 14, false}, {1<<14 + 1<<13, false},
	{1 << 15, false}, {1<<15 + 1<<14, false},
	{1 << 16, true}, {1<<16 + 1<<15, false},
	{1 << 17, false}, {1<<17 + 1<<16, false},
	{1 << 18, false}, {1<<18 + 1<<17, false},
	{1 << 19, false}, {1<<19 + 1<<18, false},
	{1 << 20, true}, {1<<20 + 1<<19, false},
	{1 << 21, false}, {1<<21 + 1<<20, false},
	{1 << 22, false}, {1<<22 + 1<<21, false},
}

// countFor is rstream's number of transfers (bandwidth) or iterations (latency) for a
// size: fewer as they grow.
func countFor(size int) int {
	switch {
	case size >= 1<<20:
		return 100
	case size >= 1<<16:
		return 1000
	case size >= 1<<10:
		return 10000
	}
	return 100000
}

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
	BusyPoll           time.Duration // rsocket.Options.BusyPoll (0: its default)
	// CountFor, if set, replaces rstream's countFor (tests: short runs of the size sets).
	CountFor func(size int) int
	// Local is the device: --dev-addr (default -b; a client's: the route's source),
	// --udp-port, --pcap, and what tests set instead.
	cmtool.Local
}

func (c *Config) client() bool { return c.ServerAddr.IsValid() }

func (c *Config) defaults() {
	if c.Buffer == 0 {
		c.Buffer = defaultBuffer
	}
	if c.Inline == 0 {
		c.Inline = defaultInline
	}
	if c.CountFor == nil {
		c.CountFor = countFor
	}
	if c.Custom {
		if c.Size == 0 {
			c.Size = defaultSize
		}
		if c.Count == 0 {
			c.Count = defaultCount
		}
		if c.Iters == 0 {
			c.Iters = defaultIters
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

// test is one line of rstream's table: Count transfers of Size bytes one way, then as
// many back, Iters times.
type test struct {
	name               string
	size, count, iters int
}

// phase is the tests of one connection, and how the connection is tuned for them.
type phase struct {
	tune  tuning
	tests []test
}

// tuning is what rstream tunes a connection for: its inline size (rsockets only; no
// effect on the wire).
type tuning int

const (
	tuneMixed     tuning = iota // a custom test: the default inline size
	tuneLatency                 // the latency set: -i
	tuneBandwidth               // the bandwidth set: the least inline size
)

// phases returns the run's connections and their tests, as rstream runs them: a custom
// test on one connection; else the latency set (one transfer per iteration) on one
// connection, closed, then the bandwidth set (one iteration of many transfers) on a new
// one.
func (c *Config) phases() []phase {
	if c.Custom {
		return []phase{{tuneMixed, []test{{"custom", c.Size, c.Count, c.Iters}}}}
	}
	lat, bw := phase{tune: tuneLatency}, phase{tune: tuneBandwidth}
	for _, s := range sizeSet {
		if !s.core && !c.AllSizes {
			continue
		}
		n := c.CountFor(s.size)
		lat.tests = append(lat.tests, test{testName(s.size, "lat"), s.size, 1, n})
		bw.tests = append(bw.tests, test{testName(s.size, "bw"), s.size, n, 1})
	}
	return []phase{lat, bw}
}

// Result is one test's outcome: a line of rstream's table, and its JSON object with
// --json.
type Result struct {
	Tool       string  `json:"tool"`
	Test       string  `json:"test"`      // rstream's name: 64_lat, 1m_bw, custom
	Transport  string  `json:"transport"` // rsocket, or tcp (-T s)
	Role       string  `json:"role"`
	Ordering   string  `json:"ordering,omitempty"` // the rsocket's QP's
	Connection int     `json:"connection"`         // which of the run's connections (from 1)
	Size       int     `json:"size"`               // bytes per transfer
	Xfers      int     `json:"xfers"`              // transfers each way per iteration
	Iters      int     `json:"iters"`
	Bytes      int64   `json:"bytes"` // moved both ways
	Seconds    float64 `json:"seconds"`
	// Gbps is rstream's Gb/sec (both ways, decimal gigabits); BW the same in MiB/s;
	// UsecPerXfer the time per transfer, a transfer being one way.
	Gbps        float64 `json:"gbps"`
	BW          float64 `json:"bw_MiBps"`
	UsecPerXfer float64 `json:"usec_per_xfer"`
	// CPU time (user + system) of the process over the test: this side's, or both
	// sides' when they run in one process; its system part; per GiB of Bytes.
	CPUSeconds float64 `json:"cpu_s,omitempty"`
	SysSeconds float64 `json:"cpu_sys_s,omitempty"`
	CPUPerGiB  float64 `json:"cpu_s_per_GiB,omitempty"`
	Verified   bool    `json:"checked,omitempty"` // -T v: every byte received was checked (rperf's name)
	// Rsocket is what the connection received and did not act on (rsockets only);
	// Counters the device's and connection manager's counters after the test.
	Rsocket  *rsocket.Stats   `json:"rsocket,omitempty"`
	Counters *cmtool.Counters `json:"counters,omitempty"`
}

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
	phases := cfg.phases()
	bufSize := 0
	for _, p := range phases {
		for _, t := range p.tests {
			bufSize = max(bufSize, t.size)
		}
	}
	s := &session{cfg: cfg, tr: tr, end: end, o: o, buf: make([]byte, max(bufSize, syncSize))}
	if cfg.Verify {
		s.pat = &pattern{}
	}
	o.Printf("%s", header())
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
	connect(ctx context.Context, tune tuning) (net.Conn, error)
	role() string
	// leads says whether this side sends first.
	leads() bool
}

type client struct{ tr transport }

func (c *client) connect(ctx context.Context, tune tuning) (net.Conn, error) {
	return c.tr.dial(ctx, tune)
}
func (c *client) role() string { return "client" }
func (c *client) leads() bool  { return true }

type server struct{ l listener }

func (s *server) connect(ctx context.Context, _ tuning) (net.Conn, error) { return s.l.accept(ctx) }
func (s *server) role() string                                            { return "server" }
func (s *server) leads() bool                                             { return false }

// session is a run under way: the buffer every transfer goes through, as rstream has
// one, and the pattern of -T v, which runs on across the run's connections.
type session struct {
	cfg *Config
	tr  transport
	end endpoint
	o   *output
	buf []byte
	pat *pattern // nil without -T v
}

// runPhase makes a connection, runs a phase's tests on it, then closes it (rstream's
// shutdown of both directions, then close).
func (s *session) runPhase(ctx context.Context, conn int, p phase) (err error) {
	c, err := s.end.connect(ctx, p.tune)
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
	for _, t := range p.tests {
		r, err := s.runTest(c, t)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
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
func (s *session) runTest(c net.Conn, t test) (*Result, error) {
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
	cpu0, sys0, cpuOK := perf.ProcessCPU()
	start := time.Now()
	for range t.iters {
		for range t.count {
			if err := first(c, t.size); err != nil {
				return nil, err
			}
		}
		for range t.count {
			if err := then(c, t.size); err != nil {
				return nil, err
			}
		}
	}
	d := time.Since(start)
	cpu1, sys1, _ := perf.ProcessCPU()
	r := &Result{Tool: "rstream", Test: t.name, Transport: s.tr.name(), Role: s.end.role(),
		Size: t.size, Xfers: t.count, Iters: t.iters, Verified: s.pat != nil}
	r.Bytes = int64(t.iters) * int64(t.count) * int64(t.size) * 2
	usec := float64(d.Nanoseconds()) / 1e3
	r.Seconds = d.Seconds()
	if usec > 0 {
		r.Gbps = float64(r.Bytes) * 8 / (1000 * usec)
		r.BW = float64(r.Bytes) / (1 << 20) / d.Seconds()
	}
	r.UsecPerXfer = usec / float64(t.iters) / float64(t.count*2)
	if cpuOK {
		r.CPUSeconds, r.SysSeconds = (cpu1 - cpu0).Seconds(), (sys1 - sys0).Seconds()
		r.CPUPerGiB = r.CPUSeconds / (float64(r.Bytes) / (1 << 30))
	}
	s.tr.describe(c, r)
	return r, nil
}

// send sends n bytes of the buffer (the next n of the pattern with -T v).
func (s *session) send(c net.Conn, n int) error {
	b := s.buf[:n]
	if s.pat != nil {
		s.pat.fill(b)
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
		return s.pat.check(b)
	}
	return nil
}
