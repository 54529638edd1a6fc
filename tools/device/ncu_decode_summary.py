#!/usr/bin/env python3
"""Group ncu_decode.sh's CSV by kernel: launches per decode step, median and
total microseconds per step. One step = the launches from one k_embed to the
next."""
import csv, re, statistics, sys
from collections import defaultdict

rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = re.sub(r"\(.*", "", r["Kernel Name"]).strip()
    rows.append((name, r["Grid Size"], r["Block Size"], float(r["Metric Value"].replace(",", "")) / 1e3))
starts = [i for i, r in enumerate(rows) if r[0].startswith("k_embed")]
if len(starts) < 2:
    sys.exit(f"fewer than 2 decode steps in {len(rows)} kernels")
steps = [rows[a:b] for a, b in zip(starts, starts[1:])]
per = defaultdict(list)  # (name, grid, block) -> durations over all steps
for st in steps:
    for name, g, b, us in st:
        per[(name, g, b)].append(us)
n = len(steps)
tot = sum(us for st in steps for *_, us in st) / n
print(f"{n} decode steps, {len(steps[0])} kernels per step, {tot:.1f} us per step summed (kernels alone, no overlap)")
print(f"{'kernel':<34} {'grid':>14} {'block':>12} {'/step':>6} {'median us':>10} {'us/step':>9} {'share':>6}")
for (name, g, b), v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
    s = sum(v) / n
    print(f"{name[:34]:<34} {g:>14} {b:>12} {len(v)/n:6.1f} {statistics.median(v):10.2f} {s:9.1f} {100*s/tot:5.1f}%")
