// Command cqbench measures completion handlers: completion-event throughput with one
// handler and with two (pinned to different CPUs) when the consumers' work per completion
// limits it, the notification latency (completion to handler call) that goes with it, and
// how well a high-priority handler's latency is isolated from another handler's flood.
//
//	go run ./bench/cmd/cqbench                 the whole table (about 30 s)
//	go run ./bench/cmd/cqbench -runs 5 -d 3s   more rounds, longer
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/bench/internal/cqexp"
	"github.com/softrnic/softrnic/internal/perf"
)

func main() {
	var (
		runs  = flag.Int("runs", 3, "rounds (medians are reported)")
		dur   = flag.Duration("d", 2*time.Second, "measured time per run")
		work  = flag.Duration("work", 50*time.Microsecond, "server work per request")
		qps   = flag.Int("qps", 32, "connections")
		cqs   = flag.Int("cqs", 8, "server CQs")
		outst = flag.Int("outstanding", 8, "requests in flight per connection")
		pin   = flag.Bool("pin", true, "throughput: pin handler i to CPU i")
		iso   = flag.String("iso-cpus", "0:0", "isolation: the flood handler's and the ping handler's CPUs (\"-\": unpinned)")
		rt    = flag.Bool("rt", false, "isolation: run the ping handler under SCHED_FIFO (needs CAP_SYS_NICE)")
		only  = flag.String("only", "", "run only \"throughput\" or \"isolation\"")
		prof  = flag.String("cpuprofile", "", "write a CPU profile to this file")
		asJ   = flag.Bool("json", false, "print one JSON object per round instead of the tables")
	)
	flag.Parse()
	if *prof != "" {
		stop, err := perf.StartCPUProfile(*prof)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cqbench:", err)
			os.Exit(1)
		}
		defer stop()
	}
	out := io.Writer(os.Stdout)
	enc := json.NewEncoder(os.Stdout)
	if *asJ {
		out = io.Discard // the tables; each round goes out as JSON
	}
	fmt.Fprintf(out, "cqbench: %d connections over %d server CQs, %d requests in flight each, %v of work per request, %v per run, medians of %d\n\n",
		*qps, *cqs, *outst, *work, *dur, *runs)

	var rate [3][]float64
	var events [3][]float64
	var p50, p99 [3][]time.Duration
	for round := 0; round < *runs && *only != "isolation"; round++ {
		for _, h := range []int{1, 2} {
			r, err := cqexp.Throughput(cqexp.Config{Handlers: h, Pin: *pin, QPs: *qps, CQs: *cqs, Outstanding: *outst, Work: *work, Duration: *dur})
			if err != nil {
				fmt.Fprintf(os.Stderr, "cqbench: %d handlers: %v\n", h, err)
				os.Exit(1)
			}
			if *asJ {
				_ = enc.Encode(throughputJSON{Test: "cq_throughput", Size: r.Config.MsgSize, Handlers: h, Round: round + 1,
					RequestsPerS: r.PerSecond, EventsPerS: r.EventsPerS, LatencyP50NS: int64(r.Latency[0].P50), LatencyP99NS: int64(r.Latency[0].P99)})
			}
			rate[h] = append(rate[h], r.PerSecond)
			events[h] = append(events[h], r.EventsPerS)
			p50[h] = append(p50[h], r.Latency[0].P50)
			p99[h] = append(p99[h], r.Latency[0].P99)
			fmt.Fprintf(os.Stderr, "round %d, %d handler(s): %.0f requests/s, %.0f events/s, per handler %v, latency p50 %v p99 %v\n",
				round+1, h, r.PerSecond, r.EventsPerS, r.PerHandler, r.Latency[0].P50, r.Latency[0].P99)
		}
	}
	if *only != "isolation" {
		fmt.Fprintln(out, "| handlers | requests handled/s | handler calls/s | notification latency p50 | p99 |")
		fmt.Fprintln(out, "|---|---|---|---|---|")
		for _, h := range []int{1, 2} {
			fmt.Fprintf(out, "| %d | %.0f | %.0f | %v | %v |\n", h, median(rate[h]), median(events[h]), medianD(p50[h]), medianD(p99[h]))
		}
		fmt.Fprintf(out, "\n2 handlers / 1 handler: %.2f×\n\n", median(rate[2])/median(rate[1]))
	}
	if *only == "throughput" {
		return
	}

	var isoCPUs [2][]int
	parts := strings.Split(*iso, ":")
	if len(parts) != 2 {
		fmt.Fprintln(os.Stderr, "cqbench: -iso-cpus wants FLOOD:PING, e.g. 0:0 or 0:1 or -:-")
		os.Exit(2)
	}
	for i, p := range parts {
		if p == "-" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cqbench: -iso-cpus:", err)
			os.Exit(2)
		}
		isoCPUs[i] = []int{n}
	}
	fmt.Fprintf(out, "isolation: flood handler (priority 0) on CPUs %v, ping handler (priority 1%s) on CPUs %v, a ping every 500 µs\n\n",
		isoCPUs[0], map[bool]string{true: ", SCHED_FIFO"}[*rt], isoCPUs[1])
	var idle50, idle99, fl50, fl99 []time.Duration
	var flood []float64
	for round := 0; round < *runs; round++ {
		r, err := cqexp.Isolation(cqexp.IsolationConfig{CPUs: isoCPUs, RealTime: *rt, FloodQPs: *qps, Outstanding: *outst, Work: *work, Duration: *dur})
		if err != nil {
			fmt.Fprintf(os.Stderr, "cqbench: isolation: %v\n", err)
			os.Exit(1)
		}
		if *asJ {
			_ = enc.Encode(isolationJSON{Test: "cq_isolation", Size: 64, Round: round + 1, IdleP50NS: int64(r.Idle.P50), IdleP99NS: int64(r.Idle.P99),
				FloodedP50NS: int64(r.Flooded.P50), FloodedP99NS: int64(r.Flooded.P99), FloodPerS: r.FloodPerSecond, PingsSkipped: r.PingsSkipped})
		}
		idle50, idle99 = append(idle50, r.Idle.P50), append(idle99, r.Idle.P99)
		fl50, fl99 = append(fl50, r.Flooded.P50), append(fl99, r.Flooded.P99)
		flood = append(flood, r.FloodPerSecond)
		fmt.Fprintf(os.Stderr, "isolation round %d: idle p50 %v p99 %v (n=%d); flooded p50 %v p99 %v (n=%d), flood %.0f/s, pings skipped %d\n",
			round+1, r.Idle.P50, r.Idle.P99, r.Idle.Count, r.Flooded.P50, r.Flooded.P99, r.Flooded.Count, r.FloodPerSecond, r.PingsSkipped)
	}
	fmt.Fprintln(out, "| ping handler (priority 1) | notification latency p50 | p99 | flood on handler 0 |")
	fmt.Fprintln(out, "|---|---|---|---|")
	fmt.Fprintf(out, "| idle | %v | %v | — |\n", medianD(idle50), medianD(idle99))
	fmt.Fprintf(out, "| handler 0 flooded | %v | %v | %.0f requests/s |\n", medianD(fl50), medianD(fl99), median(flood))
	fmt.Fprintf(out, "\nflooded p99 / idle p99: %.2f×\n", float64(medianD(fl99))/float64(medianD(idle99)))
}

// throughputJSON is one throughput round, with --json.
type throughputJSON struct {
	Test         string  `json:"test"`
	Size         int     `json:"size"` // request and reply size in bytes
	Handlers     int     `json:"handlers"`
	Round        int     `json:"round"`
	RequestsPerS float64 `json:"requests_per_s"`
	EventsPerS   float64 `json:"events_per_s"`
	LatencyP50NS int64   `json:"latency_p50_ns"` // completion to handler call
	LatencyP99NS int64   `json:"latency_p99_ns"`
}

// isolationJSON is one isolation round, with --json.
type isolationJSON struct {
	Test         string  `json:"test"`
	Size         int     `json:"size"`
	Round        int     `json:"round"`
	IdleP50NS    int64   `json:"idle_p50_ns"`
	IdleP99NS    int64   `json:"idle_p99_ns"`
	FloodedP50NS int64   `json:"flooded_p50_ns"`
	FloodedP99NS int64   `json:"flooded_p99_ns"`
	FloodPerS    float64 `json:"flood_per_s"`
	PingsSkipped int     `json:"pings_skipped"`
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianD(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2].Round(100 * time.Nanosecond)
}
