#!/usr/bin/env bash
# Measures streams over rsocket against Go's TCP on loopback and against rperf's
# send_bw and send_lat, in the same run, RUNS times each (interleaved), and prints the
# table of docs/rsocket.md: medians of bandwidth (64 KiB and 1 MiB transfers), 8-byte
# ping-pong latency, and CPU time per GiB (both processes' user and system time); rperf's
# send_bw between two processes (as the streams run) and in one (--loopback); the
# streams with each process's default GOMAXPROCS (2 here: four Ps on two CPUs) and with
# GOMAXPROCS=1 (each process one CPU, as on a machine with CPUs to spare); and 64 KiB
# transfers with --nodelay (every write its own message, as librdmacm sends them).
#   bench/rsocket.sh            RUNS=5 (about 5 minutes on 2 cores)
#   RUNS=1 bench/rsocket.sh     one run each
# rstream's exchange: the client writes COUNT transfers, then the server writes as many
# back; a server and a client process each, devices on 127.0.0.2 and 127.0.0.1 (rstream's
# default buffers: 1 MiB rings). The raw JSON lines stay in a temporary directory it names.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_help "$@"
cd "$bench_root"
runs=${RUNS:-5}
out=$(mktemp -d)
go build -o "$out/rstream" ./cmd/rstream
go build -o "$out/rperf" ./cmd/rperf
: > "$out/results.jsonl"
port=17471
# pair NAME ARGS...: an rstream server and client, both sides' JSON tagged with NAME.
pair() {
  local name=$1
  shift
  port=$((port + 1))
  local dev=(-b 127.0.0.2 --udp-port $((port + 10000)))
  if [[ " $* " == *" -T s "* ]]; then dev=(-b 127.0.0.2); fi
  "$out/rstream" "${dev[@]}" -p $port --json "$@" > "$out/server.txt" 2>&1 &
  local srv=$!
  local tries=0
  until "$out/rstream" -s 127.0.0.2 -b 127.0.0.1 ${dev[2]:+--udp-port $((port + 10000))} -p $port --json "$@" > "$out/client.txt" 2>&1; do
    tries=$((tries + 1))
    if [ $tries -ge 50 ]; then cat "$out/client.txt" >&2; kill $srv; exit 1; fi
    sleep 0.1 # the server is not listening yet
  done
  wait $srv
  grep -h '^{' "$out/server.txt" "$out/client.txt" | sed "s/^{/{\"bench\":\"$name\",\"round\":$i,/" >> "$out/results.jsonl"
}
# rperf2 NAME ARGS...: rperf send_bw between a server and a client process (devices on
# 127.0.0.2 and 127.0.0.1), the client's JSON tagged with NAME.
rperf2() {
  local name=$1
  shift
  port=$((port + 1))
  "$out/rperf" send_bw -p $port --dev-addr 127.0.0.2 > "$out/server.txt" 2>&1 &
  local srv=$!
  local tries=0
  until "$out/rperf" send_bw 127.0.0.2 -p $port --dev-addr 127.0.0.1 --json "$@" > "$out/client.txt" 2>&1; do
    tries=$((tries + 1))
    if [ $tries -ge 50 ]; then cat "$out/client.txt" >&2; kill $srv; exit 1; fi
    sleep 0.1 # the server is not listening yet
  done
  wait $srv
  grep -h '^{' "$out/client.txt" | sed "s/^{/{\"bench\":\"$name\",\"round\":$i,/" >> "$out/results.jsonl"
}
for i in $(seq "$runs"); do
  for p in 2 1; do
    for t in rsocket tcp; do
      flag=()
      if [ $t = tcp ]; then flag=(-T s); fi
      GOMAXPROCS=$p pair "$t.$p 64KiB" "${flag[@]}" -S 65536 -C 5000
      GOMAXPROCS=$p pair "$t.$p 1MiB" "${flag[@]}" -S 1048576 -C 400
      GOMAXPROCS=$p pair "$t.$p 8B" "${flag[@]}" -S 8 -C 1 -I 20000
    done
    GOMAXPROCS=$p pair "nodelay.$p 64KiB" --nodelay -S 65536 -C 5000
    GOMAXPROCS=$p rperf2 "rperf2.$p 64KiB" -s 65536 -n 20000
    GOMAXPROCS=$p rperf2 "rperf2.$p 1MiB" -s 1M -n 2000
  done
  "$out/rperf" send_bw --loopback -s 65536 -n 20000 --json | sed "s/^{/{\"bench\":\"rperf 64KiB\",\"round\":$i,/" >> "$out/results.jsonl"
  "$out/rperf" send_bw --loopback -s 1M -n 2000 --json | sed "s/^{/{\"bench\":\"rperf 1MiB\",\"round\":$i,/" >> "$out/results.jsonl"
  "$out/rperf" send_lat --loopback -s 8 -n 20000 --json | sed "s/^{/{\"bench\":\"rperf 8B\",\"round\":$i,/" >> "$out/results.jsonl"
