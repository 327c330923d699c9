#!/usr/bin/env bash
# The Hopper weight gradient (kernels/conv_hopper_filter.py) in the product: its GPU tests,
# the resnet50, vgg16 and deepbench_train backward-filter suites in bf16 beside cuDNN (RTDNN_AUTOTUNE=0), then
# the GPU convolution tests of the Hopper kernels, split-K and the weight gradient. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
gpu_tests filter "${TEST_LIMIT:-200}" "hopper_filter"
suite resnet50 backward_filter bf16 100
grep -E "conv2|conv1 " "$OUT/resnet50_backward_filter_bf16/conv_resnet50_bf16.md"
suite vgg16 backward_filter bf16 100
grep -E "^\| conv" "$OUT/vgg16_backward_filter_bf16/conv_vgg16_bf16.md"
suite deepbench_train backward_filter bf16 120
gpu_tests conv_all "${ALL_LIMIT:-150}" "${ALL_FILTER:-hopper or split or filter}"
