#!/usr/bin/env bash
# The Hopper forward/backward-data kernel on reduced channels that are not a multiple of 128
# bytes (steps of 64-byte rows, branch hopper-narrow-chunks): its GPU tests (every shape, so
# the 128-byte steps are checked unchanged too) and the TF32 filter-copy tests, then the
# assorted suite (96-, 160-, 288-channel layers) and resnet50 forward and backward-data in
# bf16 beside cuDNN, RTDNN_AUTOTUNE=0. Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
gpu_tests hopper_narrow "${TEST_LIMIT:-200}" "test_hopper_kernel or test_hopper_tf32_filter_copy"
suite assorted forward bf16 90
suite assorted backward_data bf16 90
suite resnet50 forward bf16 90
suite resnet50 backward_data bf16 90
