#!/usr/bin/env bash
# Where a decode step's or a prefill's time goes, kernel by kernel: Nsight Compute's
# duration of every kernel of `lilac bench` on the full-size synth (each kernel measured
# alone, so the sum exceeds the wall time by what PDL overlaps), grouped by kernel and grid
# (tools/device/ncu_summary.py). CSV to $OUT/ncu-<mode>.csv. Run by hand:
#   bash tools/device/ncu_times.sh decode|prefill [prompt_len]
#   decode: the graph-launched steps at that context (3 steps' kernels after the warm-up's)
#   prefill: every kernel of the measured prefill
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/device/env.sh
OUT=${OUT:-build/device-out}; mkdir -p "$OUT"
MODE=${1:-decode}
P=${2:-4096}
make -j"$(nproc)" WERROR= build/lilac > /tmp/build-ncu.log 2>&1 || { tail -20 /tmp/build-ncu.log; exit 1; }
[ -d /tmp/full ] || ./build/lilac synth --out /tmp/full --seed 7 > /dev/null
case $MODE in
decode) # the decode kernels only (prefill's own kernels run unprofiled)
    K='regex:^(k_gemv|k_gdn_step|k_attn_prep|k_attn_dec|k_attn_combine|k_moe_down|k_embed|k_argmax)'
    SEL=(--kernel-name "$K" --launch-skip 2000 --launch-count 900); STEPS=16; SUM=() ;;
prefill) SEL=(); STEPS=1; SUM=(--prefill) ;;
*) echo "usage: ncu_times.sh decode|prefill [prompt_len]" >&2; exit 2 ;;
esac
timeout 500 ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum "${SEL[@]}" \
    ./build/lilac bench --model /tmp/full --backend cuda --prompt-lens "$P" --decode-steps "$STEPS" --rounds 1 \
    > "$OUT/ncu-$MODE.csv" 2> "$OUT/ncu-$MODE.err"
echo "ncu rc=$? lines=$(wc -l < "$OUT/ncu-$MODE.csv")"
python3 tools/device/ncu_summary.py "${SUM[@]}" "$OUT/ncu-$MODE.csv"
