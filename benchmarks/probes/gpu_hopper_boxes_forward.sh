#!/usr/bin/env bash
# The forward/backward-data Hopper kernel with least-waste boxes: its GPU tests, then the
# resnet50 forward and backward-data suites in bf16 beside cuDNN (RTDNN_AUTOTUNE=0). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
gpu_tests hopper "${TEST_LIMIT:-110}" "test_hopper_kernel"
suite resnet50 forward bf16 75
suite resnet50 backward_data bf16 75
