#!/usr/bin/env bash
# ncu profiles of DIRECT's row kernels (kernels/depthwise.py) on suite layers; under $OUT.
set -u
export OUT=${OUT:-gpu-results} PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section SchedulerStats"
# PROFILES: "layer direction kernel-regex spec ..." (one profile; specs as rows_profile.py's)
prof() {  # suite layer direction kernel-regex specs...
  local suite=$1 layer=$2 direction=$3 regex=$4
  shift 4
  echo "=== $suite $layer $direction $*" >> "$OUT/ncu.txt"
  # Every second matching launch: the warm one of each tile.
  timeout 150 ncu --kernel-name "regex:$regex" --launch-skip 1 --launch-count $((2 * $# - 1)) \
    $SECTIONS python3 benchmarks/probes/rows_profile.py "$suite" "$layer" "$direction" "$@" \
    >> "$OUT/ncu.txt" 2>&1
}
prof depthwise ${PROFILES:-effb0.dw144.56.k3 forward depthwise_rows rows:32:32:32:4:4}
echo "== ncu done"
grep -E "^=== |  depthwise|Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Compute \(SM\) Throughput|Executed Ipc A|Issue Slots Busy|Registers Per|Achieved Occupancy|No Eligible|Warp Cycles Per Issued|Stall|LSU|Pipe|L1/TEX Cache Throughput|Mem Busy|Max Bandwidth" "$OUT/ncu.txt" | head -150
