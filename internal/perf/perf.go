// Package perf implements rperf's perftest-style benchmarks (write_bw, read_bw, send_bw,
// atomic_bw, write_lat, read_lat, send_lat, atomic_lat) over the verbs API, with both
// sides in one process (loopback) or in two processes joined by a TCP control connection:
// rperf's own (JSON) or perftest's (perftest mode, perftest.go), whose peer may be
// perftest's tools themselves.
package perf

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/softrnic/softrnic/metrics"
	"github.com/softrnic/softrnic/verbs"
)

// Tests rperf knows, in suite order.
var Tests = []string{"write_bw", "read_bw", "send_bw", "atomic_bw", "write_lat", "read_lat", "send_lat", "atomic_lat"}

// Config describes one benchmark run.
type Config struct {
	Test  string `json:"test"`
	Size  int    `json:"size"`  // message size in bytes
	Iters int    `json:"iters"` // measured iterations (after warm-up)
	MTU   int    `json:"mtu"`   // path MTU in bytes
	QPs   int    `json:"qps"`   // queue pairs
	// Threads is how many goroutines drive the client's QPs in the bandwidth tests, each
	// with QPs of its own (QP i goes to thread i mod Threads) and a CQ of its own; 0 or 1:
	// one.
	Threads int `json:"threads,omitempty"`
	// Queues is each device's receive queues (verbs.DeviceConfig.Queues; 0: its default).
	// A client's applies to the server too.
	Queues  int   `json:"queues,omitempty"`
	TxDepth int   `json:"tx_depth"` // outstanding work requests per QP (bandwidth tests)
	Check   bool  `json:"check"`
	Timeout uint8 `json:"timeout"` // local ACK timeout code
	// Device settings (each side uses its own).
	Faults   *verbs.Faults `json:"-"`
	Window   int           `json:"-"`
	BusyPoll time.Duration `json:"-"`
	// Capture, if set, receives every packet of the client's device (verbs.PacketCapture).
	Capture *verbs.PacketCapture `json:"-"`
	// Metrics, if set, publishes the counters of every device the test opens (rperf
	// --metrics); a device leaves it when it is closed.
	Metrics *metrics.Registry `json:"-"`
	// Ordering is what this side offers; weak mode is used only if both sides offer it.
	Ordering verbs.Ordering `json:"-"`
	// CM connects the QPs through the connection manager (package cm) instead of the
	// hand exchange of QP numbers and PSNs; both sides must use it.
	CM bool `json:"cm,omitempty"`
	// Events makes the client's bandwidth loop sleep on its CQ's completion channel
	// (ReqNotifyCQ, GetCQEvent) when it has nothing to post, instead of busy-polling:
	// perftest's -e. The device's receive goroutines then deliver the completions.
	Events bool `json:"events,omitempty"`

	// Perftest speaks perftest's exchange instead of rperf's (perftest.go): the peer may be
	// perftest's own tools. The fields below apply to it.
	Perftest bool `json:"perftest,omitempty"`
	// RoCEPort is the UDP port of both devices in perftest mode (0: 4791, where a
	// standard peer sends; the exchange carries none).
	RoCEPort int `json:"-"`
	// CQMod is perftest's -Q: every CQMod-th work request is signaled (0: perftest's
	// default, 100, or 1 for messages above 8 KiB).
	CQMod int `json:"cq_mod,omitempty"`
	// RxDepth is perftest's -r: receives posted ahead in the send tests (0: 512).
	RxDepth int `json:"rx_depth,omitempty"`
	// AtomicType is perftest's -A: FETCH_AND_ADD (the default) or CMP_AND_SWAP.
	AtomicType string `json:"atomic_type,omitempty"`
	// AllSizes is perftest's -a in perftest mode: every size from 2 B to 8 MiB in one
	// connection (both sides must use it).
	AllSizes bool `json:"all_sizes,omitempty"`
	// allUpTo, if set, ends AllSizes' sizes there instead of 8 MiB (the tests: the
	// exchange does not depend on the sizes).
	allUpTo int
}

