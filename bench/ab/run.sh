#!/usr/bin/env bash
# A/B comparison of two commits: rperf's default suite and the bench/faults.sh matrix, the
# BEFORE and AFTER binaries interleaved in one run of the machine (each pair in alternating
# order), medians, ratios and the run-to-run spread in one table: for a change that must
# not move the figures (a restructuring); bench/results/2026-11-24-transport-restructuring-ab.md
# is one such run.
#   BEFORE=9483744 AFTER=43d778d bash bench/ab/run.sh     # ~16 min; table in $DIR/table.md
#   BEFORE=... AFTER=... SUITE_ROUNDS=0 FAULT_ROUNDS=10 FAULTS=loss=0.001 MODES=ordered \
#     TESTS="send_bw -s 1M -n 300" bash bench/ab/run.sh   # one row, 10 rounds
# Every pair (before, after) whose time overlapped a loadtest.sh or go test process (monitor.sh,
# sampled each second) is discarded and rerun; no invocation starts while one runs.
# Output in $DIR (default: a new temporary directory): results.jsonl (every rperf JSON line plus
# "binary", "suite", "round", "faults"), run.log (timings, uptime), table.md.
# Touches no checkout: it clones the repository (REPO, default this one) into $DIR/src.
# Runs from any directory.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
bench_help "$@"
: "${BEFORE:?set BEFORE and AFTER to two commits}" "${AFTER:?set BEFORE and AFTER to two commits}"
DIR=${DIR:-$(mktemp -d)}
REPO=${REPO:-$bench_root}
SUITE_ROUNDS=${SUITE_ROUNDS:-5}
FAULT_ROUNDS=${FAULT_ROUNDS:-3}
# The matrix (defaults: bench/faults.sh's); e.g. FAULTS="loss=0.001" MODES=ordered TESTS="send_bw -s 1M -n 300".
read -r -a faults <<< "${FAULTS:-none loss=0.001 loss=0.01 loss=0.03 reorder=0.05}"
read -r -a modes <<< "${MODES:-weak ordered}"
IFS=';' read -r -a tests <<< "${TESTS:-write_bw -s 65536 -n 5000;write_bw -s 1M -n 300;send_bw -s 65536 -n 5000;send_bw -s 1M -n 300}"
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$DIR"
# Both may be given relative to the caller's directory; the run works in $DIR.
DIR=$(cd "$DIR" && pwd)
if [ -d "$REPO" ]; then REPO=$(cd "$REPO" && pwd); fi
cd "$DIR"
log() { echo "$(date -u +%FT%TZ) $*" | tee -a "$DIR/run.log"; }

# Never overlap another engineer's load test or go test run (checked before every invocation).
busy() { pgrep -af 'loadtest.sh|go test' | grep -vqE '^[0-9]+ pgrep '; }
waitidle() {
  local waited=0
  while busy; do
    [ $waited = 0 ] && log "PAUSE: loadtest.sh / go test running"
    waited=1; sleep 20
  done
  [ $waited = 1 ] && log "RESUME"
  return 0
}

# 1. Build (outside the measured window).
waitidle
[ -d src ] || git clone -q "$REPO" src
git -C src checkout -q "$BEFORE" && (cd src && go build -o "$DIR/rperf-before" ./cmd/rperf)
git -C src checkout -q "$AFTER" && (cd src && go build -o "$DIR/rperf-after" ./cmd/rperf)
unset SOFTRNIC_FAULTS

: > results.jsonl
: > run.log
# A monitor logs (epoch seconds) every second in which a load test or go test runs.
: > monitor.log
bash "$HERE/monitor.sh" >> "$DIR/monitor.log" 2>&1 &
monpid=$!
trap 'kill $monpid 2>/dev/null' EXIT
busy_during() { # START END: did the monitor see a load test or go test in [START-1, END+1]?
  awk -v a=$(($1 - 1)) -v b=$(($2 + 1)) '$1 >= a && $1 <= b {f=1} END {exit !f}' "$DIR/monitor.log"
}
# one BIN SUITE ROUND FAULTS ARGS...: run rperf-BIN, tag each JSON line into $DIR/pending.
# Returns 1 if a load test or go test overlapped it.
one() {
  local bin=$1 suite=$2 round=$3 f=$4; shift 4
  waitidle
  local t0; t0=$(date +%s.%N)
  if ! timeout 900 "$DIR/rperf-$bin" "$@" 2>>"$DIR/stderr.log" \
      | sed "s/^{/{\"binary\":\"$bin\",\"suite\":\"$suite\",\"round\":$round,\"faults\":\"$f\",/" >> "$DIR/pending"; then
    log "FAILED: $bin $*"
  fi
  local t1; t1=$(date +%s.%N)
  echo "$(date -u +%T) $bin r$round $f $* ($(echo "$t1 - $t0" | bc) s)" >> "$DIR/run.log"
  ! busy_during "${t0%.*}" "${t1%.*}"
}
# pair SUITE ROUND FAULTS ARGS...: before then after on odd rounds, after then before on even
# rounds; if a load test or go test overlapped either, both are discarded and the pair rerun.
pair() {
  local round=$2 try ok
  for try in 1 2 3 4 5 6; do
    : > "$DIR/pending"; ok=1
    if [ $((round % 2)) = 1 ]; then one before "$@" || ok=0; one after "$@" || ok=0
    else one after "$@" || ok=0; one before "$@" || ok=0; fi
    if [ $ok = 1 ]; then cat "$DIR/pending" >> results.jsonl; return 0; fi
    log "REDO (overlapped a load test / go test, try $try): $*"
  done
  log "GAVE UP (overlapped 6 times): $*"
}

log "START uptime: $(uptime)"; sleep 2
start=$SECONDS
# Warm-up, discarded (as compare.sh does).
"$DIR/rperf-before" write_bw --loopback -n 5000 >/dev/null
"$DIR/rperf-after" write_bw --loopback -n 5000 >/dev/null

# a. The default suite (`go run ./cmd/rperf`), with --json.
for i in $(seq "$SUITE_ROUNDS"); do
  pair default "$i" none --json
done
log "suite done ($((SECONDS - start)) s) uptime: $(uptime)"

# b. The bench/faults.sh matrix, same loop order and arguments, seed = round.
for i in $(seq "$FAULT_ROUNDS"); do
  for f in "${faults[@]}"; do
    for mode in "${modes[@]}"; do
      for t in "${tests[@]}"; do
        args=(--loopback --json --stats --ordering "$mode")
        [ "$f" != none ] && args+=(--faults "$f,seed=$i")
        # shellcheck disable=SC2086
        pair faults "$i" "$f" $t "${args[@]}"
      done
    done
  done
done
log "END wall time $((SECONDS - start)) s; uptime: $(uptime)"
python3 "$HERE/table.py" "$DIR/results.jsonl" "$DIR/run.log" > "$DIR/table.md"
echo "table: $DIR/table.md"
