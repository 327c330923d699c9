#!/usr/bin/env bash
# After the cooperative unit's threshold: the GPU convolution tests of the Hopper kernels,
# split-K and the weight gradient, then the resnet50 (bf16, fp16) and deepbench_train
# backward-filter suites beside cuDNN (RTDNN_AUTOTUNE=0). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
gpu_tests conv "${ALL_LIMIT:-200}" "hopper or split or filter"
suite resnet50 backward_filter bf16 80
suite resnet50 backward_filter fp16 80
suite deepbench_train backward_filter bf16 100
