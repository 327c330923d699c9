#!/usr/bin/env bash
# The Gluon TMA-per-tap convolution at the GPU's own clocks: its kernel time alone (output
# preallocated) for three tile shapes, and ncu without clock control beside cuDNN's kernel on
# VGG's 256-channel 56x56 layer (LAYERS[4]). Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
P=benchmarks/probes/conv_gluon_probe.py
for v in 0 1 4; do timeout 60 python3 $P time-tma 4 $v 2>&1 | grep -v Warn | tail -2; done
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis"
for v in 0 4; do
  timeout 90 ncu --clock-control none --kernel-name regex:conv_forward_tma --launch-count 1 \
    $SECTIONS python3 $P profile-tma 4 $v > "$OUT/ncu_free_tma_v$v.txt" 2>&1
done
timeout 90 ncu --clock-control none --kernel-name regex:"xmma|conv|implicit" --launch-count 1 \
  $SECTIONS python3 $P profile-cudnn 4 > "$OUT/ncu_free_cudnn.txt" 2>&1
for f in "$OUT"/ncu_free_*.txt; do
  echo "=== $f"; grep -E "^  [a-z_0-9]+.*\(|SM Frequency|Duration|Memory Throughput|L2 Cache Throughput|L1/TEX Cache|Compute \(SM\)|DRAM Throughput|Issued Warp|No Eligible|Warp Cycles Per Issued|Max Bandwidth|Mem Pipes|Executed Ipc A|Issue Slots" "$f" | head -20
done
