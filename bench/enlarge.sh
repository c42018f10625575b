#!/usr/bin/env bash
# What an enlargement costs, from fresh jobs of two processes (rmsgrun -np 2 rmsg enlarge):
# the first round trip of a 4,000-byte message, which enlarges the connection's ring from
# the 1 KiB phase to the 16 KiB one, against the same first round trip in a job whose
# first phase is 16 KiB already (-phases 16384,131072: no enlargement). Both are the first
# large message of fresh processes, so what a first large message costs anyway (a GSO send
# and receive not made before, code and buffers not touched before) is in both; their
# difference is the enlargement's, in small round trips of the same runs. Runs RUNS times
# (default 9) in turns; medians.
#   bench/enlarge.sh          about 20 seconds
# Runs from any directory.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_help "$@"
cd "$bench_root"
runs=${RUNS:-9}
tmp=$(mktemp -d)
go build -o "$tmp/rmsg" ./cmd/rmsg
go build -o "$tmp/rmsgrun" ./cmd/rmsgrun
for i in $(seq "$runs"); do
  "$tmp/rmsgrun" -np 2 "$tmp/rmsg" enlarge --json | sed 's/^\[0\] //' | grep '^{' >> "$tmp/enl.json"
  "$tmp/rmsgrun" -np 2 "$tmp/rmsg" enlarge -phases 16384,131072 --json | sed 's/^\[0\] //' | grep '^{' >> "$tmp/big.json"
done
python3 - "$tmp" <<'PY'
import json, sys, os, statistics as st
d = sys.argv[1]
def load(f):
    return [json.loads(l) for l in open(os.path.join(d, f)) if l.strip()]
enl, big = load("enl.json"), load("big.json")
assert all(r.get("enlarged") for r in enl) and not any(r.get("enlarged") for r in big)
med = lambda rs, k: st.median(r[k] for r in rs)
small = st.median([r["small_rtt_us"] for r in enl + big])
fe, fb = med(enl, "first_us"), med(big, "first_us")
se, sb = med(enl, "steady_us"), med(big, "steady_us")
print(f"runs {len(enl)} + {len(big)}; small round trip {small:.1f} us (median)")
print(f"first 4000-byte round trip, enlarging 1 KiB -> 16 KiB : {fe:7.1f} us (steady after: {se:.1f} us)")
print(f"first 4000-byte round trip, 16 KiB from the start      : {fb:7.1f} us (steady after: {sb:.1f} us)")
print(f"the enlargement: {(fe - fb) / small:.2f} small round trips (bar: at most 1); "
      f"the first large message against steady, with enlargement {(fe - se) / small:.2f}, without {(fb - sb) / small:.2f}")
print(f"steady rate after it: {se / sb:.2f} x the round trip of a connection large from the start")
q = lambda rs, k, p: st.quantiles([r[k] for r in rs], n=4)[p] if len(rs) > 1 else rs[0][k]
print(f"first round trips' quartiles, enlarging {q(enl, 'first_us', 0):.1f} / {fe:.1f} / {q(enl, 'first_us', 2):.1f} us, "
      f"large from the start {q(big, 'first_us', 0):.1f} / {fb:.1f} / {q(big, 'first_us', 2):.1f} us "
      f"(a job whose process loses its processor mid-way lands in the upper quartile)")
aw, sv, ap = med(enl, "ack_wait_us"), med(enl, "serve_us"), med(enl, "ack_post_us")
pv, tf = med(enl, "provision_us"), med(enl, "to_first_send_us")
print("the enlargement's steps (msg's LabStats().LastEnlargement; medians):")
print(f"  request written -> complete acknowledgement read {aw:6.1f} us = {aw / small:.2f} small round trips, of which")
print(f"    the receiver's provisioning (unregister, register) {sv:6.1f} us, its acknowledgement's post {ap:.1f} us")
print(f"    and the rest, the control round trip itself        {aw - sv:6.1f} us = {(aw - sv) / small:.2f} small round trips")
print(f"  the two sides' provisioning together               {sv + pv:6.1f} us = {(sv + pv) / small:.2f} small round trips")
print(f"  the sender's provisioning (unregister, register)  {pv:6.1f} us")
print(f"  request written -> first large post returned      {tf:6.1f} us")
PY
