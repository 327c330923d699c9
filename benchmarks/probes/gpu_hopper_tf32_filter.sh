#!/usr/bin/env bash
# The Hopper weight gradient in float32 (TF32 products, x's boxes transposed by the kernel):
# its GPU tests (TF32 only with ONLY_TF32=1, else every dtype), then the resnet50 and vgg16
# backward-filter suites in TF32 beside cuDNN, RTDNN_AUTOTUNE=0; with OFF=1 also resnet50's
# with the kernel off (RTDNN_HOPPER_CONV=0: bf16x3 on the pointer tiles). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
tests="test_hopper_filter_kernel${ONLY_TF32:+ and tf32}"
gpu_tests hopper_filter "${TEST_LIMIT:-200}" "$tests"
suite resnet50 backward_filter float32 120
[ -n "${OFF:-}" ] && RTDNN_HOPPER_CONV=0 suite resnet50 backward_filter float32 150 off
suite vgg16 backward_filter float32 120
# With BF16=1: the 16-bit suites the 64-wide units reach (64-channel layers).
if [ -n "${BF16:-}" ]; then
  suite vgg16 backward_filter bf16 120
  suite resnet50 backward_filter bf16 120
  suite deepbench_train backward_filter bf16 180
fi
