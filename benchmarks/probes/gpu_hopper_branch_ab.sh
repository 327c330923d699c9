#!/usr/bin/env bash
# The Hopper kernel's branch work (3-D, 64-byte steps, 256-pixel tiles, the load warp's taps
# outside its chunks) against main, in two calls; each first runs the kernel's GPU tests
# (every Hopper tile of each shape), then main and the branch in one process each,
# alternating, bf16 untuned (RTDNN_AUTOTUNE=0):
#   PART=ab      resnet50 forward twice each and backward-data once each (the strided 3x3
#                layers: did the load warp's arithmetic cost?), then the assorted suite on
#                the branch, forward and backward-data;
#   PART=verify  vgg16 forward and backward-data, resnet50 TF32 forward (other shapes and
#                dtypes), and resnet50 bf16 forward tuned on the branch (RTDNN_AUTOTUNE=1).
# MAIN_SRC: a tarball of main's src/. Under $OUT.
set -u
export PYTHONUNBUFFERED=1 RTDNN_AUTOTUNE=0 RTDNN_TUNING_DB=$OUT/tuning.sqlite
. benchmarks/probes/suite.sh
PYTHONPATH=$PWD/src gpu_tests hopper "${TEST_LIMIT:-300}" \
  "test_hopper_kernel or test_hopper_tf32_filter_copy"
mkdir -p /tmp/main_tree && tar -xf "$MAIN_SRC" -C /tmp/main_tree
# `ab NAME DIRECTION DTYPE TAG`: the suite with main's sources, then the branch's.
ab() {
  PYTHONPATH=/tmp/main_tree/src suite "$1" "$2" "$3" 90 "main$4"
  PYTHONPATH=$PWD/src suite "$1" "$2" "$3" 90 "branch$4"
}
if [ "${PART:-ab}" = ab ]; then
  ab resnet50 forward bf16 1
  ab resnet50 forward bf16 2
  ab resnet50 backward_data bf16 ""
  export PYTHONPATH=$PWD/src
  suite assorted forward bf16 90
  suite assorted backward_data bf16 90
else
  ab vgg16 forward bf16 ""
  ab vgg16 backward_data bf16 ""
  ab resnet50 forward float32 ""
  PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=1 suite resnet50 forward bf16 150 tuned
fi
