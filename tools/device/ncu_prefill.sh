#!/usr/bin/env bash
# Why a prefill GEMM runs at the speed it does: Nsight Compute's speed-of-light,
# occupancy, warp-stall, memory and compute sections for a few k_gemm_q
# launches (one layer's projections and grouped experts) of a 4k prefill on
# the full-size synth. Text report to $OUT/ncu-prefill.txt. Run by hand:
#   bash tools/device/ncu_prefill.sh [prompt_len] [kernel regex]
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/device/env.sh
OUT=${OUT:-build/device-out}; mkdir -p "$OUT"
P=${1:-4096}
K=${2:-regex:^k_gemm_q}
make -j"$(nproc)" WERROR= build/lilac > /tmp/build-ncu.log 2>&1 || { tail -20 /tmp/build-ncu.log; exit 1; }
[ -d /tmp/full ] || ./build/lilac synth --out /tmp/full --seed 7 > /dev/null
timeout 500 ncu --clock-control none --kernel-name "$K" --launch-skip 40 --launch-count 6 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis --section LaunchStats --section SchedulerStats \
    ./build/lilac bench --model /tmp/full --backend cuda --prompt-lens "$P" --decode-steps 1 --rounds 1 \
    > "$OUT/ncu-prefill.txt" 2> "$OUT/ncu-prefill.err"
echo "ncu rc=$? lines=$(wc -l < "$OUT/ncu-prefill.txt")"
