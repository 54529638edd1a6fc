#!/usr/bin/env bash
# The one device script: on a machine with an NVIDIA Hopper GPU, build lilac's
# CUDA backend (sm_90a), run the CUDA tests against the CPU reference, and run
# the benchmarks. Everything it prints last is the summary table.
#
#   bash tools/device/run.sh [quick|full|bench|profile]      (default: full)
#
# Inputs it can use when present (carried by the device tool, git-ignored):
#   .devdeps/root   Debian's jansson/pcre2/utf8proc/microhttpd headers and libraries,
#                   for machines without them (the device image has none)
#   .devdata/tiny   a small oracle checkpoint (tests/oracle makes them)
#   .devdata/tiny-hf  its HF bf16 twin (tools/oracle/make_case.py tiny --hf), for tools/device/hf_check.py
# Results go to $OUT (or build/device-out): logs, bench JSON.
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-full}
OUT=${OUT:-build/device-out}; mkdir -p "$OUT"
LOGS=build/device-logs; mkdir -p "$LOGS"   # every step's log; the important ones are copied to $OUT
if [ -d .devdeps/root ]; then
    D=$PWD/.devdeps/root
    export CPATH=$D/usr/include${CPATH:+:$CPATH}
    export LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
    export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
NPROC=$(nproc)
SUMMARY=()
step() {  # name cmd...
    local name=$1; shift
    local t0=$(date +%s)
    echo "=== $name"
    "$@" 2>&1 | tee "$LOGS/$name.log"
    local rc=${PIPESTATUS[0]}
    SUMMARY+=("$(printf '%-28s rc=%d  %4ds' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
    return $rc
}
step build make -j"$NPROC" WERROR= build/lilac build/cuda-tests/test_cuda || { printf '%s\n' "${SUMMARY[@]}"; exit 1; }

if [ "$MODE" = profile ]; then  # where the time goes: prefill phases (events) and decode kernels (Nsight Compute)
    step synth-full ./build/lilac synth --out /tmp/full --seed 7
    LILAC_PROFILE=1 ./build/lilac bench --model /tmp/full --backend cuda --prompt-lens ${LENS:-4096} --rounds 1 \
        --decode-steps 4 2>&1 | grep -E "profile T=|prefill/s|^ +[0-9]" | head -8
    COUNT=${COUNT:-360} bash tools/device/profile.sh /tmp/full 2>&1 | head -${LINES_MAX:-90}
    exit 0
fi

# 1. Correctness: CUDA against the CPU reference.
[ -d .devdata/tiny ] && step test-tiny ./build/cuda-tests/test_cuda .devdata/tiny
step synth-4layer ./build/lilac synth --out /tmp/syn4 --layers 4 --vocab 8192 --seed 1
step test-real-dims ./build/cuda-tests/test_cuda /tmp/syn4 --quick
# HF transformers (on the device, f32) as an outside oracle for the CUDA path, on the HF bf16
# layout of the tiny oracle checkpoint (lilac loads that layout directly).
[ -d .devdata/tiny-hf ] && step test-hf python3 tools/device/hf_check.py .devdata/tiny-hf --backend cuda --n 128
if command -v compute-sanitizer >/dev/null && [ -d .devdata/tiny ] && [ "$MODE" = full ]; then
    step memcheck-tiny compute-sanitizer --tool memcheck --error-exitcode 9 \
        ./build/lilac generate --model .devdata/tiny --backend cuda --ids 1,2,3,4,5,6,7,8,9,10,11,12 --max-tokens 8
fi

# 2. Benchmarks on the full-size synthetic checkpoint (40 layers, 256 experts, vocab 248,320).
if [ "$MODE" = full ] || [ "$MODE" = bench ]; then
    step synth-full ./build/lilac synth --out /tmp/full --seed 7
    step info-full ./build/lilac info --model /tmp/full
    LILAC_PROFILE=1 step profile ./build/lilac bench --model /tmp/full --backend cuda --prompt-lens 4096 --rounds 1 --decode-steps 8
    step bench ./build/lilac bench --model /tmp/full --backend cuda --prompt-lens ${LENS:-256,1024,4096} \
        --decode-steps 64 --rounds ${ROUNDS:-2} --json "$OUT/bench.json"
fi
for f in test-tiny test-real-dims test-hf profile bench; do [ -f "$LOGS/$f.log" ] && cp "$LOGS/$f.log" "$OUT/"; done
echo "=== summary"
printf '%s\n' "${SUMMARY[@]}"
grep -h -E "FAIL|CHECK failed|passed, .* failed" "$LOGS"/test-*.log 2>/dev/null
[ -f "$LOGS/bench.log" ] && tail -n 8 "$LOGS/bench.log"
