#!/usr/bin/env bash
# Where one decode step's time goes, kernel by kernel: Nsight Compute's
# duration of every kernel of the graph-launched decode steps of `lilac bench`
# on the full-size synth at 4k context (each kernel measured alone, so the sum
# exceeds the step: PDL overlap is lost). CSV to $OUT/ncu-decode.csv;
# tools/device/ncu_summary.py groups it by kernel. Run by hand:
#   bash tools/device/ncu_decode.sh [prompt_len]
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/device/env.sh
OUT=${OUT:-build/device-out}; mkdir -p "$OUT"
P=${1:-4096}
make -j"$(nproc)" WERROR= build/lilac > /tmp/build-ncu.log 2>&1 || { tail -20 /tmp/build-ncu.log; exit 1; }
[ -d /tmp/full ] || ./build/lilac synth --out /tmp/full --seed 7 > /dev/null
# the decode kernels only (prefill's own kernels run unprofiled); 3 steps of 64 after the warm-up's
K='regex:^(k_gemv|k_gdn_step|k_attn_prep|k_attn_dec|k_attn_combine|k_moe_down|k_embed|k_argmax)'
timeout 500 ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum --kernel-name "$K" \
    --launch-skip 2000 --launch-count 900 \
    ./build/lilac bench --model /tmp/full --backend cuda --prompt-lens "$P" --decode-steps 16 --rounds 1 \
    > "$OUT/ncu-decode.csv" 2> "$OUT/ncu-decode.err"
echo "ncu rc=$? lines=$(wc -l < "$OUT/ncu-decode.csv")"
python3 tools/device/ncu_summary.py "$OUT/ncu-decode.csv"
