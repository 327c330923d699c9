#!/usr/bin/env bash
# ResNet-50's backward-filter in float16 beside cuDNN (RTDNN_AUTOTUNE=0), then the GPU tests of
# split-K and the weight gradient with a longer limit. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
suite resnet50 backward_filter fp16 90
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-150}" python3 -m pytest -q -n 14 -rf -p no:cacheprovider \
  tests/test_conv_gpu.py -k "split_k or filter" > "$OUT/gpu_tests_split_filter.txt" 2>&1
echo "== split-K and filter gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests_split_filter.txt" | head -20
