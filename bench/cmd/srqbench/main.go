// Command srqbench runs the shared-receive-queue experiment: N connections into one
// device under a skewed load (a few hot, most idle), received through one SRQ provisioned
// statistically (with a limit queue per QP) and through a receive queue per QP sized for
// the same peak. It prints the registered receive memory each needs, the RNR NAK rate and
// the throughput the hot connections get; then it adds a hostile connection that floods
// and reports how fast its limit queue stops it and what the others keep, with and
// without limit queues.
//
//	go run ./bench/cmd/srqbench                       N = 100, 1,000 and 10,000
//	go run ./bench/cmd/srqbench -conns 1000 -d 5s     one size, longer
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/softrnic/softrnic/bench/internal/srqexp"
)

func main() {
	var (
		conns    = flag.String("conns", "100,1000,10000", "connection counts, comma-separated")
		dur      = flag.Duration("d", 2*time.Second, "measured time per phase")
		hotLoad  = flag.Float64("hot-load", 10000, "messages per second the hot connections send together")
		idleRate = flag.Float64("idle-rate", 0.5, "messages per second per idle connection")
		peak     = flag.Int("peak", 32, "receive WQEs a connection may need at its peak (the per-QP queue depth)")
		work     = flag.Duration("work", 10*time.Microsecond, "server processing time per message")
		warmup   = flag.Duration("warmup", 500*time.Millisecond, "load run before each measured phase (its RNR NAKs are shown apart)")
		hostile  = flag.Bool("hostile", true, "also run the hostile-connection phase")
		asJSON   = flag.Bool("json", false, "print one JSON object per result instead of the tables")
	)
	flag.Parse()
	var ns []int
	for _, f := range strings.Split(*conns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			fmt.Fprintf(os.Stderr, "srqbench: bad connection count %q\n", f)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	out := io.Writer(os.Stdout)
	enc := json.NewEncoder(os.Stdout)
	if *asJSON {
		out = io.Discard // the tables; the results go out as JSON
	}
	base := srqexp.Config{Duration: *dur, HotLoad: *hotLoad, IdleRate: *idleRate, PeakDepth: *peak, Work: *work, Warmup: *warmup}
	fmt.Fprintf(out, "srqbench: %v per phase, hot load %.0f msg/s, idle %.2g msg/s per connection, %d-WQE peak, %v work per message\n\n",
		*dur, *hotLoad, *idleRate, *peak, *work)

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "conns\thot\tmode\treceive memory\tshared/per-QP\tmessages\tRNR NAKs\tRNR rate\twarm-up RNR\thot offered/s\thot delivered/s\t")
	type pair struct{ per, shared srqexp.Result }
	results := map[int]*pair{}
	for _, n := range ns {
		fmt.Fprintf(os.Stderr, "srqbench: %d connections\n", n)
		p := &pair{}
		results[n] = p
		for _, mode := range []srqexp.Mode{srqexp.PerQPRQ, srqexp.SharedSRQ} {
			c := base
			c.Conns, c.Mode = n, mode
			r, err := srqexp.Run(c)
			if err != nil {
				fmt.Fprintf(os.Stderr, "srqbench: %d connections, %v: %v\n", n, mode, err)
				os.Exit(1)
			}
			ratio := "1"
			if mode == srqexp.PerQPRQ {
				p.per = r
			} else {
				p.shared = r
				ratio = fmt.Sprintf("1/%.0f", float64(p.per.RegisteredBytes)/float64(max(r.RegisteredBytes, 1)))
			}
			if *asJSON {
				_ = enc.Encode(baselineJSON{Test: "srq_baseline", Size: r.Config.MsgSize, Conns: n, Hot: r.Config.Hot, Mode: mode.String(),
					RegisteredBytes: r.RegisteredBytes, Messages: r.Messages, RNRNAKs: r.RNRNAKs, RNRRate: r.RNRRate,
					WarmupRNRNAKs: r.WarmupRNRNAKs, HotOffered: r.HotOffered, HotDelivered: r.HotDelivered})
			}
			fmt.Fprintf(tw, "%d\t%d\t%v\t%s\t%s\t%d\t%d\t%.3f%%\t%d\t%.0f\t%.0f\t\n", n, r.Config.Hot, mode, mib(r.RegisteredBytes), ratio,
				r.Messages, r.RNRNAKs, 100*r.RNRRate, r.WarmupRNRNAKs, r.HotOffered, r.HotDelivered)
		}
	}
	tw.Flush()
	if !*hostile {
		return
	}
	fmt.Fprintln(out)
	fmt.Fprintln(tw, "conns\tlimit queues\tstopped after\tresponse\thostile msgs/s\tits peak SRQ held\trefused\thot before/s\thot during/s\tkept\treceive memory\t")
	for _, n := range ns {
		fmt.Fprintf(os.Stderr, "srqbench: hostile phase, %d connections\n", n)
		for _, noLimits := range []bool{false, true} {
			c := base
			c.Conns, c.Mode, c.Hostile, c.NoLimits = n, srqexp.SharedSRQ, true, noLimits
			r, err := srqexp.Run(c)
			if err != nil {
				fmt.Fprintf(os.Stderr, "srqbench: hostile, %d connections: %v\n", n, err)
				os.Exit(1)
			}
			lim, stopped, how := "on", "-", "none"
			if noLimits {
				lim = "off"
			}
			if r.CQOverflow {
				how += " (CQ overflowed)"
			}
			if r.HostileDecision != "" {
				stopped, how = r.HostileStopped.Round(100*time.Microsecond).String(), r.HostileDecision
			}
			if *asJSON {
				_ = enc.Encode(hostileJSON{Test: "srq_hostile", Size: r.Config.MsgSize, Conns: n, LimitQueues: !noLimits,
					StoppedMS: float64(r.HostileStopped) / 1e6, Response: how, HostilePerS: float64(r.HostileDelivered) / dur.Seconds(),
					PeakHeld: r.HostilePeakHeld, Refused: r.HostileRefused, HotBefore: r.HotDelivered, HotDuring: r.HotDeliveredHostile,
					RegisteredBytes: r.RegisteredHostile})
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.0f\t%d\t%d\t%.0f\t%.0f\t%.1f%%\t%s\t\n", n, lim, stopped, how,
				float64(r.HostileDelivered)/dur.Seconds(), r.HostilePeakHeld, r.HostileRefused, r.HotDelivered, r.HotDeliveredHostile,
				100*r.HotDeliveredHostile/max(r.HotDelivered, 1), mib(r.RegisteredHostile))
		}
	}
	tw.Flush()
}

