#!/usr/bin/env bash
# The Hopper kernel in float32 (TF32 products): forward, and backward-data on
# IMPLICIT_PRECOMP_GEMM's filter copy with k innermost. Its GPU tests, then the resnet50
# forward and backward-data suites in TF32 beside cuDNN with the kernel on and off
# (RTDNN_HOPPER_CONV=0), and vgg16's, RTDNN_AUTOTUNE=0. Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
gpu_tests hopper "${TEST_LIMIT:-150}" "test_hopper_kernel or tf32_filter_copy"
for direction in forward backward_data; do
  suite resnet50 "$direction" float32 90
  RTDNN_HOPPER_CONV=0 suite resnet50 "$direction" float32 90 off
  suite vgg16 "$direction" float32 90
done
