#!/usr/bin/env bash
# Per-kernel timings of prefill and decode with Nsight Compute on a 4-layer
# real-dimension synth checkpoint (run on the device: `bash tools/device/profile.sh`).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/device-out}; mkdir -p "$OUT"
if [ -d .devdeps/root ]; then
    D=$PWD/.devdeps/root
    export CPATH=$D/usr/include LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu
fi
export PATH=/usr/local/cuda/bin:$PATH
make -j"$(nproc)" WERROR= build/lilac >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
./build/lilac synth --out /tmp/syn4 --layers 4 --vocab 8192 --seed 1
IDS=$(seq -s, 1 200)
(nvidia-smi dmon -s c -d 1 > "$OUT/clocks.txt" 2>&1 &)
# Skip the prefill kernels; profile the kernels of the first decode steps.
ncu --clock-control none --print-summary per-kernel --csv --section SpeedOfLight --section LaunchStats --section Occupancy \
    --launch-skip ${SKIP:-75} --launch-count ${COUNT:-120} \
    ./build/lilac generate --model /tmp/syn4 --backend cuda --ids "$IDS" --max-tokens 6 > "$OUT/ncu.csv" 2>"$OUT/ncu.err"
echo "ncu rc=$?"; tail -3 "$OUT/ncu.err"
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = None
for i, r in enumerate(rows):
    if r and r[0] == 'ID': hdr = i; break
if hdr is None:
    print(open(sys.argv[1]).read()[-3000:]); sys.exit()
H = rows[hdr]; data = rows[hdr + 1:]
ki = H.index('Kernel Name'); mi = H.index('Metric Name'); ai = H.index('Average') if 'Average' in H else H.index('Metric Value')
ci = H.index('Invocations') if 'Invocations' in H else None
out = collections.defaultdict(dict)
for r in data:
    if len(r) <= max(ki, mi, ai): continue
    out[r[ki]][r[mi]] = (r[ai], r[ci] if ci is not None else '')
for k, m in sorted(out.items(), key=lambda kv: -float((kv[1].get('Duration', ('0',''))[0] or '0').replace(',', ''))):
    d = m.get('Duration', ('?', ''))
    print(f"{k[:60]:60s} n={d[1]:>5s} dur={d[0]:>10s} dram={m.get('Memory Throughput', ('?',''))[0]:>6s}% sm={m.get('Compute (SM) Throughput', ('?',''))[0]:>6s}%")
PY
sort -k3 -n "$OUT/clocks.txt" | tail -3