done
echo "raw results: $out/results.jsonl"
python3 - "$out/results.jsonl" <<'PY'
import json, sys, statistics as st
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
bw, lat, cpu = defaultdict(list), defaultdict(list), defaultdict(lambda: defaultdict(float))
for r in rows:
    b = r["bench"]
    if b.startswith("rperf"):
        if "lat_us" in r:
            lat[b].append(r["lat_us"]["p50"])  # one way (half the round trip), as rstream's usec/xfer
        else:
            bw[b].append(r["bw_MiBps"])
        cpu[b][r["round"]] += r["cpu_s_per_GiB"]
        continue
    cpu[b][r["round"]] += r["cpu_s_per_GiB"]  # both processes
    if r["role"] == "client":
        if b.endswith("8B"):
            lat[b].append(r["usec_per_xfer"])
        else:
            bw[b].append(r["bw_MiBps"])
med = lambda v: st.median(v) if v else float("nan")
print("| | rsocket | Go TCP | rsocket / TCP | rperf send_bw, two processes | rsocket / rperf | rperf --loopback, one process | rsocket / loopback |")
print("|---|---|---|---|---|---|---|---|")
for p, procs in (("2", "two processes"), ("1", "two processes, GOMAXPROCS=1 each")):
    for size in ["64KiB", "1MiB"]:
        r, t, q2, q = (med(bw[k]) for k in (f"rsocket.{p} {size}", f"tcp.{p} {size}", f"rperf2.{p} {size}", f"rperf {size}"))
        print(f"| {size} transfers, MiB/s ({procs}) | {r:.0f} | {t:.0f} | {r/t:.2f} | {q2:.0f} | {r/q2:.2f} | {q:.0f} | {r/q:.2f} |")
        rc, tc, pc = (med(list(cpu[k].values())) for k in (f"rsocket.{p} {size}", f"tcp.{p} {size}", f"rperf {size}"))
        print(f"| {size}: CPU s per GiB ({procs}) | {rc:.2f} | {tc:.2f} | {rc/tc:.2f} | | | {pc:.2f} | {rc/pc:.2f} |")
    r, t, q2, q = (med(bw[k]) for k in (f"nodelay.{p} 64KiB", f"tcp.{p} 64KiB", f"rperf2.{p} 64KiB", "rperf 64KiB"))
    print(f"| 64KiB transfers with --nodelay, MiB/s ({procs}) | {r:.0f} | {t:.0f} | {r/t:.2f} | {q2:.0f} | {r/q2:.2f} | {q:.0f} | {r/q:.2f} |")
    r, t, q = med(lat[f"rsocket.{p} 8B"]), med(lat[f"tcp.{p} 8B"]), med(lat["rperf 8B"])
    print(f"| 8 B ping-pong, µs one way ({procs}) | {r:.1f} | {t:.1f} | {r/t:.2f} | | | {q:.1f} | {r/q:.2f} |")
PY
