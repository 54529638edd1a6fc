#!/usr/bin/env bash
# Runs every lilac test suite and ends with one line: "N passed, N failed".
#  - C unit tests (tests/unit/test_*.c), plain build and ASan+UBSan build;
#  - fuzz targets, a bounded run each over their seed corpus;
#  - CUDA kernels on the CPU (the emulator of tests/cuda/emu, `make emu-tests`): the device sampler, the
#    chunked GDN prefill, the wgmma GEMM and attention, the decode attention, GEMV and MoE;
#  - Python suites against outside oracles (tests/**/test_*.py, pytest in .venv).
# Each suite prints its own summary with "N passed" / "N failed"; this script adds them up.
# A suite that crashes or prints no summary counts as one failure.
set -u
cd "$(dirname "$0")/.."
TOTAL_P=0; TOTAL_F=0
LOG=build/test-logs; mkdir -p "$LOG"
# Every suite runs under a timeout: a hang is a failure with the suite's name, not a stalled run.
SUITE_TIMEOUT=${SUITE_TIMEOUT:-1500}

# A tool the suites need that is missing is a failure, never a silent skip.
require() {  # name test-command...
    local name=$1; shift
    if ! "$@" >/dev/null 2>&1; then
        TOTAL_F=$((TOTAL_F + 1)); printf '%-44s %4s passed %4s failed\n' "$name" 0 1
        echo "   | missing: $*"
        return 1
    fi
}

# The repository is self-contained: under CI, .ci/run mounts the clone where it has no sibling
# folders, and this proves that it did (every suite below then runs with nothing beside the repository).
if [ "${CI:-}" = true ]; then
    sib=$(ls -A .. | grep -vx "$(basename "$PWD")" | head -n 3)
    if [ -z "$sib" ]; then TOTAL_P=$((TOTAL_P + 1)); printf '%-44s %4s passed %4s failed\n' repo/no-siblings 1 0
    else TOTAL_F=$((TOTAL_F + 1)); printf '%-44s %4s passed %4s failed\n' repo/no-siblings 0 1; echo "   | beside the repo: $sib"; fi
fi

tally() {  # name rc logfile
    local name=$1 rc=$2 log=$3 p f e line
    line=$(grep -E '[0-9]+ passed' "$log" | tail -n 1)
    p=$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || true)
    f=$(echo "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' || true)
    # pytest's errors (a fixture or a collection that broke) are failures too
    e=$(grep -E '[0-9]+ errors?( |$|,)' "$log" | tail -n 1 | grep -oE '[0-9]+ errors?' | grep -oE '[0-9]+' || true)
    p=${p:-0}; f=$(( ${f:-0} + ${e:-0} ))
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then f=$((f + 1)); echo "   (timed out after ${SUITE_TIMEOUT}s)" >>"$log"; fi
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; fi
    if [ -z "$line" ] && [ "$rc" = 0 ]; then f=1; echo "   (no summary line)"; fi
    TOTAL_P=$((TOTAL_P + p)); TOTAL_F=$((TOTAL_F + f))
    printf '%-44s %4s passed %4s failed\n' "$name" "$p" "$f"
    if [ "$f" != 0 ]; then tail -n 40 "$log" | sed 's/^/   | /'; fi
}

run_suite() {  # name cmd...
    local name=$1; shift
    local log="$LOG/$(echo "$name" | tr '/ ' '__').log"
    timeout --kill-after=20 "$SUITE_TIMEOUT" "$@" >"$log" 2>&1; tally "$name" $? "$log"
}

for b in build/tests/test_*; do
    [ -x "$b" ] && run_suite "c/$(basename "$b")" "$b"
done
for b in build/asan/tests/test_*; do
    [ -x "$b" ] && run_suite "asan/$(basename "$b")" env ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$b"
