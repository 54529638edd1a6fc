#!/usr/bin/env bash
# Per-kernel timings of one decode step with Nsight Compute (run on the device:
# `bash tools/device/profile.sh [MODEL_DIR]`; default: a 4-layer real-dimension
# synth checkpoint). A one-token prompt makes the first forward pass run exactly
# the decode kernels (outside the graph), which are the ones profiled.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/device-out}; mkdir -p "$OUT"
if [ -d .devdeps/root ]; then
    D=$PWD/.devdeps/root
    export CPATH=$D/usr/include LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu
fi
export PATH=/usr/local/cuda/bin:$PATH
[ -x build/lilac ] || make -j"$(nproc)" WERROR= build/lilac >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
MODEL=${1:-}
if [ -z "$MODEL" ]; then MODEL=/tmp/syn4; ./build/lilac synth --out $MODEL --layers 4 --vocab 8192 --seed 1; fi
# --cache-control none: kernels see the L2 as the previous kernel left it, as in a real step.
ncu --clock-control none --cache-control none --print-summary none --csv --page raw \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,launch__grid_size,launch__registers_per_thread \
    --kernel-name regex:"^k_(gemv|gdn|attn|embed|argmax|topk|moe|conv|gated|add)" --launch-count ${COUNT:-400} \
    ./build/lilac generate --model "$MODEL" --backend cuda --ids 1 --max-tokens 1 > "$OUT/ncu.csv" 2>"$OUT/ncu.err"
echo "ncu rc=$?"; tail -3 "$OUT/ncu.err"
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
H = rows[hdr]; data = rows[hdr + 2:]  # second header row holds units
col = {n: H.index(n) for n in H}
def f(r, n):
    try: return float(r[col[n]].replace(',', ''))
    except Exception: return 0.0
tot = collections.defaultdict(lambda: [0, 0.0, 0.0])
seq = []
for r in data:
    name = r[col['Kernel Name']].split('(')[0][:48]
    us = f(r, 'gpu__time_duration.sum') / 1e3
    mb = f(r, 'dram__bytes.sum') / 1e6
    t = tot[name]; t[0] += 1; t[1] += us; t[2] += mb
    seq.append((name, us, mb, f(r, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'), f(r, 'launch__grid_size'), f(r, 'launch__registers_per_thread')))
all_us = sum(t[1] for t in tot.values())
print(f"{len(seq)} kernels, {all_us:.1f} us in total (serialised)")
for n, (c, us, mb) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
    print(f"{n:48s} n={c:4d} total {us:8.1f} us  avg {us/c:6.2f} us  {mb/c:7.2f} MB/launch  {mb/max(us,1e-9)*1e-3*1e3:6.0f} GB/s")
print("first 40 launches:")
for n, us, mb, pct, grid, regs in seq[:40]:
    print(f"  {n:48s} {us:7.2f} us {mb:7.2f} MB dram {pct:5.1f}% grid {grid:6.0f} regs {regs:4.0f}")
PY
# Stall reasons and memory detail for chosen launches (DETAIL="1 6": the first
# layer's input GEMV and expert gate/up GEMV in the launch order listed above).
for k in ${DETAIL:-}; do
    ncu --clock-control none --cache-control none --launch-skip "$k" --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        ./build/lilac generate --model "$MODEL" --backend cuda --ids 1 --max-tokens 1 2>/dev/null |
        grep -E "^  [A-Za-z]|Duration|Throughput|Stall|stall|Occupancy|Registers|Block Size|Grid Size|Waves|L2 Hit|L1/TEX Hit|Mem Busy|Max Bandwidth|Issued|Eligible|Active Warps|cycles being stalled|On average" | head -60
done