// Defaults fills zero fields with perftest's defaults for the test.
func (c *Config) Defaults() {
	if c.Perftest {
		c.perftestDefaults()
		return
	}
	bw := strings.HasSuffix(c.Test, "_bw")
	if c.Size == 0 {
		if bw {
			c.Size = 65536
		} else {
			c.Size = 8
		}
	}
	if c.Iters == 0 {
		if bw {
			c.Iters = 5000
		} else {
			c.Iters = 10000
		}
	}
	if c.MTU == 0 {
		c.MTU = 4096
	}
	if c.QPs == 0 {
		c.QPs = 1
	}
	if c.TxDepth == 0 {
		c.TxDepth = 128
	}
	if c.Threads == 0 {
		c.Threads = 1
	}
	if c.Timeout == 0 {
		c.Timeout = 14
	}
	if isAtomic(c.Test) {
		c.Size = 8
	}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	if !slices.Contains(Tests, c.Test) {
		return fmt.Errorf("unknown test %q (want one of %s)", c.Test, strings.Join(Tests, ", "))
	}
	if c.Perftest {
		return c.validatePerftest()
	}
	if _, err := verbs.MTUFromBytes(c.MTU); err != nil {
		return err
	}
	switch {
	case c.Size < 1 || c.Size > 1<<30:
		return fmt.Errorf("size %d out of range 1..1GiB", c.Size)
	case c.Iters < 1:
		return fmt.Errorf("iterations %d < 1", c.Iters)
	case c.QPs < 1 || c.QPs > 1024:
		return fmt.Errorf("qps %d out of range 1..1024", c.QPs)
	case c.TxDepth < 1 || c.TxDepth > 8192:
		return fmt.Errorf("tx-depth %d out of range 1..8192", c.TxDepth)
	case strings.HasSuffix(c.Test, "_lat") && c.QPs != 1:
		return fmt.Errorf("latency tests use one QP")
	case strings.HasSuffix(c.Test, "_lat") && c.Events:
		return fmt.Errorf("--events is for the bandwidth tests: the latency tests busy-poll")
	case c.Threads < 1 || c.Threads > c.QPs:
		return fmt.Errorf("threads %d out of range 1..%d (each thread drives QPs of its own: raise --qps)", c.Threads, c.QPs)
	case c.Test == "write_lat" && c.Ordering == verbs.OrderingWeak && c.Size > c.MTU:
		return fmt.Errorf("write_lat polls the last byte of the buffer, which weak mode does not place last for messages longer than the MTU; use send_lat, or -s up to %d", c.MTU)
	}
	return nil
}

