#!/usr/bin/env bash
# The Hopper forward/backward-data kernel's branch work (hopper-narrow-chunks, then
# hopper-wide-tiles and hopper-3d on top): reduced channels that are not a multiple of 128
# bytes (steps of 64-byte rows), 256-pixel tiles in 16-bit data, 3-D at stride 1. Its GPU tests (every shape and tile, so
# the 128-byte, 128-pixel tiles are checked unchanged too) and the TF32 filter-copy tests;
# then, with RTDNN_AUTOTUNE=1 into a fresh database (every candidate timed, so the 256-pixel
# tiles are weighed), the assorted suite and resnet50 forward and backward-data in bf16 beside
# cuDNN; RTDNN_AUTOTUNE=0 runs keep the untuned view (TUNED=0). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=${TUNED:-1}
export RTDNN_TUNING_DB=$OUT/tuning.sqlite
. benchmarks/probes/suite.sh
gpu_tests hopper_narrow "${TEST_LIMIT:-240}" "test_hopper_kernel or test_hopper_tf32_filter_copy"
suite assorted forward bf16 100
suite assorted backward_data bf16 100
suite resnet50 forward bf16 120
suite resnet50 backward_data bf16 120
