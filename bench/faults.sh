#!/usr/bin/env bash
# Measures write_bw and send_bw at 64 KiB and 1 MiB in ordered and weakly-ordered mode,
# fault-free and under SOFTRNIC_FAULTS-style loss (0.1%, 1%, 3%) and reordering (5%), and
# prints the README's table: medians of RUNS rounds (default 3), in one run of the machine.
# In a round, one test's settings run back to back (fault-free first, each fault in both
# modes), and the table's ratios are medians of each round's own ratios: this machine's
# speed changes by 2x from one minute to the next, which a ratio of medians taken minutes
# apart would show as a fault's cost.
#   bench/faults.sh            three rounds (RUNS=3)
#   RUNS=1 bench/faults.sh     one round
# Runs from any directory; the raw results stay in a temporary directory it names.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_help "$@"
cd "$bench_root"
runs=${RUNS:-3}
out=$(mktemp -d)
go build -o "$out/rperf" ./cmd/rperf
faults=("none" "loss=0.001" "loss=0.01" "loss=0.03" "reorder=0.05")
# Each run moves about 1.2 GiB (a second or less), except ordered mode under 1 % and 3 % loss
# and reordering, which moves a twentieth of that at its 30-600 MiB/s: shorter runs made the
# weak mode's ratios mostly noise.
for i in $(seq "$runs"); do
  for t in "write_bw -s 65536 20000" "write_bw -s 1M 1200" "send_bw -s 65536 20000" "send_bw -s 1M 1200"; do
    read -r test sflag size iters <<< "$t"
    for f in "${faults[@]}"; do
      for mode in weak ordered; do
        n=$iters
        case "$mode/$f" in ordered/loss=0.01|ordered/loss=0.03|ordered/reorder=0.05) n=$((iters / 20)) ;; esac
        args=(--loopback --json --stats --ordering "$mode" -n "$n")
        [ "$f" != none ] && args+=(--faults "$f,seed=$i")
        "$out/rperf" "$test" "$sflag" "$size" "${args[@]}" | sed "s/^{/{\"round\":$i,\"faults\":\"$f\",/" >> "$out/results.jsonl"
      done
    done
  done
done
go run ./bench/faulttable "$out/results.jsonl"
echo "raw results: $out"
