// Package streamtool is what softrnic's counterparts of librdmacm's stream benchmarks,
// rstream (cmd/rstream) and riostream (cmd/riostream), share: the table of sizes and
// the counts that shrink as they grow, the tests of a run and the connections they go
// on, the result line and its JSON object, the byte pattern of -T v, and the -T
// options. The two C tools (librdmacm/examples/rstream.c and riostream.c) run the same
// tests and print the same table; they differ in how the bytes move (a stream, or
// direct writes into a mapped buffer).
package streamtool

import (
	"time"

	"github.com/softrnic/softrnic/internal/cmtool"
	"github.com/softrnic/softrnic/internal/perf"
	"github.com/softrnic/softrnic/rsocket"
)

// The C tools' defaults (librdmacm/examples/rstream.c, riostream.c).
const (
	DefaultPort   = 7471
	DefaultBuffer = 1 << 19 // SO_SNDBUF and SO_RCVBUF: rsockets' rings are twice that
	DefaultInline = 64
	DefaultIters  = 1
	DefaultCount  = 1000
	DefaultSize   = 1000
	SyncSize      = 16 // the bytes each way of the exchange before every test
)

// Sizes is the tools' table of sizes: the default run takes those marked Core, -S all
// takes them all.
var Sizes = []struct {
	Size int
	Core bool
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

// CountFor is the tools' number of transfers (bandwidth) or iterations (latency) for a
// size: fewer as they grow (common.c's size_to_count).
func CountFor(size int) int {
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

// Test is one line of the table: Count transfers of Size bytes one way, then as many
// back, Iters times.
type Test struct {
	Name               string
	Size, Count, Iters int
}

// Tuning is what the tools tune a connection for: its inline size (a send-side choice
// the wire does not show).
type Tuning int

const (
	TuneMixed     Tuning = iota // a custom test: the default inline size
	TuneLatency                 // the latency set: -i
	TuneBandwidth               // the bandwidth set: the least inline size
)

// Phase is the tests of one connection, and how the connection is tuned for them.
type Phase struct {
	Tune  Tuning
	Tests []Test
}

// Plan is what a command line asks for: one custom test (-S size, -C, -I), or the size
// sets (-S all: every size of the table, not only the core ones).
type Plan struct {
	Custom             bool
	Size, Count, Iters int
	AllSizes           bool
	// CountFor, if set, replaces the package's CountFor (tests: short runs of the sets).
	CountFor func(size int) int
}

// Phases returns the run's connections and their tests, as the tools run them: a custom
// test on one connection; else the latency set (one transfer per iteration) on one
// connection, closed, then the bandwidth set (one iteration of many transfers) on a new
// one.
func (p Plan) Phases() []Phase {
	if p.Custom {
		return []Phase{{TuneMixed, []Test{{"custom", p.Size, p.Count, p.Iters}}}}
	}
	count := p.CountFor
	if count == nil {
		count = CountFor
	}
	lat, bw := Phase{Tune: TuneLatency}, Phase{Tune: TuneBandwidth}
	for _, s := range Sizes {
		if !s.Core && !p.AllSizes {
			continue
		}
		n := count(s.Size)
		lat.Tests = append(lat.Tests, Test{TestName(s.Size, "lat"), s.Size, 1, n})
		bw.Tests = append(bw.Tests, Test{TestName(s.Size, "bw"), s.Size, n, 1})
	}
	return []Phase{lat, bw}
}

// MaxSize is the largest transfer of phases: the size of the one buffer the C tools
// move every transfer through.
func MaxSize(phases []Phase) int {
	n := 0
	for _, p := range phases {
		for _, t := range p.Tests {
			n = max(n, t.Size)
		}
	}
	return n
}

// Result is one test's outcome: a line of the table, and its JSON object with --json.
type Result struct {
	Tool       string  `json:"tool"`      // rstream or riostream
	Test       string  `json:"test"`      // the table's name: 64_lat, 1m_bw, custom
	Transport  string  `json:"transport"` // rsocket, or tcp (rstream's -T s)
	Role       string  `json:"role"`
	Ordering   string  `json:"ordering,omitempty"` // the rsocket's QP's
	Connection int     `json:"connection"`         // which of the run's connections (from 1)
	Size       int     `json:"size"`               // bytes per transfer
	Xfers      int     `json:"xfers"`              // transfers each way per iteration
	Iters      int     `json:"iters"`
	Bytes      int64   `json:"bytes"` // moved both ways
	Seconds    float64 `json:"seconds"`
	// Gbps is the tools' Gb/sec (both ways, decimal gigabits); BW the same in MiB/s;
	// UsecPerXfer the time per transfer, a transfer being one way.
	Gbps        float64 `json:"gbps"`
	BW          float64 `json:"bw_MiBps"`
	UsecPerXfer float64 `json:"usec_per_xfer"`
	// CPU time (user + system) of the process over the test: this side's, or both
	// sides' when they run in one process; its system part; per GiB of Bytes.
	CPUSeconds float64 `json:"cpu_s,omitempty"`
	SysSeconds float64 `json:"cpu_sys_s,omitempty"`
	CPUPerGiB  float64 `json:"cpu_s_per_GiB,omitempty"`
	Verified   bool    `json:"checked,omitempty"` // -T v: what the tool checks was checked (rperf's name)
	// Rsocket is what the connection received and did not act on (rsockets only);
	// Counters the device's and connection manager's counters after the test.
	Rsocket  *rsocket.Stats   `json:"rsocket,omitempty"`
	Counters *cmtool.Counters `json:"counters,omitempty"`
}

// Clock measures a test's iterations: the time and the process's CPU time.
type Clock struct {
	start    time.Time
	cpu, sys time.Duration
	cpuOK    bool
}

// Start starts a Clock.
func Start() Clock {
	cpu, sys, ok := perf.ProcessCPU()
	return Clock{start: time.Now(), cpu: cpu, sys: sys, cpuOK: ok}
}

// Stop fills r's figures from the time since Start, and its Bytes from r's size,
// transfers and iterations, as the C tools' show_perf computes them.
func (c Clock) Stop(r *Result) {
	d := time.Since(c.start)
	cpu, sys, _ := perf.ProcessCPU()
	r.Bytes = int64(r.Iters) * int64(r.Xfers) * int64(r.Size) * 2
	usec := float64(d.Nanoseconds()) / 1e3
	r.Seconds = d.Seconds()
	if usec > 0 {
		r.Gbps = float64(r.Bytes) * 8 / (1000 * usec)
		r.BW = float64(r.Bytes) / (1 << 20) / d.Seconds()
	}
	r.UsecPerXfer = usec / float64(r.Iters) / float64(r.Xfers*2)
	if c.cpuOK {
		r.CPUSeconds, r.SysSeconds = (cpu - c.cpu).Seconds(), (sys - c.sys).Seconds()
		r.CPUPerGiB = r.CPUSeconds / (float64(r.Bytes) / (1 << 30))
	}
}
