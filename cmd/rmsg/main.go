// Command rmsg is the messaging layer's benchmark and check, in the style of the OSU
// micro-benchmarks. Start it under a launcher (rmsgrun, mpirun, srun):
//
//	rmsgrun -np 2 rmsg latency       one-way latency, ping-pong between ranks 0 and 1
//	rmsgrun -np 2 rmsg bw            bandwidth, 64 messages in flight (osu_bw's window)
//	rmsgrun -np 2 rmsg bibw          both directions at once
//	rmsgrun -np 4 rmsg allreduce     Allreduce latency (sum of float64)
//	rmsgrun -np 33 rmsg memory       registered memory per connection: rank 0 sends one
//	                                 small message to every other rank
//	rmsgrun -np 9 rmsg enlarge       what an enlargement costs: rank 0 and each other rank
//	                                 time the round trip that enlarges their connection
//	                                 (-phases 16384,131072: the same first round trip with
//	                                 no enlargement; bench/enlarge.sh compares the two)
//	rmsgrun -np 4 rmsg selftest      point-to-point, enlargement, rendezvous, collectives
//	rmsgrun -np 4 rmsg info          each rank prints what it learnt from its launcher:
//	                                 rank, size, job, ranks on its host, GOMAXPROCS
//	mpirun -np 4 -x SOFTRNIC_ROOT=127.0.0.1:29500 rmsg selftest
//	SOFTRNIC_ROOT=127.0.0.1 srun -n 4 rmsg selftest
//
// Rank 0 prints the results; with --json one object per result (test, size, figures).
// With --metrics HOST:PORT each rank serves its counters while it runs (the launcher's
// rank r on PORT+r): Prometheus text at /metrics, expvar JSON at /debug/vars
// (docs/metrics.md).
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/internal/metricshttp"
	"github.com/softrnic/softrnic/internal/perf"
	"github.com/softrnic/softrnic/metrics"
	"github.com/softrnic/softrnic/msg"
	"github.com/softrnic/softrnic/verbs"
)

type result struct {
	Test      string  `json:"test"`
	Size      int     `json:"size"`
	Ranks     int     `json:"ranks"`
	LatencyUS float64 `json:"latency_us,omitempty"`
	P50US     float64 `json:"p50_us,omitempty"`
	MBps      float64 `json:"mb_per_s,omitempty"`
	// memory
	// enlarge
	FirstUS    float64 `json:"first_us,omitempty"`
	SteadyUS   float64 `json:"steady_us,omitempty"`
	SmallRTTUS float64 `json:"small_rtt_us,omitempty"`
	ExtraRTTs  float64 `json:"extra_rtts,omitempty"`
	Enlarged   bool    `json:"enlarged,omitempty"` // enlarge: the timed first round trip enlarged the connection
	// enlarge: the steps of the enlargement (msg.EnlargementTimes), the sender's (rank 0)
	// and the receiver's (the peer), medians over the connections.
	AckWaitUS     float64 `json:"ack_wait_us,omitempty"`
	ProvisionUS   float64 `json:"provision_us,omitempty"`
	ToFirstSendUS float64 `json:"to_first_send_us,omitempty"`
	ServeUS       float64 `json:"serve_us,omitempty"`
	AckPostUS     float64 `json:"ack_post_us,omitempty"`
	Conns         int     `json:"conns,omitempty"`
	PerConnBytes  int     `json:"per_conn_bytes,omitempty"`
	LargeBytes    int     `json:"large_per_conn_bytes,omitempty"`
}

