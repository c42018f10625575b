// Command summarize turns the output of bench/compare.sh (the peers script's lines and
// rperf JSON lines, several runs each) into a markdown table of medians and ratios.
//
//	go run ./bench/summarize -peers PEERS.txt -rperf RPERF.jsonl
//
// bench/compare.sh runs it on what it gathered.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

type key struct {
	peer, test string
	size       int
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func main() {
	peersFile := flag.String("peers", "", "peers.sh output")
	rperfFile := flag.String("rperf", "", "rperf --json output")
	flag.Parse()
	peers := map[key][]float64{}
	units := map[key]string{}
	if f, err := os.Open(*peersFile); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Split(sc.Text(), "\t")
			if len(fs) != 5 {
				continue
			}
			size, _ := strconv.Atoi(fs[2])
			v, err := strconv.ParseFloat(fs[3], 64)
			if err != nil {
				continue
			}
			k := key{fs[0], fs[1], size}
			peers[k] = append(peers[k], v)
			units[k] = fs[4]
		}
		f.Close()
	}
	type res struct {
		Test string  `json:"test"`
		Size int     `json:"size"`
		BW   float64 `json:"bw_MiBps"`
		Lat  *struct {
			P50 float64 `json:"p50"`
			P99 float64 `json:"p99"`
		} `json:"lat_us"`
	}
	bw := map[key][]float64{}
	p50 := map[key][]float64{}
	p99 := map[key][]float64{}
	f, err := os.Open(*rperfFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r res
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		k := key{"softrnic", r.Test, r.Size}
		if r.Lat != nil {
			p50[k] = append(p50[k], r.Lat.P50)
			p99[k] = append(p99[k], r.Lat.P99)
		} else {
			bw[k] = append(bw[k], r.BW)
		}
	}
	n := 0
	for _, v := range bw {
		n = max(n, len(v))
	}
	fmt.Printf("softrnic rperf (loopback, both sides in one process) and peers on this machine, same run; medians (and ranges) of %d runs.\n\n", n)
	fmt.Println("| measure | softrnic | compared with | its value | ratio softrnic/peer | bar |")
	fmt.Println("|---|---|---|---|---|---|")
	row := func(name string, runs []float64, unit string, pk key, bar string) {
		ours := median(runs)
		spread := ""
		if len(runs) > 1 {
			spread = fmt.Sprintf(" (%.1f–%.1f)", slices.Min(runs), slices.Max(runs))
		}
		pv := median(peers[pk])
		ratio := "–"
		peer := "–"
		if pv > 0 && ours > 0 {
			ratio = fmt.Sprintf("%.2f×", ours/pv)
			peer = fmt.Sprintf("%.1f %s", pv, units[pk])
		}
		who := fmt.Sprintf("%s %s %d B", pk.peer, pk.test, pk.size)
		if pk.peer == "" {
			who = "–"
		}
		if ps := peers[pk]; len(ps) > 1 && pv > 0 {
			peer += fmt.Sprintf(" (%.1f–%.1f)", slices.Min(ps), slices.Max(ps))
		}
		fmt.Printf("| %s | %.1f %s%s | %s | %s | %s | %s |\n", name, ours, unit, spread, who, peer, ratio, bar)
	}
	s := func(t string, size int) key { return key{"softrnic", t, size} }
	row("write_bw 64 KiB", bw[s("write_bw", 65536)], "MiB/s", key{"ucx-tcp", "ucp_put_bw", 65536}, "≥ 1× UCX ucp_put_bw")
	row("write_bw 1 MiB", bw[s("write_bw", 1<<20)], "MiB/s", key{"ucx-tcp", "tag_bw", 1 << 20}, "")
	row("read_bw 64 KiB", bw[s("read_bw", 65536)], "MiB/s", key{"ucx-tcp", "ucp_get", 65536}, "≥ 10× UCX ucp_get")
	row("send_bw 64 KiB", bw[s("send_bw", 65536)], "MiB/s", key{"ucx-tcp", "tag_bw", 65536}, "")
	row("send_bw 1 MiB", bw[s("send_bw", 1<<20)], "MiB/s", key{"go-tcp", "stream", 1 << 20}, "")
	row("send_lat 8 B p50 (one way)", p50[s("send_lat", 8)], "µs", key{"ucx-tcp", "tag_lat", 8}, "≤ 2× UCX tag_lat")
	row("send_lat 8 B p99", p99[s("send_lat", 8)], "µs", key{}, "")
	row("write_lat 8 B p50 (one way)", p50[s("write_lat", 8)], "µs", key{"libfabric-tcp", "pingpong-one-way", 8}, "")
	row("read_lat 8 B p50 (round trip)", p50[s("read_lat", 8)], "µs", key{"go-udp", "pingpong-one-way", 8}, "")
	row("atomic_lat 8 B p50 (round trip)", p50[s("atomic_lat", 8)], "µs", key{}, "")
	fmt.Println()
	fmt.Println("Peers measured in the same run (medians):")
	fmt.Println()
	var keys []key
	for k := range peers {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
	})
	for _, k := range keys {
		fmt.Printf("- %s %s %d B: %.2f %s\n", k.peer, k.test, k.size, median(peers[k]), units[k])
	}
}
