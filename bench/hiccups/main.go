// Command hiccups measures how often this machine takes a processor away from a program
// that never gives it up: one thread per processor spins reading the clock, and every gap
// between two readings longer than 10 µs is time the thread did not run (an interrupt, the
// hypervisor, another task). A latency test's tail cannot be shorter than what these gaps
// add to the round trips they hit; bench/efficiency.sh prints both.
//
//	go run ./bench/hiccups             text
//	go run ./bench/hiccups --json      one JSON object
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"
)

// result is what one run found, over all processors.
type result struct {
	Test       string  `json:"test"`
	Procs      int     `json:"procs"`
	Seconds    float64 `json:"seconds"`
	GapsPerSec float64 `json:"gaps_per_s"` // gaps > 10 µs per second, per processor
	LostPct    float64 `json:"lost_pct"`   // share of each processor's time in those gaps
	P50us      float64 `json:"gap_p50_us"`
	P90us      float64 `json:"gap_p90_us"`
	Maxus      float64 `json:"gap_max_us"`
}

func main() {
	dur := flag.Duration("d", 2*time.Second, "how long to spin")
	asJSON := flag.Bool("json", false, "print one JSON object")
	flag.Parse()
	procs := runtime.GOMAXPROCS(0)
	gaps := make([][]time.Duration, procs)
	var wg sync.WaitGroup
	for p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			start := time.Now()
			last := start
			var g []time.Duration
			for {
				now := time.Now()
				if d := now.Sub(last); d > 10*time.Microsecond {
					g = append(g, d)
				}
				last = now
				if now.Sub(start) > *dur {
					break
				}
			}
			gaps[p] = g
		}()
	}
	wg.Wait()
	all := slices.Concat(gaps...)
	slices.Sort(all)
	var lost time.Duration
	for _, g := range all {
		lost += g
	}
	secs := dur.Seconds()
	r := result{Test: "hiccups", Procs: procs, Seconds: secs}
	r.GapsPerSec = float64(len(all)) / secs / float64(procs)
	r.LostPct = lost.Seconds() / secs / float64(procs) * 100
	if n := len(all); n > 0 {
		us := func(d time.Duration) float64 { return float64(d) / 1e3 }
		r.P50us, r.P90us, r.Maxus = us(all[n/2]), us(all[n*9/10]), us(all[n-1])
	}
	if *asJSON {
		json.NewEncoder(os.Stdout).Encode(r)
		return
	}
	fmt.Printf("%d processors, %.1f s: %.0f gaps > 10 µs a second per processor (%.1f %% of its time), median %.0f µs, p90 %.0f µs, longest %.0f µs\n",
		procs, secs, r.GapsPerSec, r.LostPct, r.P50us, r.P90us, r.Maxus)
}
