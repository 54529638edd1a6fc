#!/usr/bin/env python3
"""Sum the per-phase prefill times that LILAC_PROFILE=1 prints (one stderr line
per forward call: "profile T=2048: 151.4 ms: embed+norms 1.044 gdn-proj 37.07 ...")
over the prefill chunks (T > 1) of each prompt, and print one table row per
prompt: ms per phase and its share. Reads the lines on stdin."""
import re
import signal
import sys

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head

runs, cur = [], None
for line in sys.stdin:
    m = re.match(r"profile T=(\d+): ([\d.]+) ms:(.*)", line.strip())
    if not m:
        continue
    T = int(m.group(1))
    if T == 1:  # a decode step ends the prompt's prefill
        cur = None
        continue
    if cur is None:
        cur = {"tokens": 0, "ms": 0.0, "phases": {}}
        runs.append(cur)
    cur["tokens"] += T
    cur["ms"] += float(m.group(2))
    f = m.group(3).split()
    for name, val in zip(f[0::2], f[1::2]):
        cur["phases"][name] = cur["phases"].get(name, 0.0) + float(val)
for r in runs:
    print(f"prefill of {r['tokens']} tokens: {r['ms']:.1f} ms ({r['tokens'] / r['ms'] * 1e3:,.0f} tok/s with profiling events)")
    for name, ms in sorted(r["phases"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:20s} {ms:9.2f} ms  {100 * ms / r['ms']:5.1f}%")
