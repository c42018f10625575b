#!/usr/bin/env bash
# Measures softrnic (rperf, loopback) and the peers a user would pick instead (plain Go
# sockets, iperf3, UCX over TCP, libfabric tcp, Open MPI: whatever the peers script
# measures) in the same run, RUNS times each, and prints the README's figures table:
# medians, and the ratios against the project's bars.
#   bench/compare.sh --peers SCRIPT        full runs (RUNS=5: about 10 minutes on 2 cores)
#   RUNS=1 bench/compare.sh --peers SCRIPT one run each
#   bench/compare.sh                       softrnic alone (every peer column "–")
# --peers SCRIPT (or SOFTRNIC_PEERS=SCRIPT) is the peers script (bench/lib.sh says what it
# prints; the development workspace's ../shared/bench/peers.sh installs what it needs from
# Debian's packages, iperf3, ucx-utils, libfabric-bin, openmpi-bin, which needs root).
# Runs from any directory; the raw results stay in a temporary directory it names.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_options "$@"
if [ ${#rest[@]} -gt 0 ]; then
  bench_usage >&2
  exit 2
fi
bench_peers compare.sh "measuring softrnic alone, every peer column stays empty"
cd "$bench_root"
runs=${RUNS:-5}
out=$(mktemp -d)
go build -o "$out/rperf" ./cmd/rperf
: > "$out/peers.txt"
: > "$out/rperf.jsonl"
for i in $(seq "$runs"); do
  if [ -n "$peers" ]; then
    bash "$peers" >> "$out/peers.txt" 2>"$out/peers.err" || true
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
if [ -n "$peers" ]; then
  for p in go-udp iperf3 ucx-tcp libfabric-tcp openmpi-tcp; do
    grep -q "^$p" "$out/peers.txt" || echo "compare.sh: peer $p gave no figures (see $out/peers.err; installing its package needs root)" >&2
  done
fi
go run ./bench/summarize -peers "$out/peers.txt" -rperf "$out/rperf.jsonl"
echo "raw results: $out"
