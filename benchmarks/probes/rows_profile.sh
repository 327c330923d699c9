#!/usr/bin/env bash
# ncu profiles of DIRECT's row kernels (kernels/depthwise.py) on suite layers; under $OUT.
set -u
export OUT=${OUT:-gpu-results} PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section SchedulerStats"
prof() {  # suite layer direction kernel-regex specs...
  local suite=$1 layer=$2 direction=$3 regex=$4
  shift 4
  echo "=== $suite $layer $direction $*" >> "$OUT/ncu.txt"
  # Every second matching launch: the warm one of each tile.
  timeout 150 ncu --kernel-name "regex:$regex" --launch-skip 1 --launch-count $((2 * $# - 1)) \
    $SECTIONS python3 benchmarks/probes/rows_profile.py "$suite" "$layer" "$direction" "$@" \
    >> "$OUT/ncu.txt" 2>&1
}
prof depthwise convnext.dw96.56.k7 forward depthwise_rows rows:32:32:16:4 rows:16:64:16:4
prof depthwise effb0.dw32.112.k3 forward depthwise_rows rows:64:32:16:4
prof depthwise convnext.dw96.56.k7 backward_filter depthwise_filter rows:32:32:1:4
prof depthwise effb0.dw32.112.k3 backward_filter depthwise_filter rows:32:32:1:4
echo "== ncu done"
grep -E "^=== |  depthwise|Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Compute \(SM\) Throughput|Executed Ipc A|Issue Slots Busy|Registers Per|Achieved Occupancy|No Eligible|Warp Cycles Per Issued|Stall|LSU|Pipe|L1/TEX Cache Throughput|Mem Busy|Max Bandwidth" "$OUT/ncu.txt" | head -150
