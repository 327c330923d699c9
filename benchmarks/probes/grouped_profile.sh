#!/usr/bin/env bash
# ncu profiles of DIRECT's block-diagonal tensor-core kernels on ResNeXt-50 grouped layers
# (4 and 16 channels per group), heuristic tiles (the first tensor-core candidate), with the
# source-level stall counters. Results under $OUT/grouped_ncu.txt.
set -u
export OUT=${OUT:-gpu-results} PYTHONPATH=src RTDNN_AUTOTUNE=0 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats --section InstructionStats --section SourceCounters"
prof() {  # layer direction kernel-regex skip
  echo "=== $*" >> "$OUT/grouped_ncu.txt"
  timeout 150 ncu --clock-control none --kernel-name "regex:$3" --launch-skip "$4" --launch-count 1 \
    $SECTIONS python3 benchmarks/probes/direct_profile.py grouped "$1" "$2" DIRECT 3 \
    >> "$OUT/grouped_ncu.txt" 2>&1
}
prof resnext50.g128.56 forward direct_dot_forward 2
prof resnext50.g128.56 backward_filter direct_dot_filter 2
prof resnext50.g512.14 forward direct_dot_forward 2
grep -E "^=== |Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Compute \(SM\) Throughput|Executed Ipc A|Issue Slots Busy|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Stall|stall|Shared Memory Configuration Size|Dynamic Shared" "$OUT/grouped_ncu.txt" | cut -c1-160 | head -150
