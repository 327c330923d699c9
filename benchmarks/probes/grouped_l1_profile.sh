#!/usr/bin/env bash
# What keeps the L1 unit busy in DIRECT's tensor-core kernels on a ResNeXt-50 grouped layer
# (g128.56, 4 channels per group): ncu's memory tables (global sectors per request, shared
# memory wavefronts and bank conflicts) and warp stalls, for the flat tiles and the ring,
# forward. Results under $OUT/grouped_l1_ncu.txt; a digest is printed.
set -u
export OUT=${OUT:-gpu-results} PYTHONPATH=src RTDNN_AUTOTUNE=0 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy --section SourceCounters"
METRICS="--metrics l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts.sum,l1tex__lsu_writeback_active.sum,l1tex__throughput.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_shared_st.sum,smsp__inst_executed_op_global_ld.sum,sm__cycles_elapsed.avg"
prof() {  # label kernel-regex (a warm launch of the first tile candidate)
  echo "=== $1" >> "$OUT/grouped_l1_ncu.txt"
  timeout 150 ncu --clock-control none --kernel-name "regex:$2" --launch-skip 1 --launch-count 1 \
    $SECTIONS $METRICS python3 benchmarks/probes/direct_profile.py grouped resnext50.g128.56 \
    forward DIRECT 3 >> "$OUT/grouped_l1_ncu.txt" 2>&1
}
prof ring direct_dot_rows_forward
KERNEL=dot prof flat "direct_dot_forward_kernel"
grep -E "^=== |Duration|L1/TEX Cache Throughput|l1tex__|smsp__inst|Shared.*Conflicts|Bank Conflicts|Stall|stall|Warp Cycles Per Issued|Achieved Occupancy" "$OUT/grouped_l1_ncu.txt" | cut -c1-150 | head -80
