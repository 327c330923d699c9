#!/usr/bin/env bash
# The Hopper forward/backward-data kernel's branch work (hopper-narrow-chunks, then
# hopper-wide-tiles and hopper-3d on top): reduced channels that are not a multiple of 128
# bytes (steps of 64-byte rows), 256-pixel tiles in 16-bit data, 3-D at stride 1. Two calls:
#   PART=tests   the kernel's GPU tests (every shape and tile, so the 128-byte, 128-pixel
#                2-D tiles are checked unchanged too) and the TF32 filter-copy tests, then the
#                assorted suite's forward and backward-data untuned (RTDNN_AUTOTUNE=0: the
#                first candidates, as a user's first call runs them);
#   PART=suites  resnet50 forward and backward-data untuned (no regression), then assorted and
#                resnet50 forward tuned (RTDNN_AUTOTUNE=1 into a fresh database: every
#                candidate timed, so the 256-pixel tiles are weighed).
# bf16 beside cuDNN. Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
export RTDNN_TUNING_DB=$OUT/tuning.sqlite
. benchmarks/probes/suite.sh
if [ "${PART:-tests}" = tests ]; then
  gpu_tests hopper_narrow "${TEST_LIMIT:-360}" "test_hopper_kernel or test_hopper_tf32_filter_copy"
  suite assorted forward bf16 90
  suite assorted backward_data bf16 90
else
  suite resnet50 forward bf16 90
  suite resnet50 backward_data bf16 90
  RTDNN_AUTOTUNE=1 suite assorted forward bf16 150 tuned
  RTDNN_AUTOTUNE=1 suite resnet50 forward bf16 200 tuned
fi
