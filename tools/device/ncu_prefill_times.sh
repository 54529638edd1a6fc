#!/usr/bin/env bash
# Where one prefill's time goes, kernel by kernel: Nsight Compute's duration of
# every kernel of a `lilac bench` prefill on the full-size synth (each kernel
# measured alone: the sum exceeds the prefill by what PDL overlaps). CSV to
# $OUT/ncu-prefill-times.csv, grouped by kernel and grid (tools/device/ncu_summary.py).
# Run by hand:  bash tools/device/ncu_prefill_times.sh [prompt_len]
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/device/env.sh
OUT=${OUT:-build/device-out}; mkdir -p "$OUT"
P=${1:-4096}
make -j"$(nproc)" WERROR= build/lilac > /tmp/build-ncu.log 2>&1 || { tail -20 /tmp/build-ncu.log; exit 1; }
[ -d /tmp/full ] || ./build/lilac synth --out /tmp/full --seed 7 > /dev/null
# the warm-up's prefill and the measured one (decode: one step)
timeout 400 ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum \
    ./build/lilac bench --model /tmp/full --backend cuda --prompt-lens "$P" --decode-steps 1 --rounds 1 \
    > "$OUT/ncu-prefill-times.csv" 2> "$OUT/ncu-prefill-times.err"
echo "ncu rc=$? lines=$(wc -l < "$OUT/ncu-prefill-times.csv")"
python3 tools/device/ncu_summary.py --prefill "$OUT/ncu-prefill-times.csv"
