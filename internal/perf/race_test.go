//go:build race

package perf

// raceEnabled: the race detector is on. write_bw's --check and write_lat read memory a
// peer's RDMA WRITE landed in, ordered by the network, not by anything Go sees; tests
// that want a clean race run leave them out.
const raceEnabled = true