// Latency summarises per-iteration latencies in microseconds.
type Latency struct {
	Min  float64 `json:"min"`
	P50  float64 `json:"p50"`
	Avg  float64 `json:"avg"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
	// Stdev is perftest's t_stdev (perftest mode only).
	Stdev float64 `json:"stdev,omitempty"`
}

// Result is one benchmark's outcome.
type Result struct {
	Test     string  `json:"test"`
	Ordering string  `json:"ordering"`
	CM       bool    `json:"cm,omitempty"` // the QPs were connected through the CM
	Size     int     `json:"size"`
	Iters    int     `json:"iters"`
	BW       float64 `json:"bw_MiBps"`
	MsgRate  float64 `json:"msg_rate_Mpps"`
	// BWPeak is perftest's "BW peak" (perftest mode; 0 where perftest prints 0.00).
	BWPeak  float64  `json:"bw_peak_MiBps,omitempty"`
	Lat     *Latency `json:"lat_us,omitempty"`
	Seconds float64  `json:"seconds"`
	// CPU time (user + system) of the process over the measured interval: both sides in a
	// loopback run, the client's side otherwise; its system part; per GiB of payload and
	// per data packet.
	CPUSeconds   float64 `json:"cpu_s,omitempty"`
	SysSeconds   float64 `json:"cpu_sys_s,omitempty"` // the system part of CPUSeconds
	CPUPerGiB    float64 `json:"cpu_s_per_GiB,omitempty"`
	CPUPerPacket float64 `json:"cpu_us_per_pkt,omitempty"`
	Checked      bool    `json:"checked,omitempty"`
	Counters     *Stats  `json:"counters,omitempty"`
	// Perftest: the run spoke perftest's exchange. Measured says which side measured the
	// figures (perftest's write/read/atomic_bw server prints the client's report);
	// PeerVersion is the version the peer reported; MTU the path MTU both sides settled on.
	// Passive: this side measured nothing (perftest's read_lat and atomic_lat servers
	// print no result); the result says the run went through, with its counters.
	Perftest    bool   `json:"perftest,omitempty"`
	Measured    string `json:"measured_by,omitempty"`
	Passive     bool   `json:"passive,omitempty"`
	PeerVersion string `json:"peer_version,omitempty"`
	MTU         int    `json:"mtu,omitempty"`
	// Holes is, for each side of a weakly-ordered run with --stats, the moment with the
	// most open holes seen while it ran.
	Holes []HoleSample `json:"holes,omitempty"`
}

// HoleSample is a snapshot of one QP's open holes.
type HoleSample struct {
	Side   string           `json:"side"`
	QPNum  uint32           `json:"qpn"`
	Report verbs.HoleReport `json:"report"`
}

// Stats are the counters of the two devices after a run.
type Stats struct {
	Client verbs.Counters `json:"client"`
	Server verbs.Counters `json:"server,omitempty"`
}

func bwResult(c *Config, elapsed time.Duration) Result {
	s := elapsed.Seconds()
	return Result{
		Test: c.Test, Size: c.Size, Iters: c.Iters, Seconds: s,
		BW:      float64(c.Size) * float64(c.Iters) / s / (1 << 20),
		MsgRate: float64(c.Iters) / s / 1e6,
	}
}

// latResult summarises samples (nanoseconds; already halved for one-way tests).
func latResult(c *Config, samples []int64, elapsed time.Duration) Result {
	r := bwResult(c, elapsed)
	r.Lat = Summarize(samples)
	return r
}

// Summarize sorts samples (nanoseconds, at least one) and returns their latency summary
// in microseconds.
func Summarize(samples []int64) *Latency {
	slices.Sort(samples)
	var sum float64
	for _, v := range samples {
		sum += float64(v)
	}
	pct := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(samples)))) - 1
		i = max(0, min(i, len(samples)-1))
		return float64(samples[i]) / 1e3
	}
	return &Latency{
		Min: float64(samples[0]) / 1e3, P50: pct(0.50), Avg: sum / float64(len(samples)) / 1e3,
		P99: pct(0.99), P999: pct(0.999), Max: float64(samples[len(samples)-1]) / 1e3,
	}
}

// Header returns the column titles of the results table.
func Header() string {
	return fmt.Sprintf("%-11s %9s %8s %11s %9s %8s %8s %8s %8s %8s %8s",
		"test", "bytes", "iters", "BW[MiB/s]", "Mpps", "t_min", "t_p50", "t_avg", "t_p99", "t_p999", "t_max[us]")
}

// Row formats r as a table row.
func (r Result) Row() string {
	s := fmt.Sprintf("%-11s %9d %8d %11.1f %9.4f", r.Test, r.Size, r.Iters, r.BW, r.MsgRate)
	if r.Lat != nil {
		l := r.Lat
		s += fmt.Sprintf(" %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f", l.Min, l.P50, l.Avg, l.P99, l.P999, l.Max)
	}
	return s
}

// DefaultAddrs are the loopback device addresses (client, server).
var DefaultAddrs = [2]netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}

// publish adds dev to c.Metrics, if set.
func (c *Config) publish(dev *verbs.Device) {
	if c.Metrics != nil {
		c.Metrics.AddDevice(dev)
	}
}