func main() {
	fs := flag.NewFlagSet("rmsg", flag.ExitOnError)
	jsonOut := fs.Bool("json", false, "print one JSON object per result")
	sizesFlag := fs.String("s", "", "message sizes, comma-separated (default per test)")
	iters := fs.Int("n", 0, "iterations per size (default per test)")
	ordering := fs.String("ordering", "ordered", "offer ordered or weak delivery")
	conns := fs.Int("conns", 0, "memory: measure rank 0 with this many connections, the other ranks all hosted by the launcher's rank 1 (run with -np 2)")
	cpuprofile := fs.String("cpuprofile", "", "write each rank's CPU profile to this file, suffixed with .RANK")
	metricsAddr := fs.String("metrics", "", "serve the rank's counters on this address while it runs (host:port, e.g. 127.0.0.1:9464; the launcher's rank r on port+r, port 0: one the system picks): Prometheus text at /metrics, expvar JSON at /debug/vars")
	phases := fs.String("phases", "", "eager slot sizes, comma-separated, smallest first (default msg.DefaultPhases); enlarge with a first phase of 16384 times the same first round trip without an enlargement")
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rmsg latency|bw|bibw|allreduce|memory|enlarge|selftest|info [flags]   (under rmsgrun, mpirun or srun)")
		os.Exit(2)
	}
	test := os.Args[1]
	fs.Parse(os.Args[2:])
	cfg := msg.Config{}
	for _, f := range strings.Split(*phases, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			cfg.Phases = append(cfg.Phases, n)
		}
	}
	if *ordering == "weak" {
		cfg.Ordering = verbs.OrderingWeak
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if test == "memory" && *conns > 0 {
		if err := memoryMany(ctx, cfg, *conns, *jsonOut, *metricsAddr); err != nil {
			fmt.Fprintln(os.Stderr, "rmsg memory:", err)
			os.Exit(1)
		}
		return
	}
	c, err := msg.Init(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rmsg:", err)
		os.Exit(1)
	}
	if *metricsAddr != "" {
		srv, err := serveMetrics(*metricsAddr, c.Rank())
		if err != nil {
			fmt.Fprintln(os.Stderr, "rmsg:", err)
			os.Exit(1)
		}
		defer srv.Close()
		metrics.AddComm(c)
	}
	if *cpuprofile != "" {
		stop, err := perf.StartCPUProfile(fmt.Sprintf("%s.%d", *cpuprofile, c.Rank()))
		if err != nil {
			fmt.Fprintln(os.Stderr, "rmsg:", err)
			os.Exit(1)
		}
		defer stop()
	}
	var sizes []int
	for _, f := range strings.Split(*sizesFlag, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			sizes = append(sizes, n)
		}
	}
	out := func(r result) {
		if c.Rank() != 0 {
			return
		}
		r.Ranks = c.Size()
		if *jsonOut {
			b, _ := json.Marshal(r)
			fmt.Println(string(b))
			return
		}
		switch {
		case r.FirstUS > 0:
			how := "it enlarged them"
			if !r.Enlarged {
				how = "no enlargement: the first phase holds the message"
			}
			fmt.Printf("%-10s %9d B first round trip %.1f us, then %.1f us; a small round trip %.1f us: the first took %.2f small round trips more than the steady one (median of %d connections; %s)\n",
				r.Test, r.Size, r.FirstUS, r.SteadyUS, r.SmallRTTUS, r.ExtraRTTs, r.Conns, how)
			if r.Enlarged {
				fmt.Printf("%-10s the enlargement's steps: acknowledgement %.1f us after the request was written (the receiver's provisioning %.1f us and its post %.1f us in it); the sender's provisioning %.1f us; first large post returned %.1f us after the request\n",
					"", r.AckWaitUS, r.ServeUS, r.AckPostUS, r.ProvisionUS, r.ToFirstSendUS)
			}
		case r.Conns > 0:
			printMemory(r)
		case r.MBps > 0:
			fmt.Printf("%-10s %9d B %10.1f MB/s\n", r.Test, r.Size, r.MBps)
		default:
			fmt.Printf("%-10s %9d B %8.2f us (p50 %.2f us)\n", r.Test, r.Size, r.LatencyUS, r.P50US)
		}
	}
	switch test {
	case "latency":
		err = latency(ctx, c, orDefault(sizes, []int{8, 64, 1024, 4096, 16384, 65536, 1 << 20}), *iters, out)
	case "bw", "bibw":
		err = bandwidth(ctx, c, test == "bibw", orDefault(sizes, []int{8, 1024, 16384, 65536, 1 << 20}), *iters, out)
	case "allreduce":
		err = allreduce(ctx, c, orDefault(sizes, []int{8, 1024, 65536}), *iters, out)
	case "memory":
		err = memory(ctx, c, out)
	case "enlarge":
		err = enlarge(ctx, c, out)
	case "info":
		err = info(c, *jsonOut)
	case "selftest":
		err = selftest(ctx, c)
		if err == nil && c.Rank() == 0 {
			fmt.Printf("selftest: %d ranks OK\n", c.Size())
		}
	default:
		err = fmt.Errorf("unknown test %q", test)
	}
	if err == nil {
		err = c.Barrier(ctx)
	}
	c.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "rmsg rank %d: %v\n", c.Rank(), err)
		os.Exit(1)
	}
}

