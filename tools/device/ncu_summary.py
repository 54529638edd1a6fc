#!/usr/bin/env python3
"""Group an Nsight Compute CSV of kernel durations (ncu_times.sh) by
kernel, grid and block. The launches are cut into passes at each k_embed (one per decode step or
prefill chunk); --prefill keeps the last pass that ran the prefill GEMM (k_gemm_wg or k_gemm_q),
otherwise every decode pass is averaged."""
import csv, re, statistics, sys
from collections import defaultdict

args = [a for a in sys.argv[1:] if not a.startswith("--")]
prefill = "--prefill" in sys.argv
rows = []
with open(args[0], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = re.sub(r"\(.*", "", r["Kernel Name"]).strip()
    rows.append((name, r["Grid Size"], r["Block Size"], float(r["Metric Value"].replace(",", "")) / 1e3))
starts = [i for i, r in enumerate(rows) if r[0].startswith("k_embed")] + [len(rows)]
passes = [rows[a:b] for a, b in zip(starts, starts[1:])]
if prefill:
    passes = [p for p in passes if any(k[0].startswith(("k_gemm_wg", "k_gemm_q")) for k in p)][-1:]
    what = "prefill pass"
else:
    passes = passes[:-1]  # the last may be cut short by --launch-count
    what = "decode steps"
if not passes:
    sys.exit(f"no {what} in {len(rows)} kernels")
per = defaultdict(list)  # (name, grid, block) -> durations over all passes
for st in passes:
    for name, g, b, us in st:
        per[(name, g, b)].append(us)
n = len(passes)
tot = sum(us for st in passes for *_, us in st) / n
print(f"{n} {what}, {len(passes[0])} kernels per pass, {tot:.1f} us per pass summed (kernels alone, no overlap)")
print(f"{'kernel':<34} {'grid':>14} {'block':>12} {'/pass':>6} {'median us':>10} {'us/pass':>9} {'share':>6}")
for (name, g, b), v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
    s = sum(v) / n
    print(f"{name[:34]:<34} {g:>14} {b:>12} {len(v)/n:6.1f} {statistics.median(v):10.2f} {s:9.1f} {100*s/tot:5.1f}%")
