#!/usr/bin/env bash
# The Hopper kernel's branch work (3-D, 64-byte steps, 256-pixel tiles, the load warp's taps
# outside its chunks) against main: the kernel's GPU tests, then main and the branch in one
# process each, alternating, bf16 untuned (RTDNN_AUTOTUNE=0): resnet50 forward twice each and
# backward-data once each (the strided 3x3 layers: did the load warp's arithmetic cost?),
# then the assorted suite on the branch, forward and backward-data. MAIN_SRC: a tarball of
# main's src/. Under $OUT.
set -u
export PYTHONUNBUFFERED=1 RTDNN_AUTOTUNE=0 RTDNN_TUNING_DB=$OUT/tuning.sqlite
. benchmarks/probes/suite.sh
PYTHONPATH=$PWD/src gpu_tests hopper "${TEST_LIMIT:-300}" \
  "test_hopper_kernel or test_hopper_tf32_filter_copy"
mkdir -p /tmp/main_tree && tar -xf "$MAIN_SRC" -C /tmp/main_tree
for round in 1 2; do
  PYTHONPATH=/tmp/main_tree/src suite resnet50 forward bf16 90 "main$round"
  PYTHONPATH=$PWD/src suite resnet50 forward bf16 90 "branch$round"
done
PYTHONPATH=/tmp/main_tree/src suite resnet50 backward_data bf16 90 main
PYTHONPATH=$PWD/src suite resnet50 backward_data bf16 90 branch
export PYTHONPATH=$PWD/src
suite assorted forward bf16 90
suite assorted backward_data bf16 90
