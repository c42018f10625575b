#!/usr/bin/env bash
# Measures softrnic (rperf, loopback) and the peers a user would pick instead
# (../shared/bench/peers.sh: plain Go sockets, iperf3, UCX over TCP, libfabric tcp, Open MPI)
# in the same run, RUNS times each, and prints the README's figures table: medians and the
# ratios the issues set as bars.
#   bench/compare.sh            full runs (about 5 minutes)
#   RUNS=1 bench/compare.sh     one run each (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
peers=${PEERS:-../shared/bench/peers.sh}
runs=${RUNS:-5}
out=$(mktemp -d)
go build -o "$out/rperf" ./cmd/rperf
: > "$out/peers.txt"
: > "$out/rperf.jsonl"
for i in $(seq "$runs"); do
  if [ -x "$peers" ] || [ -f "$peers" ]; then
    bash "$peers" >> "$out/peers.txt" 2>/dev/null || true
  fi
  r() { "$out/rperf" "$@" --loopback --json >> "$out/rperf.jsonl"; }
  "$out/rperf" write_bw --loopback -n 5000 > /dev/null # warm-up, discarded
  r write_bw -s 65536 -n 20000
  r write_bw -s 1M -n 2000
  r read_bw -s 65536 -n 20000
  r send_bw -s 65536 -n 20000
  r send_bw -s 1M -n 2000
  r send_lat -s 8 -n 20000
  r write_lat -s 8 -n 20000
  r read_lat -s 8 -n 20000
  r atomic_lat -s 8 -n 20000
done
go run ./bench/summarize -peers "$out/peers.txt" -rperf "$out/rperf.jsonl"
echo "raw results: $out"
