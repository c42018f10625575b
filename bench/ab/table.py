#!/usr/bin/env python3
"""Reads results.jsonl (rperf JSON lines tagged binary/suite/round/faults) and prints a
markdown table: per (suite, test, size, iters, mode, faults, metric) the median of each
binary's rounds, after/before, and the run-to-run spread."""
import json, sys, statistics as st
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
logf = sys.argv[2] if len(sys.argv) > 2 else None

def size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else (f"{n >> 10} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B")

vals = defaultdict(lambda: defaultdict(dict))  # key -> binary -> round -> value
rtx = defaultdict(lambda: defaultdict(list))
order = []
for r in rows:
    metrics = []
    if r["test"].endswith("_bw"):
        metrics.append(("bw MiB/s", r["bw_MiBps"]))
    else:
        metrics.append(("p50 µs", r["lat_us"]["p50"]))
        metrics.append(("p99 µs", r["lat_us"]["p99"]))
    for m, v in metrics:
        k = (r["suite"], r["test"], r["size"], r["iters"], r.get("ordering", "?"), r["faults"], m)
        if k not in vals:
            order.append(k)
        vals[k][r["binary"]][r["round"]] = v
        if "counters" in r and r["counters"]:
            c = r["counters"]["client"]
            rtx[k][r["binary"]].append(100 * c["Retransmits"] / max(c["TxPackets"], 1))

def rng(v):
    m = st.median(v)
    return (max(v) - min(v)) / m if m else 0.0

print("| suite | test | size | n | mode | faults | metric | before median (min–max) | after median (min–max) | after/before | per-round ratios (sorted) | spread (max−min)/median | retx % b/a | flag |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
bw_ratios, p50_ratios, p99_ratios, flagged = [], [], [], []
for k in order:
    b, a = vals[k]["before"], vals[k]["after"]
    if not b or not a:
        continue
    bv, av = list(b.values()), list(a.values())
    mb, ma = st.median(bv), st.median(av)
    ratio = ma / mb if mb else float("nan")
    pr = sorted(a[i] / b[i] for i in b if i in a and b[i])
    # Spread: the larger of the two binaries' (max-min)/median over their rounds.
    spread = max(rng(bv), rng(av))
    # Flag only a difference larger than the spread, in every round the same direction.
    same_side = len(pr) >= 2 and len(bv) >= 2 and len(av) >= 2 and (all(x > 1 for x in pr) or all(x < 1 for x in pr))
    flag = "**>spread**" if abs(ratio - 1) > spread and same_side else ""
    if flag:
        flagged.append((k, ratio, spread))
    suite, test, sz, it, mode, f, m = k
    (bw_ratios if m.startswith("bw") else p50_ratios if m.startswith("p50") else p99_ratios).append(ratio)
    rt = ""
    if rtx[k]["before"]:
        rt = f"{st.median(rtx[k]['before']):.2f}/{st.median(rtx[k]['after']):.2f}"
    fmt = (lambda x: f"{x:.0f}") if m.startswith("bw") and mb > 10 else (lambda x: f"{x:.1f}")
    print(f"| {suite} | {test} | {size(sz)} | {it} | {mode} | {f} | {m} | {fmt(mb)} ({fmt(min(bv))}–{fmt(max(bv))}) | "
          f"{fmt(ma)} ({fmt(min(av))}–{fmt(max(av))}) | {ratio:.3f} | {' '.join(f'{x:.2f}' for x in pr)} | {100*spread:.0f}% | {rt} | {flag} |")

print()
def line(name, v):
    return f"- median after/before over {len(v)} {name} rows: **{st.median(v):.3f}** (quartiles {st.quantiles(v, n=4)[0]:.3f}–{st.quantiles(v, n=4)[2]:.3f})" if len(v) >= 2 else f"- {name}: {v}"
print(line("bandwidth", bw_ratios))
print(line("latency p50", p50_ratios))
print(line("latency p99", p99_ratios))
print(line("latency (p50 and p99)", p50_ratios + p99_ratios))
print(f"- rows whose difference exceeds the run-to-run spread (same direction every round): {len(flagged)}")
for k, ratio, spread in flagged:
    print(f"  - {' '.join(map(str, k))}: ratio {ratio:.3f}, spread {100*spread:.0f}%")
if logf:
    print()
    for l in open(logf):
        if any(w in l for w in ("START", "END", "suite done", "PAUSE", "RESUME", "FAILED", "REDO", "GAVE UP")):
            print("- " + l.rstrip())
