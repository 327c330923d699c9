#!/usr/bin/env bash
# Nsight Compute on the Hopper forward/backward-data kernel where it is furthest from 55% of
# the matmul ceiling (H200, bf16): ResNet-50's l1.0.conv2 forward (64 channels at 56x56, one
# chunk a tap) and l3.0.conv2 backward-data (stride 2: one launch per stride phase). The
# last call of each (after two warm-ups), the kernel's sections on throughput, memory, warp
# states and the scheduler; the clocks left alone (--clock-control none). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
run() {  # run NAME DIRECTION LAYER LAUNCHES_TO_SKIP LAUNCHES
  timeout 140 ncu --clock-control none --kernel-name regex:conv_hopper_kernel \
    --launch-skip "$4" --launch-count "$5" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy \
    python3 benchmarks/probes/hopper_layer_run.py resnet50 "$2" bf16 "$3" 1 \
    > "$OUT/ncu_$1.txt" 2>&1
  echo "== $1: exit $?"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Stall|Issued Warp|No Eligible" \
    "$OUT/ncu_$1.txt" | head -30
}
run l1.0.conv2_forward forward l1.0.conv2 2 1  # the third call's one launch
run l3.0.conv2_backward_data backward_data l3.0.conv2 8 4  # its four phase launches
