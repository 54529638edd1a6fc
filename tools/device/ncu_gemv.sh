#!/usr/bin/env bash
# Why a decode GEMV launch takes what it takes: the machine code size of each
# kernel of bench_gemv (cuobjdump) and, for one launch of the GDN input
# projection and of k_moe_down, Nsight Compute's warp stall reasons (what each
# issued instruction waited for, in cycles). Run by hand on the device:
#   bash tools/device/ncu_gemv.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. tools/device/env.sh
make -j"$(nproc)" WERROR= build/cuda-tests/bench_gemv > /tmp/build-ncu.log 2>&1 || { tail -20 /tmp/build-ncu.log; exit 1; }
echo "=== SASS instructions per kernel (16 bytes each)"
cuobjdump -sass build/cuda-tests/bench_gemv | awk '/Function :/{name=$3} /^ +\/\*[0-9a-f]+\*\//{n[name]++} END{for (k in n) print n[k], k}' |
    sort -rn | head -24
M='regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,smsp__inst_executed.sum,sm__cycles_elapsed.avg,gpu__time_duration.sum,smsp__warps_active.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.per_cycle_active'
for only in gdn k_moe lm_head; do
    k=k_gemv; [ "$only" = k_moe ] && k=k_moe_down
    echo "=== ncu: $only ($k)"
    BENCH_ONLY=$only timeout 200 ncu --clock-control none --kernel-name "regex:^$k" --launch-skip 60 --launch-count 1 \
        --metrics "$M" ./build/cuda-tests/bench_gemv 2>&1 | grep -E "k_gemv|k_moe|stalled|inst_executed|cycles_elapsed|duration|warps_active|dram__|issue_active|ERR" |
        awk '{ if ($0 ~ /stalled/) { if ($NF+0 >= 0.05) print } else print }'
done
