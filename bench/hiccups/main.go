// Command hiccups measures how often this machine takes a processor away from a program
// that never gives it up: one thread per processor spins reading the clock, and every gap
// between two readings longer than 10 µs is time the thread did not run (an interrupt, the
// hypervisor, another task). A latency test's tail cannot be shorter than what these gaps
// add to the round trips they hit; bench/efficiency.sh prints both.
//
// With --pingpong it measures instead the tail the machine leaves a ping-pong with no
// protocol at all: two threads, each busy-polling a non-blocking UDP socket on loopback
// (as softrnic's consumers poll), bounce 8 bytes; the one-way latency's p50 and p99.
//
//	go run ./bench/hiccups             text
//	go run ./bench/hiccups --json      one JSON object
//	go run ./bench/hiccups --pingpong  the plain UDP ping-pong's percentiles
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

	"golang.org/x/sys/unix"
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
	pp := flag.Bool("pingpong", false, "measure a busy-polled UDP ping-pong's latency percentiles instead")
	iters := flag.Int("n", 50000, "round trips (--pingpong)")
	flag.Parse()
	if *pp {
		pingpong(*iters, *asJSON)
		return
	}
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

// ppResult is a ping-pong's one-way latency (half the round trip), in microseconds.
type ppResult struct {
	Test  string  `json:"test"`
	Size  int     `json:"size"`
	Iters int     `json:"iters"`
	P50   float64 `json:"p50_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p999_us"`
	Ratio float64 `json:"p99_over_p50"`
}

// pingpong bounces 8 bytes between two busy-polling threads over loopback UDP.
func pingpong(iters int, asJSON bool) {
	sock := func() (int, unix.Sockaddr) {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err == nil {
			err = unix.SetNonblock(fd, true)
		}
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "hiccups:", err)
			os.Exit(1)
		}
		sa, _ := unix.Getsockname(fd)
		return fd, sa
	}
	a, aAddr := sock()
	b, bAddr := sock()
	defer unix.Close(a)
	defer unix.Close(b)
	// recv spins until a datagram arrives.
	recv := func(fd int, buf []byte) {
		for {
			if _, _, err := unix.Recvfrom(fd, buf, 0); err == nil {
				return
			} else if err != unix.EAGAIN && err != unix.EINTR {
				fmt.Fprintln(os.Stderr, "hiccups:", err)
				os.Exit(1)
			}
		}
	}
	warm := min(iters/10, 1000)
	go func() {
		runtime.LockOSThread()
		buf := make([]byte, 64)
		for range warm + iters {
			recv(b, buf)
			unix.Sendto(b, buf[:8], 0, aAddr)
		}
	}()
	runtime.LockOSThread()
	buf := make([]byte, 64)
	lat := make([]time.Duration, 0, iters)
	for i := range warm + iters {
		t := time.Now()
		unix.Sendto(a, buf[:8], 0, bAddr)
		recv(a, buf)
		if i >= warm {
			lat = append(lat, time.Since(t)/2)
		}
	}
	slices.Sort(lat)
	us := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / 1e3 }
	r := ppResult{Test: "udp_pingpong", Size: 8, Iters: iters, P50: us(0.5), P99: us(0.99), P999: us(0.999)}
	r.Ratio = r.P99 / r.P50
	if asJSON {
		json.NewEncoder(os.Stdout).Encode(r)
		return
	}
	fmt.Printf("busy-polled UDP ping-pong, 8 B, one way: p50 %.2f µs, p99 %.2f µs (%.2f × p50), p999 %.1f µs\n", r.P50, r.P99, r.Ratio, r.P999)
}
