// Command faulttable turns bench/faults.sh's results (rperf --json lines tagged with the
// round and the fault setting) into a markdown table: both modes side by side, medians over
// rounds. The ratios (a fault's share of the fault-free rate, weak against ordered) are the
// medians of each round's own ratios, not ratios of medians: the rounds' settings run close
// together, the rounds minutes apart, and the machine's speed changes in between.
//
//	go run ./bench/faulttable RESULTS.jsonl     the table, on standard output
//
// bench/faults.sh runs it on the results it gathered.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
)

type result struct {
	Round    int     `json:"round"`
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
	byRound := map[key]map[int]float64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r result
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		k := key{r.Test, r.Faults, r.Ordering, r.Size}
		bw[k] = append(bw[k], r.BW)
		if byRound[k] == nil {
			byRound[k] = map[int]float64{}
		}
		byRound[k][r.Round] = r.BW
		rtx[k] = append(rtx[k], r.Counters.Client.Retransmits/max(r.Counters.Client.TxPackets, 1)*100)
	}
	fmt.Println("| test | size | faults | weak MiB/s | weak, % of its fault-free | weak retransmitted, % of packets | ordered MiB/s | ordered retransmitted | weak / ordered |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, test := range []string{"write_bw", "send_bw"} {
		for _, size := range []int{65536, 1 << 20} {
			clean := key{test, "none", "weak", size}
			for _, fl := range []string{"none", "loss=0.001", "loss=0.01", "loss=0.03", "reorder=0.05"} {
				wk, ok := key{test, fl, "weak", size}, key{test, fl, "ordered", size}
				w, o := median(bw[wk]), median(bw[ok])
				if w == 0 && o == 0 {
					continue
				}
				sz := "64 KiB"
				if size == 1<<20 {
					sz = "1 MiB"
				}
				fmt.Printf("| %s | %s | %s | %.0f | %.0f%% | %.2f%% | %.0f | %.2f%% | %.1f× |\n", test, sz, fl, w, ratio(byRound, wk, clean)*100,
					median(rtx[wk]), o, median(rtx[ok]), ratio(byRound, wk, ok))
			}
		}
	}
}

// ratio is the median over rounds of a's rate over b's in the same round.
func ratio(byRound map[key]map[int]float64, a, b key) float64 {
	var v []float64
	for round, x := range byRound[a] {
		if y := byRound[b][round]; y > 0 {
			v = append(v, x/y)
		}
	}
	return median(v)
}