done
for b in build/fuzz/fuzz_*; do
    [ -x "$b" ] || continue
    name=$(basename "$b"); corpus=fuzz/corpus/${name#fuzz_}
    mkdir -p "$LOG/fuzzwork/$name"
    run_suite "fuzz/$name" bash -c "'$b' -runs=${FUZZ_RUNS:-30000} -max_total_time=${FUZZ_SECONDS:-60} -max_len=4096 '$LOG/fuzzwork/$name' '$corpus' && echo '1 passed, 0 failed'"
done
# CUDA kernels on the CPU, through the emulator of tests/cuda/emu (`make emu-tests`, g++ only; no GPU):
#  - test_sample: the device sampler (src/backend/cuda/cuda_sample.cu), draw for draw against the host sampler;
#  - test_gdn_chunk: the chunked GDN prefill (cuda_gdn_chunk.cuh; the tf32 mma.sync's stand-in, emu/mma.h)
#    against the serial delta rule in double;
#  - test_gemm_wg: the 4-bit prefill GEMM on wgmma (cuda_gemm_wg.cuh; emu/wgmma.h) against the dequantised
#    product in double;
#  - test_attn_wg: the prefill attention on wgmma (cuda_attn_wg.cuh) against causal gated attention in double,
#    both precisions;
#  - test_attn_dec: the decode attention (cuda_attn_dec.cuh; ldmatrix, movmatrix and the bf16 mma.sync)
#    against one token's attention in double;
#  - test_gemv: the decode GEMV (k_gemv, cuda_gemv.cuh; the s8 mma.sync, bulk copies and mbarrier phases)
#    against the products in double from the same codes, and pk_stage4's bytes against its layout;
#  - test_moe_split: the decode MoE (k_moe_split, cuda_moe_dec.cuh) against one token's MoE in double.
# All but test_sample and test_gdn_chunk run twice, the second time with the threads resumed in a random
# order after each barrier (CUEMU_SHUFFLE=1).
if require "emu/g++" command -v g++; then
    run_suite "emu/build" bash -c "make -s -j\"${EMU_JOBS:-2}\" emu-tests && echo '1 passed, 0 failed'"
    if grep -q '^1 passed, 0 failed$' "$LOG/emu_build.log"; then  # (a failed build: no stale binary runs)
        E=build/emu-tests
        run_suite "emu/test_sample" env CUEMU_MAX_THREADS=128 $E/test_sample_emu --quick
        run_suite "emu/test_gdn_chunk" $E/test_gdn_chunk_emu
        for t in gemm_wg attn_wg attn_dec gemv moe_split; do
            run_suite "emu/test_$t" bash -c "$E/test_${t}_emu && CUEMU_SHUFFLE=1 $E/test_${t}_emu"
        done
    fi
fi
# The whole CUDA backend on the emulator (`make emu`: build/emu/lilac) against the CPU backend,
# token for token (tests/emu; docs/testing.md says what it covers and what it cannot).
if require "emu/g++ (make emu)" command -v g++; then
    run_suite "emu/build-lilac" bash -c "make -s -j\"${EMU_JOBS:-2}\" emu && echo '1 passed, 0 failed'"
    if grep -q '^1 passed, 0 failed$' "$LOG/emu_build-lilac.log" && [ -x .venv/bin/python ]; then
        run_suite "emu/lilac-vs-cpu" env LILAC=build/lilac LILAC_EMU=build/emu/lilac \
            .venv/bin/python -m pytest -q -p no:cacheprovider tests/emu
    fi
fi
if require "py/.venv" test -x .venv/bin/python; then
    for t in $(find tests -path tests/emu -prune -o -name 'test_*.py' -print | sort); do  # (tests/emu: above)
        run_suite "py/$t" env LILAC=build/lilac .venv/bin/python -m pytest -q -p no:cacheprovider "$t"
    done
    # The model against MLX-LM once more with the ASan+UBSan binary (tiny case: both layouts,
    # broken checkpoints, quantization at load).
    if [ -x build/asan/lilac ]; then
        run_suite "asan-py/oracle-tiny" env LILAC=build/asan/lilac LILAC_ORACLE_CASES=tiny \
            ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
            .venv/bin/python -m pytest -q -p no:cacheprovider tests/oracle/test_model_vs_mlx.py tests/cli/test_quantize_at_load.py
        # The network-facing server under AddressSanitizer + UBSan: the whole server suite again.
        run_suite "asan-py/server" env LILAC=build/asan/lilac \
            ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
            .venv/bin/python -m pytest -q -p no:cacheprovider tests/server
    fi
fi
echo "$TOTAL_P passed, $TOTAL_F failed"
[ "$TOTAL_F" = 0 ]
