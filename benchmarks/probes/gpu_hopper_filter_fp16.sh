#!/usr/bin/env bash
# ResNet-50's backward-filter in float16 beside cuDNN (RTDNN_AUTOTUNE=0), then the GPU tests of
# split-K and the weight gradient with a longer limit. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
suite resnet50 backward_filter fp16 90
gpu_tests split_filter "${TEST_LIMIT:-150}" "split_k or filter"
