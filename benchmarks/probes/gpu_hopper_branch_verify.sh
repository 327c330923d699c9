#!/usr/bin/env bash
# After gpu_hopper_branch_ab.sh: the Hopper kernel's GPU tests again (every Hopper tile of
# each shape, now beside the pointer tiles on 64-byte steps), then main against the branch,
# untuned, on vgg16 bf16 forward and backward-data and resnet50 TF32 forward (the load warp's
# taps outside its chunks in other shapes and dtypes), and resnet50 bf16 forward tuned on
# the branch (RTDNN_AUTOTUNE=1: are 256-pixel tiles chosen now?). MAIN_SRC: a tarball of
# main's src/. Under $OUT.
set -u
export PYTHONUNBUFFERED=1 RTDNN_AUTOTUNE=0 RTDNN_TUNING_DB=$OUT/tuning.sqlite
. benchmarks/probes/suite.sh
PYTHONPATH=$PWD/src gpu_tests hopper "${TEST_LIMIT:-300}" \
  "test_hopper_kernel or test_hopper_tf32_filter_copy"
mkdir -p /tmp/main_tree && tar -xf "$MAIN_SRC" -C /tmp/main_tree
for d in forward backward_data; do
  PYTHONPATH=/tmp/main_tree/src suite vgg16 $d bf16 90 main
  PYTHONPATH=$PWD/src suite vgg16 $d bf16 90 branch
done
PYTHONPATH=/tmp/main_tree/src suite resnet50 forward float32 90 main
PYTHONPATH=$PWD/src suite resnet50 forward float32 90 branch
PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=1 suite resnet50 forward bf16 150 tuned