// serveMetrics serves metrics.Default (the process's communicators) on addr with its
// port moved up by rank, so that the ranks a launcher starts on one host do not clash
// (port 0: one the system picks), and says where.
func serveMetrics(addr string, rank int) (*metricshttp.Server, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics %q: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p+rank > 65535 {
		return nil, fmt.Errorf("--metrics %q: bad port", addr)
	}
	if p != 0 {
		p += rank
	}
	srv, err := metricshttp.Start(net.JoinHostPort(host, strconv.Itoa(p)), metrics.Default)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "rmsg rank %d: metrics at http://%s/metrics\n", rank, srv.Addr())
	return srv, nil
}

func orDefault(v, d []int) []int {
	if len(v) == 0 {
		return d
	}
	return v
}

func itersFor(n, size int) int {
	if n > 0 {
		return n
	}
	if size >= 1<<20 {
		return 200
	}
	return 2000
}

// latency is osu_latency: ranks 0 and 1 ping-pong; one-way time is half the round trip.
func latency(ctx context.Context, c *msg.Comm, sizes []int, n int, out func(result)) error {
	if c.Size() < 2 {
		return fmt.Errorf("latency needs 2 ranks")
	}
	for _, size := range sizes {
		buf, rbuf := make([]byte, size), make([]byte, size)
		iters := itersFor(n, size)
		warm := iters / 10
		var samples []time.Duration
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		for i := 0; i < iters+warm; i++ {
			t := time.Now()
			switch c.Rank() {
			case 0:
				if err := c.Send(ctx, buf, 1, 1); err != nil {
					return err
				}
				if _, err := c.Recv(ctx, rbuf, 1, 1); err != nil {
					return err
				}
			case 1:
				if _, err := c.Recv(ctx, rbuf, 0, 1); err != nil {
					return err
				}
				if err := c.Send(ctx, buf, 0, 1); err != nil {
					return err
				}
			}
			if i >= warm {
				samples = append(samples, time.Since(t)/2)
			}
		}
		if c.Rank() == 0 {
			var sum time.Duration
			for _, s := range samples {
				sum += s
			}
			slices.Sort(samples)
			out(result{Test: "latency", Size: size, LatencyUS: us(sum / time.Duration(len(samples))), P50US: us(samples[len(samples)/2])})
		}
	}
	return nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

// bandwidth is osu_bw (and osu_bibw): a window of 64 sends, then a short reply.
func bandwidth(ctx context.Context, c *msg.Comm, bi bool, sizes []int, n int, out func(result)) error {
	if c.Size() < 2 {
		return fmt.Errorf("bw needs 2 ranks")
	}
	const window = 64
	if c.Rank() > 1 {
		return nil
	}
	peer := 1 - c.Rank()
	for _, size := range sizes {
		iters := max(itersFor(n, size)/window, 5)
		bufs := make([][]byte, window)
		for i := range bufs {
			bufs[i] = make([]byte, size)
		}
		ack := make([]byte, 4)
		var start time.Time
		for it := -1; it < iters; it++ { // the first round warms up
			if it == 0 {
				start = time.Now()
			}
			reqs := make([]*msg.Request, 0, 2*window)
			if c.Rank() == 0 || bi {
				for i := 0; i < window; i++ {
					reqs = append(reqs, c.Isend(bufs[i], peer, 2))
				}
			}
			if c.Rank() == 1 || bi {
				for i := 0; i < window; i++ {
					reqs = append(reqs, c.Irecv(bufs[i], peer, 2))
				}
			}
			for _, r := range reqs {
				if _, err := r.Wait(ctx); err != nil {
					return err
				}
			}
			if c.Rank() == 1 {
				if err := c.Send(ctx, ack, 0, 3); err != nil {
					return err
				}
			} else if _, err := c.Recv(ctx, ack, 1, 3); err != nil {
				return err
			}
		}
		el := time.Since(start).Seconds()
		total := float64(size) * window * float64(iters)
		if bi {
			total *= 2
		}
		name := "bw"
		if bi {
			name = "bibw"
		}
		out(result{Test: name, Size: size, MBps: total / el / 1e6})
	}
	return nil
}

// allreduce is osu_allreduce: the average time of an Allreduce of size bytes of float64.
func allreduce(ctx context.Context, c *msg.Comm, sizes []int, n int, out func(result)) error {
	for _, size := range sizes {
		k := max(size/8, 1)
		in, res := make([]float64, k), make([]float64, k)
		iters := itersFor(n, size) / 2
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		start := time.Now()
		for i := 0; i < iters; i++ {
			if err := msg.Allreduce(ctx, c, in, res, msg.Sum); err != nil {
				return err
			}
		}
		out(result{Test: "allreduce", Size: k * 8, LatencyUS: us(time.Since(start) / time.Duration(iters))})
	}
	return nil
}

// memory: rank 0 sends one small message to every rank and reports what each
// connection holds registered, next to what large buffers from the start would hold.
func memory(ctx context.Context, c *msg.Comm, out func(result)) error {
	if c.Rank() == 0 {
		for r := 1; r < c.Size(); r++ {
			if err := c.Send(ctx, []byte("hello"), r, 5); err != nil {
				return err
			}
		}
	} else if _, err := c.Recv(ctx, make([]byte, 5), 0, 5); err != nil {
		return err
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	if c.Rank() == 0 {
		m := c.Memory()
		if m.Connections == 0 {
			return fmt.Errorf("no connections")
		}
		per := 0
		for _, p := range m.Peers {
			per = max(per, p.Total())
		}
		large := msg.LargeFromStart(msg.Config{})
		out(result{Test: "memory", Conns: m.Connections, PerConnBytes: per, LargeBytes: large})
	}
	return nil
}

// selftest checks the paths a job uses, between every pair of ranks.
func selftest(ctx context.Context, c *msg.Comm) error {
	n := c.Size()
	sizes := []int{0, 10, 900, 5000, 60000, 300000}
	var reqs []*msg.Request
	for to := 0; to < n; to++ {
		for i, s := range sizes {
			reqs = append(reqs, c.Isend(pat(s, c.Rank(), i), to, i))
		}
	}
	for from := 0; from < n; from++ {
		for i, s := range sizes {
			b := make([]byte, s)
			if _, err := c.Recv(ctx, b, from, i); err != nil {
				return err
			}
			if !bytes.Equal(b, pat(s, from, i)) {
				return fmt.Errorf("message %d from rank %d: wrong data", i, from)
			}
		}
	}
	for _, r := range reqs {
		if _, err := r.Wait(ctx); err != nil {
			return err
		}
	}
	sum := []int64{0}
	if err := msg.Allreduce(ctx, c, []int64{int64(c.Rank() + 1)}, sum, msg.Sum); err != nil {
		return err
	}
	if sum[0] != int64(n*(n+1)/2) {
		return fmt.Errorf("allreduce: sum %d", sum[0])
	}
	g := make([]int32, n)
	if err := msg.Allgather(ctx, c, []int32{int32(c.Rank())}, g); err != nil {
		return err
	}
	for i, v := range g {
		if int(v) != i {
			return fmt.Errorf("allgather: %v", g)
		}
	}
	return nil
}

func pat(n, from, i int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(j*31 + from*7 + i)
	}
	return b
}

// enlarge measures what an enlargement costs: rank 0 and rank r warm their connection
// with small messages, then time the first round trip of a message that needs the next
// phase (it enlarges the ring in both directions), then the same round trip again, and a
// small one. The extra time of the first, in small round trips, is the enlargement's cost.
func enlarge(ctx context.Context, c *msg.Comm, out func(result)) error {
	const size, small = 4000, 64
	big, sm := make([]byte, size), make([]byte, small)
	for i := range big { // the pages are the process's before anything is timed
		big[i] = byte(i)
	}
	// rt is a round trip from rank 0: out goes to peer, which answers with back.
	rt := func(peer int, out, back []byte) (time.Duration, error) {
		t := time.Now()
		if c.Rank() == 0 {
			if err := c.Send(ctx, out, peer, 9); err != nil {
				return 0, err
			}
			if _, err := c.Recv(ctx, back, peer, 9); err != nil {
				return 0, err
			}
		} else {
			if _, err := c.Recv(ctx, out, 0, 9); err != nil {
				return 0, err
			}
			if err := c.Send(ctx, back, 0, 9); err != nil {
				return 0, err
			}
		}
		return time.Since(t), nil
	}
	var first, steady, smallRT []float64
	var ackWait, provision, toFirst, serve, ackPost []float64
	times := make([]byte, 16) // the peer's Serve and AckPost, in ns
	for peer := 1; peer < c.Size(); peer++ {
		if c.Rank() != 0 && c.Rank() != peer {
			continue
		}
		for i := 0; i < 50; i++ {
			if _, err := rt(peer, sm, sm); err != nil {
				return err
			}
		}
		// Rank 0's message enlarges the connection toward the peer; the answer is small.
		f, err := rt(peer, big, sm)
		if err != nil {
			return err
		}
		var st, sr []float64
		for i := 0; i < 50; i++ {
			d, err := rt(peer, big, sm)
			if err != nil {
				return err
			}
			st = append(st, us(d))
			if d, err = rt(peer, sm, sm); err != nil {
				return err
			}
			sr = append(sr, us(d))
		}
		// The peer tells rank 0 its side of the enlargement.
		if c.Rank() == peer {
			e := c.LabStats().LastEnlargement
			binary.LittleEndian.PutUint64(times, uint64(e.Serve))
			binary.LittleEndian.PutUint64(times[8:], uint64(e.AckPost))
			if err := c.Send(ctx, times, 0, 10); err != nil {
				return err
			}
		} else {
			if _, err := c.Recv(ctx, times, peer, 10); err != nil {
				return err
			}
			e := c.LabStats().LastEnlargement
			ackWait, provision, toFirst = append(ackWait, us(e.AckWait)), append(provision, us(e.Provision)), append(toFirst, us(e.ToFirstSend))
			serve = append(serve, us(time.Duration(binary.LittleEndian.Uint64(times))))
			ackPost = append(ackPost, us(time.Duration(binary.LittleEndian.Uint64(times[8:]))))
		}
		slices.Sort(st)
		slices.Sort(sr)
		first, steady, smallRT = append(first, us(f)), append(steady, st[len(st)/2]), append(smallRT, sr[len(sr)/2])
	}
	if c.Rank() == 0 && len(first) > 0 {
		med := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
		extra := make([]float64, len(first))
		for i := range first {
			extra[i] = (first[i] - steady[i]) / smallRT[i]
		}
		r := result{Test: "enlarge", Size: size, FirstUS: med(first), SteadyUS: med(steady), SmallRTTUS: med(smallRT), ExtraRTTs: med(extra), Conns: len(first),
			Enlarged: c.Stats().Enlargements > 0}
		if r.Enlarged {
			r.AckWaitUS, r.ProvisionUS, r.ToFirstSendUS, r.ServeUS, r.AckPostUS = med(ackWait), med(provision), med(toFirst), med(serve), med(ackPost)
		}
		out(r)
	}
	return nil
}

func printMemory(r result) {
	fmt.Printf("%-10s %d connections: %d bytes registered per connection (%d with large buffers from the start: %.0f×)\n",
		r.Test, r.Conns, r.PerConnBytes, r.LargeBytes, float64(r.LargeBytes)/float64(r.PerConnBytes))
}

// memoryMany is the many-connections memory report: a job of n+1 ranks in two processes,
// rank 0 alone in the launcher's rank 0, ranks 1..n in its rank 1 (each with its own
// device, its queues kept small); rank 0 sends each one small message, then reports what
// it holds registered per connection.
func memoryMany(ctx context.Context, cfg msg.Config, n int, jsonOut bool, metricsAddr string) error {
	if err := msg.FromEnv(&cfg); err != nil {
		return err
	}
	if cfg.Size != 2 {
		return fmt.Errorf("-conns needs a job of 2 processes (rmsgrun -np 2), not %d", cfg.Size)
	}
	if metricsAddr != "" {
		srv, err := serveMetrics(metricsAddr, cfg.Rank)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	cfg.Size = n + 1
	if cfg.Rank == 0 {
		c, err := msg.Init(ctx, cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		metrics.AddComm(c)
		if err := memory(ctx, c, func(r result) {
			r.Ranks = c.Size()
			if jsonOut {
				b, _ := json.Marshal(r)
				fmt.Println(string(b))
			} else {
				printMemory(r)
			}
		}); err != nil {
			return err
		}
		return c.Barrier(ctx)
	}
	light := cfg
	light.SRQDepth, light.CQDepth, light.Reserve = 16, 64, -1
	light.Device.DisableGRO, light.Device.SocketBuffer, light.Device.NumCompVectors = true, 256<<10, 1
	errs := make(chan error, n)
	for r := 1; r <= n; r++ {
		go func(r int) {
			cfg := light
			cfg.Rank = r
			c, err := msg.Init(ctx, cfg)
			if err == nil {
				metrics.AddComm(c)
				err = memory(ctx, c, func(result) {})
				if err == nil {
					err = c.Barrier(ctx)
				}
				c.Close()
			}
			if err != nil {
				err = fmt.Errorf("rank %d: %w", r, err)
			}
			errs <- err
		}(r)
	}
	for range n {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

// info prints, on every rank, what the rank learnt from its launcher's environment: its
// rank, the job's size and identity, its device, and the CPUs it runs on (GOMAXPROCS
// after Init, which lowers it when ranks share the host).
func info(c *msg.Comm, jsonOut bool) error {
	host, _ := os.Hostname()
	r := struct {
		Test       string `json:"test"`
		Rank       int    `json:"rank"`
		Ranks      int    `json:"ranks"`
		Job        string `json:"job"`
		Host       string `json:"host"`
		Device     string `json:"device"`
		GOMAXPROCS int    `json:"gomaxprocs"`
		CPUs       int    `json:"cpus"`
	}{"info", c.Rank(), c.Size(), c.Job(), host, c.Device().Addr().String(), runtime.GOMAXPROCS(0), runtime.NumCPU()}
	if jsonOut {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		fmt.Println(string(b))
		return nil
	}
	fmt.Printf("rank %d of %d: job %q, host %s, device %s, GOMAXPROCS %d of %d CPUs\n", r.Rank, r.Ranks, r.Job, r.Host, r.Device, r.GOMAXPROCS, r.CPUs)
	return nil
}
