"""tools/device/step_trace.py (run.sh trace's analysis) on kernel records made here: decode steps of known
kernels with known ends, overlapping their predecessors as under programmatic dependent launch, a
prefill between two steps, and the records out of order. Every expected figure comes from how the
records were made, not from the tool."""
import random
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "device" / "step_trace.py"

# one decode step: (mangled name, grid, cost in ns: its end minus its predecessor's end)
STEP = [("_Z7k_embedPKiPf", 8, 2000)] + [
    k for _ in range(3) for k in (("_Z6k_gemvILi2ELi8EEv8gemv_jobPKfllPKii", 259, 9000),
                                  ("_Z10k_gdn_stepILi32ELi4EEvPKf", 128, 7000),
                                  ("_Z11k_moe_split4dmatS_", 128, 17000))
] + [("_Z8k_argmaxPKfiPi", 122, 3000)]


def records(n_steps, prefill_at):
    rows, t = [], 1_000_000
    for s in range(n_steps):
        if s == prefill_at:  # a prefill: 40 long kernels, then its own argmax
            for _ in range(40):
                rows.append((t, t + 50_000, "_Z9k_gemm_wg6g4_job", 768))
                t += 50_000
            rows.append((t, t + 3000, "_Z8k_argmaxPKfiPi", 122))
            t += 3000
        for name, grid, cost in STEP:
            end = t + cost
            rows.append((end - cost - 1500, end, name, grid))  # starts 1.5 us before its predecessor ends
            t = end
    random.Random(1).shuffle(rows)
    return "".join(f"{a}\t{b}\t0\t{g}\t256\t{n}\n" for a, b, n, g in rows)


def test_step_trace_costs():
    out = subprocess.run([sys.executable, str(TOOL), "--layers", "1"], input=records(8, 4), text=True,
                         capture_output=True, check=True).stdout
    # 8 steps of 11 kernels; the one after the prefill's argmax is complete too, the first has no predecessor
    m = re.search(r"(\d+) decode steps of (\d+) kernels", out)
    assert m and int(m.group(2)) == len(STEP) and int(m.group(1)) == 7, out
    total = sum(c for _, _, c in STEP) / 1e3
    m = re.search(r"step: median ([\d.]+) us, min ([\d.]+), max ([\d.]+)", out)
    assert m and all(abs(float(v) - total) < 0.05 for v in m.groups()), out
    # each kind's cost a step, and the start 1.5 us before the predecessor's end
    kinds = {"k_moe_split g128": (3, 51.0), "k_gemv<2,8> g259": (3, 27.0), "k_gdn_step<32,4> g128": (3, 21.0),
             "k_argmax g122": (1, 3.0), "k_embed g8": (1, 2.0)}
    for k, (n, c) in kinds.items():
        m = re.search(re.escape(k) + r"\s+(\d+)\s+([\d.]+)", out)
        assert m and int(m.group(1)) == n and abs(float(m.group(2)) - c) < 0.05, (k, out)
    m = re.search(r"^\s+1 k_gemv<2,8> g259\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)", out, re.M)
    assert m and abs(float(m.group(1)) - 9.0) < 0.01 and abs(float(m.group(2)) - 10.5) < 0.01 \
        and abs(float(m.group(3)) + 1.5) < 0.01, out
    m = re.search(r"sum of medians\s+([\d.]+)", out)
    assert m and abs(float(m.group(1)) - total) < 0.05, out
    # the prefill segment: 40 GEMMs of 50 us each (the first starts at its predecessor's end) and its argmax
    m = re.search(r"longest other segment .*: (\d+) kernels, ([\d.]+) ms", out)
    assert m and int(m.group(1)) == 41 and abs(float(m.group(2)) - 2.003) < 1e-6, out
    m = re.search(r"^k_gemm_wg g768\s+(\d+)\s+([\d.]+) ms", out, re.M)
    assert m and int(m.group(1)) == 40 and abs(float(m.group(2)) - 2.0) < 1e-3, out


def test_step_trace_too_few_steps():
    one = "".join(f"{i * 10}\t{i * 10 + 5}\t0\t1\t32\t_Z8k_argmaxPKfiPi\n" for i in range(2))
    r = subprocess.run([sys.executable, str(TOOL)], input=one, text=True, capture_output=True)
    assert r.returncode == 1 and "no decode steps" in r.stdout