// baselineJSON is one result of the first table, with --json.
type baselineJSON struct {
	Test            string  `json:"test"`
	Size            int     `json:"size"` // message size in bytes
	Conns           int     `json:"conns"`
	Hot             int     `json:"hot"`
	Mode            string  `json:"mode"`
	RegisteredBytes int64   `json:"registered_bytes"`
	Messages        uint64  `json:"messages"`
	RNRNAKs         uint64  `json:"rnr_naks"`
	RNRRate         float64 `json:"rnr_rate"`
	WarmupRNRNAKs   uint64  `json:"warmup_rnr_naks"`
	HotOffered      float64 `json:"hot_offered_per_s"`
	HotDelivered    float64 `json:"hot_delivered_per_s"`
}

// hostileJSON is one result of the hostile table, with --json.
type hostileJSON struct {
	Test            string  `json:"test"`
	Size            int     `json:"size"`
	Conns           int     `json:"conns"`
	LimitQueues     bool    `json:"limit_queues"`
	StoppedMS       float64 `json:"stopped_ms"` // 0: never stopped
	Response        string  `json:"response"`
	HostilePerS     float64 `json:"hostile_per_s"`
	PeakHeld        uint64  `json:"peak_held"`
	Refused         uint64  `json:"refused"`
	HotBefore       float64 `json:"hot_before_per_s"`
	HotDuring       float64 `json:"hot_during_per_s"`
	RegisteredBytes int64   `json:"registered_bytes"`
}

func mib(b int64) string {
	if b >= 10<<20 {
		return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
}
