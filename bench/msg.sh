#!/usr/bin/env bash
# The messaging layer side by side with Open MPI over TCP (from the peers script) and with
# rperf, in one run on this machine; prints each figure and the ratios against the bars:
#   8-byte one-way latency, rmsg / Open MPI over TCP   (bar: <= 1)
#   1 MiB bandwidth, rmsg bw / rperf write_bw           (bar: >= 0.8), against rperf in
#   one process (--loopback) and between two processes, as rmsg runs
# Usage: bench/msg.sh [--peers SCRIPT] [quick]
# --peers SCRIPT (or SOFTRNIC_PEERS=SCRIPT) is the peers script whose openmpi-tcp lines give
# the Open MPI figures (bench/lib.sh says what it prints); without one those stay "nan".
# quick asks the peers script for shorter runs. About 20 s without peers; runs from any
# directory.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_options "$@"
quick=
case "${rest[*]}" in
  "") ;;
  quick) quick=quick ;;
  *) bench_usage >&2; exit 2 ;;
esac
bench_peers msg.sh "measuring softrnic alone, the Open MPI figures stay empty"
cd "$bench_root"
tmp=$(mktemp -d)
go build -o "$tmp/rmsg" ./cmd/rmsg
go build -o "$tmp/rmsgrun" ./cmd/rmsgrun
go build -o "$tmp/rperf" ./cmd/rperf
if [ -n "$peers" ]; then
  bash "$peers" $quick 2>/dev/null | grep '^openmpi-tcp' > "$tmp/ompi.txt" || true
fi
"$tmp/rmsgrun" -np 2 "$tmp/rmsg" latency -s 8,65536,1048576 --json | sed 's/^\[0\] //' > "$tmp/lat.json"
"$tmp/rmsgrun" -np 2 "$tmp/rmsg" bw -s 65536,1048576 --json | sed 's/^\[0\] //' > "$tmp/bw.json"
"$tmp/rperf" write_bw --loopback -s 1M --json > "$tmp/rperf.json"
port=$((20000 + RANDOM % 20000))
"$tmp/rperf" write_bw -p "$port" > /dev/null 2>&1 &
server=$!
for _ in $(seq 50); do
  if "$tmp/rperf" write_bw 127.0.0.1 -p "$port" -s 1M --json > "$tmp/rperf2.json" 2>/dev/null; then break; fi
  sleep 0.1
done
wait "$server" || true
python3 - "$tmp" <<'PY'
import json, sys, os
d = sys.argv[1]
def jl(f):
    out = []
    for line in open(os.path.join(d, f)):
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out
lat = {r["size"]: r for r in jl("lat.json")}
bw = {r["size"]: r for r in jl("bw.json")}
ompi = {}
if os.path.exists(os.path.join(d, "ompi.txt")):
    for line in open(os.path.join(d, "ompi.txt")):
        f = line.split("\t")
        if len(f) >= 5:
            ompi[(f[1], int(f[2]))] = float(f[3])
print("size      rmsg lat p50 us   Open MPI tcp us   rmsg bw MB/s   Open MPI tcp MB/s")
for s in (8, 65536, 1048576):
    l = lat.get(s, {}).get("p50_us", float("nan"))
    b = bw.get(s, {}).get("mb_per_s", float("nan"))
    print(f"{s:<9} {l:>15.2f} {ompi.get(('pingpong-one-way', s), float('nan')):>17.2f} {b:>14.1f} {ompi.get(('stream-window64', s), float('nan')):>19.1f}")
if ("pingpong-one-way", 8) in ompi and 8 in lat:
    print(f"8 B latency, rmsg p50 / Open MPI over TCP: {lat[8]['p50_us'] / ompi[('pingpong-one-way', 8)]:.2f} (bar <= 1)")
for f, how in (("rperf.json", "in one process"), ("rperf2.json", "between two processes")):
    w = [r for r in jl(f) if r.get("test") == "write_bw"] if os.path.exists(os.path.join(d, f)) else []
    if w and 1048576 in bw and w[0].get("bw_MiBps"):
        mbps = w[0]["bw_MiBps"] * 1.048576
        print(f"1 MiB bandwidth, rmsg bw / rperf write_bw {how} ({mbps:.0f} MB/s): {bw[1048576]['mb_per_s'] / mbps:.2f} (bar >= 0.8)")
    else:
        print(f"rperf write_bw {how}: no result")
PY
