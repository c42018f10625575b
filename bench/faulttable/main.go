// Command faulttable turns bench/faults.sh's results (rperf --json lines tagged with the
// fault setting) into a markdown table: both modes side by side, medians over rounds.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
)

type result struct {
	Faults   string  `json:"faults"`
	Test     string  `json:"test"`
	Size     int     `json:"size"`
	Ordering string  `json:"ordering"`
	BW       float64 `json:"bw_MiBps"`
	Counters struct {
		Client struct {
			TxPackets            float64
			Retransmits          float64
			SelectiveRetransmits float64
		} `json:"client"`
	} `json:"counters"`
}

type key struct {
	test, faults, mode string
	size               int
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
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bw := map[key][]float64{}
	rtx := map[key][]float64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r result
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		k := key{r.Test, r.Faults, r.Ordering, r.Size}
		bw[k] = append(bw[k], r.BW)
		rtx[k] = append(rtx[k], r.Counters.Client.Retransmits/max(r.Counters.Client.TxPackets, 1)*100)
	}
	fmt.Println("| test | size | faults | weak MiB/s | weak, % of its fault-free | weak retransmitted, % of packets | ordered MiB/s | ordered retransmitted | weak / ordered |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, test := range []string{"write_bw", "send_bw"} {
		for _, size := range []int{65536, 1 << 20} {
			clean := median(bw[key{test, "none", "weak", size}])
			for _, fl := range []string{"none", "loss=0.001", "loss=0.01", "loss=0.03", "reorder=0.05"} {
				w := median(bw[key{test, fl, "weak", size}])
				o := median(bw[key{test, fl, "ordered", size}])
				if w == 0 && o == 0 {
					continue
				}
				sz := "64 KiB"
				if size == 1<<20 {
					sz = "1 MiB"
				}
				fmt.Printf("| %s | %s | %s | %.0f | %.0f%% | %.2f%% | %.0f | %.2f%% | %.1f× |\n", test, sz, fl, w, w/clean*100,
					median(rtx[key{test, fl, "weak", size}]), o, median(rtx[key{test, fl, "ordered", size}]), w/o)
			}
		}
	}
}
