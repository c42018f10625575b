#!/usr/bin/env bash
# Measures softrnic (rperf, loopback) and the peers a user would pick instead
# (../shared/bench/peers.sh: plain Go sockets, iperf3, UCX over TCP, libfabric tcp, Open MPI)
# in the same run, RUNS times each, and prints the README's figures table: medians and the
# ratios the issues set as bars.
#   bench/compare.sh            full runs (RUNS=5: about 10 minutes on 2 cores)
#   RUNS=1 bench/compare.sh     one run each
#   PEERS=none bench/compare.sh softrnic alone (every peer column "–")
# The peers come from ../shared/bench/peers.sh (the shared folder beside this checkout; set
# PEERS=/path/to/peers.sh elsewhere). It installs what it needs from Debian's packages
# (iperf3, ucx-utils, libfabric-bin, openmpi-bin), which needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
peers=${PEERS:-../shared/bench/peers.sh}
runs=${RUNS:-5}
if [ "$peers" != none ] && [ ! -f "$peers" ]; then
  echo "compare.sh: no peers script at $peers: the peer columns would all be empty." >&2
  echo "  It is ../shared/bench/peers.sh in the project's workspace; point PEERS at a copy," >&2
  echo "  or run PEERS=none bench/compare.sh to measure softrnic alone." >&2
  exit 1
fi
out=$(mktemp -d)
go build -o "$out/rperf" ./cmd/rperf
: > "$out/peers.txt"
: > "$out/rperf.jsonl"
for i in $(seq "$runs"); do
  if [ "$peers" != none ]; then
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
if [ "$peers" != none ]; then
  for p in go-udp iperf3 ucx-tcp libfabric-tcp openmpi-tcp; do
    grep -q "^$p" "$out/peers.txt" || echo "compare.sh: peer $p gave no figures (see $out/peers.err; installing its package needs root)" >&2
  done
fi
go run ./bench/summarize -peers "$out/peers.txt" -rperf "$out/rperf.jsonl"
echo "raw results: $out"
