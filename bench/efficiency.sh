#!/usr/bin/env bash
# The single-flow and multi-queue bars, from one run on this machine: softrnic (rperf,
# loopback, both sides in one process) next to a plain Go UDP stream of 64 KB datagrams,
# send_lat between two rperf processes next to UCX over TCP's tag_lat (also two processes)
# and in one, and 8 QPs between two rperf processes with 1, 2 and 4 receive queues per
# device; each measured RUNS times (default 3) in turns; medians and ratios.
#   bench/efficiency.sh --peers SCRIPT     about 2 minutes a run on 2 cores
#   RUNS=1 bench/efficiency.sh --peers SCRIPT
#   bench/efficiency.sh                    softrnic's figures alone (references "–")
# CPU time per GiB is user + system of the one process holding both sides: rperf's own
# (getrusage over the measured interval, --json cpu_s_per_GiB), and for the Go UDP stream
# /usr/bin/time over the whole run. The references come with the peers script, --peers
# SCRIPT or SOFTRNIC_PEERS=SCRIPT (bench/lib.sh says what it prints): UCX's tag_lat from
# the script, the Go UDP stream from the Go program in the gobaseline folder beside it.
# Runs from any directory; the raw figures stay in a temporary directory it names.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_options "$@"
if [ ${#rest[@]} -gt 0 ]; then
  bench_usage >&2
  exit 2
fi
bench_peers efficiency.sh "measuring softrnic alone, the Go UDP and UCX references stay empty"
cd "$bench_root"
runs=${RUNS:-3}
dur=5
out=$(mktemp -d)
go build -o "$out/rperf" ./cmd/rperf
gobaseline=
if [ -n "$peers" ]; then
  if [ -d "$(dirname "$peers")/gobaseline" ] && (cd "$(dirname "$peers")/gobaseline" && go build -o "$out/gobaseline" .); then
    gobaseline=$out/gobaseline
  else
    echo "efficiency.sh: no Go baseline to build in $(dirname "$peers")/gobaseline: the Go UDP references stay empty." >&2
  fi
fi
go build -o "$out/hiccups" ./bench/hiccups
# fig CODE appends a line to the figures from the last result ($out/r.json, as r). Each
# tool writes its result to that file first: a python3 started in a pipe beside a
# measurement (through pyenv's shims, dozens of processes) would share the CPUs with it
# and put milliseconds into its latency tail.
fig() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); $1" "$out/r.json" >> "$out/figures.txt"; }
for i in $(seq "$runs"); do
  # Go UDP: 64 KB datagrams, sender and receiver in one process; CPU over the whole run.
  # Also 4 KiB datagrams, a RoCE packet's size: per-datagram costs.
  if [ -n "$gobaseline" ]; then
    for sz in 65000 4096; do
      /usr/bin/time -f "%U %S" -o "$out/time.txt" "$gobaseline" -mode udp -size $sz -batch 8 -d ${dur}s > "$out/udp.txt"
      awk -v d=$dur -v sz=$sz 'NR==FNR {split($6,a,"="); gbps=a[2]; next} {cpu=$1+$2; gib=gbps*1e9*d/2^30; n=gbps*1e9*d/sz; printf "udp%d %.1f %.4f %.4f %.3f\n", sz, gbps*1000, cpu/gib, $2/gib, cpu/n*1e6}' \
        "$out/udp.txt" "$out/time.txt" >> "$out/figures.txt"
    done
  fi
  "$out/rperf" write_bw --loopback -s 1M -n 500 > /dev/null # warm-up, discarded
  "$out/rperf" write_bw --loopback -s 1M -n 6000 --json > "$out/r.json"
  fig 'print("wbw %.1f %.4f %.4f %.3f" % (r["bw_MiBps"]*2**20/1e6, r["cpu_s_per_GiB"], r["cpu_sys_s"]/r["cpu_s"]*r["cpu_s_per_GiB"], r["cpu_us_per_pkt"]))'
  # send_lat between two processes, as ucx_perftest's tag_lat runs (the bar), and in one.
  port=$((20000 + RANDOM % 20000))
  "$out/rperf" send_lat -p $port > /dev/null 2>&1 &
  sleep 0.5
  "$out/rperf" send_lat 127.0.0.1 -p $port -s 8 -n 20000 --json > "$out/r.json"
  wait
  fig 'print("lat %.2f %.2f %.2f" % (r["lat_us"]["p50"], r["lat_us"]["p99"], r["lat_us"]["p999"]))'
  "$out/rperf" send_lat --loopback -s 8 -n 20000 --json > "$out/r.json"
  fig 'print("lat1 %.2f %.2f %.2f" % (r["lat_us"]["p50"], r["lat_us"]["p99"], r["lat_us"]["p999"]))'
  # How often the machine itself takes a processor away (the latency tail's floor).
  "$out/hiccups" --json > "$out/r.json"
  fig 'print("hic %.0f %.2f %.1f %.0f" % (r["gaps_per_s"], r["lost_pct"], r["gap_p50_us"], r["gap_max_us"]))'
  # The tail the machine leaves a ping-pong with no protocol: two busy-polling threads, UDP.
  "$out/hiccups" --pingpong -n 20000 --json > "$out/r.json"
  fig 'print("udppp %.2f %.2f %.2f" % (r["p50_us"], r["p99_us"], r["p999_us"]))'
  # One flow on two queues: its CPU time per GiB must not grow.
  "$out/rperf" write_bw --loopback -s 1M -n 6000 --queues 2 --json > "$out/r.json"
  fig 'print("wbw2 %.1f %.4f %.4f %.3f" % (r["bw_MiBps"]*2**20/1e6, r["cpu_s_per_GiB"], r["cpu_sys_s"]/r["cpu_s"]*r["cpu_s_per_GiB"], r["cpu_us_per_pkt"]))'
  # 8 QPs between two processes, 1, 2 and 4 receive queues per device (the client's
  # --queues applies to the server too); packets per server queue from --stats.
  for q in 1 2 4 1 2 4; do # twice a round: two processes on 2 cores are noisy
    port=$((20000 + RANDOM % 20000))
    "$out/rperf" write_bw -p $port --stats > /dev/null 2>&1 &
    sleep 0.5
    "$out/rperf" write_bw 127.0.0.1 -p $port -s 64K --qps 8 --queues $q -n 30000 --stats --json > "$out/r.json"
    wait
    fig 'q=r["counters"]["server"].get("Queues") or []; print("mq%s %.1f %s" % ("'$q'", r["bw_MiBps"]*2**20/1e6, ",".join(str(x["RxPackets"]) for x in q) or "-"))'
  done
  # UCX over TCP tag_lat (and everything else the peers script measures, kept in peers.txt).
  if [ -n "$peers" ]; then
    bash "$peers" quick 2>/dev/null | tee -a "$out/peers.txt" | awk -F'\t' '$1=="ucx-tcp" && $2=="tag_lat" {print "ucx", $4}' >> "$out/figures.txt"
  fi
done
python3 - "$out/figures.txt" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
def col(kind, i):
    v = [float(r[i]) for r in rows if r[0] == kind]
    return st.median(v) if v else None
udp_bw, udp_cpu = col("udp65000", 1), col("udp65000", 2)
wbw, wcpu = col("wbw", 1), col("wbw", 2)
p50, p99, p999 = col("lat", 1), col("lat", 2), col("lat", 3)
ucx = col("ucx", 1)
def ratio(a, b):
    return "–" if a is None or b is None else "%.2f" % (a / b)
def paired(ka, kb, i):
    # The median of the ratios of figures measured side by side (the n-th of ka with the
    # n-th of kb): the machine's speed drifts by 2-3 x within a run, so the ratio of two
    # medians taken over different moments mixes that drift into the comparison.
    a = [float(r[i]) for r in rows if r[0] == ka]
    b = [float(r[i]) for r in rows if r[0] == kb]
    v = [x / y for x, y in zip(a, b) if y]
    return "–" if not v else "%.2f" % st.median(v)
def fig(v, f):
    return "–" if v is None else f % v
print("| figure (medians of %d runs; ratio: the median of the ratios of each run) | softrnic | reference | ratio | bar |" % max(1, len([r for r in rows if r[0] == "wbw"])))
print("|---|---|---|---|---|")
print("| write_bw -s 1M, MB/s, against a Go UDP 64 KB stream | %s | %s | %s | >= 0.8 |" % (fig(wbw, "%.0f"), fig(udp_bw, "%.0f"), paired("wbw", "udp65000", 1)))
print("| CPU s per GiB (user + system, one process) | %s | %s | %s | <= 2 |" % (fig(wcpu, "%.3f"), fig(udp_cpu, "%.3f"), paired("wbw", "udp65000", 2)))
print("| send_lat 8 B p50, us, two processes, against UCX over TCP tag_lat (two processes) | %s | %s | %s | <= 1 |" % (fig(p50, "%.2f"), fig(ucx, "%.2f"), paired("lat", "ucx", 1)))
print("| send_lat 8 B p99 / p50, two processes (p999 %s us) | %s | %s | %s | <= 3 |" % (fig(p999, "%.0f"), fig(p99, "%.2f"), fig(p50, "%.2f"), ratio(p99, p50)))
q50, q99 = col("lat1", 1), col("lat1", 2)
if q50 is not None:
    print("| the same in one process (`rperf send_lat --loopback`): p50 against UCX; p99 / p50 | %s | %s | %s; %s | |" % (fig(q50, "%.2f"), fig(ucx, "%.2f"), paired("lat1", "ucx", 1), ratio(q99, q50)))
up50, up99 = col("udppp", 1), col("udppp", 2)
if up50 is not None:
    print("| the same for a plain UDP ping-pong, busy-polled, no protocol: p99 / p50 (`go run ./bench/hiccups --pingpong`) | %s | %s | %s | |" % (fig(up99, "%.2f"), fig(up50, "%.2f"), ratio(up99, up50)))
hg, hl, hp, hm = col("hic", 1), col("hic", 2), col("hic", 3), col("hic", 4)
if hg is not None:
    print("| the machine: a spinning thread loses its processor %.0f times a second for > 10 us (median %.0f us, longest %.0f us; %.1f %% of its time: `go run ./bench/hiccups`) | | | | |" % (hg, hp, hm, hl))
wbw2, wcpu2 = col("wbw2", 1), col("wbw2", 2)
print("| write_bw -s 1M on 2 queues: CPU s per GiB, against 1 queue | %s | %s | %s | <= 1 |" % (fig(wcpu2, "%.3f"), fig(wcpu, "%.3f"), paired("wbw2", "wbw", 2)))
mq1 = col("mq1", 1)
for q in (2, 4):
    v = col("mq%d" % q, 1)
    last = [r[2] for r in rows if r[0] == "mq%d" % q][-1:] or ["-"]
    print("| 8 QPs write_bw -s 64K, two processes, MB/s: %d queues against 1 (server packets per queue, last run: %s) | %s | %s | %s | >= 1 |" % (q, last[0], fig(v, "%.0f"), fig(mq1, "%.0f"), paired("mq%d" % q, "mq1", 1)))
PY
python3 - "$out/figures.txt" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
def col(kind, i):
    v = [float(r[i]) for r in rows if r[0] == kind and len(r) > i]
    return st.median(v) if v else None
print()
print("| CPU (one process, both sides; medians) | MB/s | CPU s per GiB | of which system | CPU us per packet |")
print("|---|---|---|---|---|")
for kind, name in (("wbw", "softrnic write_bw -s 1M, 1 queue (4 KiB packets)"), ("wbw2", "softrnic write_bw -s 1M, 2 queues"),
                   ("udp65000", "Go UDP, 64 KB datagrams"), ("udp4096", "Go UDP, 4 KiB datagrams")):
    vals = [col(kind, i) for i in (1, 2, 3, 4)]
    if vals[0] is None:
        continue
    print("| %s | %.0f | %.3f | %.3f | %.2f |" % (name, vals[0], vals[1], vals[2], vals[3]))
PY
echo "raw figures: $out"
