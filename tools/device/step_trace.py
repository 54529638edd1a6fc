#!/usr/bin/env python3
"""A decode step's timeline from kernel_trace.c's records (ktrace.tsv on stdin).

Steps end at each k_argmax launch; the steps with the usual kernel count are
decode steps (a prefill between two argmax launches makes a longer one). For
each kernel position in the step, median over the steps:
  cost  = its end minus its predecessor's end (what it adds to the step: the
          sum over a step is the step's time),
  dur   = its own start to end,
  start = its start minus its predecessor's end (negative: it started early,
          under programmatic dependent launch).
Then the same costs summed per kernel kind (name, template arguments, grid), and
the longest other segment (a prefill) by kind.
Usage: python3 step_trace.py [--layers N] < ktrace.tsv
"""
import re
import statistics
import sys
from collections import Counter, defaultdict


def short(name, grid):
    m = re.match(r"_Z(\d+)", name)
    if not m:
        return f"{name[:40]} g{grid}"
    n = int(m.group(1))
    ident = name[m.end():m.end() + n]
    rest = name[m.end() + n:]
    tmpl = ""
    if rest.startswith("I"):
        args = re.findall(r"Li(-?\d+)E", rest[:40])
        tmpl = "<" + ",".join(args) + ">" if args else "<>"
    return f"{ident}{tmpl} g{grid}"


def main():
    show_layers = 2
    if "--layers" in sys.argv:
        show_layers = int(sys.argv[sys.argv.index("--layers") + 1])
    rows = []
    for line in sys.stdin:
        p = line.rstrip("\n").split("\t")
        if len(p) < 6:
            continue
        rows.append((int(p[0]), int(p[1]), short(p[5], int(p[3]))))
    rows.sort()
    ends = [i for i, r in enumerate(rows) if r[2].startswith("k_argmax")]
    if len(ends) < 3:
        print(f"step_trace: {len(ends)} argmax launches in {len(rows)} kernels: no decode steps")
        return 1
    # (the end of the argmax before it, its kernels) for each segment
    segs = [(rows[a][1], rows[a + 1:b + 1]) for a, b in zip(ends, ends[1:])]
    n_mode = Counter(len(s) for _, s in segs).most_common(1)[0][0]
    steps = [(pe, s) for pe, s in segs if len(s) == n_mode]
    print(f"{len(rows)} kernels; {len(steps)} decode steps of {n_mode} kernels")
    times = [s[-1][1] - pe for pe, s in steps]
    print(f"step: median {statistics.median(times) / 1e3:.1f} us, min {min(times) / 1e3:.1f}, max {max(times) / 1e3:.1f}")
    cost = [[0.0] * n_mode for _ in steps]
    dur = [[0.0] * n_mode for _ in steps]
    gap = [[0.0] * n_mode for _ in steps]
    for j, (pe, s) in enumerate(steps):
        for i, (st, en, _) in enumerate(s):
            cost[j][i] = (en - pe) / 1e3
            dur[j][i] = (en - st) / 1e3
            gap[j][i] = (st - pe) / 1e3
            pe = en
    med = lambda a, i: statistics.median(r[i] for r in a)
    names = [k for _, _, k in steps[0][1]]
    # the first layers in full (a layer: up to the next kernel of the same name as the step's second)
    print(f"\n{'#':>3} {'kernel':<44} {'cost':>7} {'dur':>7} {'start':>7}")
    layer_mark = names[1] if n_mode > 1 else names[0]
    seen = 0
    for i, k in enumerate(names):
        if k == layer_mark:
            seen += 1
        if seen > show_layers and i < n_mode - 6:
            continue
        print(f"{i:>3} {k:<44} {med(cost, i):7.2f} {med(dur, i):7.2f} {med(gap, i):7.2f}")
    per = defaultdict(lambda: [0, 0.0, []])
    for i, k in enumerate(names):
        per[k][0] += 1
        per[k][1] += med(cost, i)
        per[k][2].append(med(dur, i))
    tot = sum(v[1] for v in per.values())
    print(f"\n{'kernel kind':<44} {'n':>4} {'cost/step':>10} {'share':>6} {'cost each':>10} {'dur each':>9}")
    for k, (n, c, d) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{k:<44} {n:>4} {c:10.1f} {100 * c / tot:5.1f}% {c / n:10.2f} {statistics.median(d):9.2f}")
    print(f"{'sum of medians':<44} {'':>4} {tot:10.1f}")
    # the longest other segment: a prefill (up to the next argmax: in lilac bench, its first decode step), kinds by cost
    longer = [seg for seg in segs if len(seg[1]) > n_mode]
    if longer:
        pe0, s = max(longer, key=lambda seg: len(seg[1]))
        pe = pe0
        per = defaultdict(lambda: [0, 0.0])
        for st, en, k in s:
            per[k][0] += 1
            per[k][1] += max(en - pe, 0) / 1e3
            pe = max(pe, en)
        span = (s[-1][1] - pe0) / 1e3
        print(f"\nlongest other segment (a prefill, up to the next argmax): {len(s)} kernels, {span / 1e3:.3f} ms; "
              f"cost = end minus the latest earlier end (kernels of a side stream overlap)")
        for k, (n, c) in sorted(per.items(), key=lambda kv: -kv[1][1])[:24]:
            print(f"{k:<44} {n:>5} {c / 1e3:9.3f} ms {100 * c / span:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
