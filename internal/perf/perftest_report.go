package perf

import (
	"fmt"
	"strings"
)

// perftest's result table (perftest_parameters.h of 4.5-0.17: RESULT_LINE, RESULT_FMT,
// RESULT_FMT_LAT, REPORT_FMT, REPORT_FMT_LAT), so that rperf's lines in perftest mode
// read as perftest's and can be compared line by line.

// PerftestLine is the rule perftest prints around its results.
const PerftestLine = "---------------------------------------------------------------------------------------"

// PerftestTitle returns the title perftest prints above a test's table ("RDMA_Write BW
// Test", "Atomic FETCH_AND_ADD Latency Test", ...), indented as perftest's.
func PerftestTitle(test, atomicType string) string {
	verb, kind, _ := strings.Cut(test, "_")
	name := map[string]string{"write": "RDMA_Write", "read": "RDMA_Read", "send": "Send"}[verb]
	if verb == "atomic" {
		if atomicType == "" {
			atomicType = AtomicTypes[0]
		}
		name = "Atomic " + atomicType
	}
	return fmt.Sprintf("                    %s %s Test", name, map[string]string{"bw": "BW", "lat": "Latency"}[kind])
}

// PerftestHeader returns the column titles perftest prints for test.
func PerftestHeader(test string) string {
	if isBW(test) {
		return " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
	}
	return " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
}

// PerftestRow formats r as perftest prints a result (MB/sec is MiB/s, as perftest's).
func (r Result) PerftestRow() string {
	if l := r.Lat; l != nil {
		return fmt.Sprintf(" %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f",
			r.Size, r.Iters, l.Min, l.Max, l.P50, l.Avg, l.Stdev, l.P99, l.P999)
	}
	return fmt.Sprintf(" %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f", r.Size, r.Iters, r.BWPeak, r.BW, r.MsgRate)
}
