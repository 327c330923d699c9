#!/usr/bin/env bash
# After the cooperative unit's threshold: the GPU convolution tests of the Hopper kernels,
# split-K and the weight gradient, then the resnet50 (bf16, fp16) and deepbench_train
# backward-filter suites beside cuDNN (RTDNN_AUTOTUNE=0). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
RTDNN_GPU_TESTS=1 timeout "${ALL_LIMIT:-200}" python3 -m pytest -q -n 14 -rf -p no:cacheprovider \
  tests/test_conv_gpu.py -k "hopper or split or filter" > "$OUT/gpu_tests_conv.txt" 2>&1
echo "== conv gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests_conv.txt" | head -20
suite resnet50 backward_filter bf16 80
suite resnet50 backward_filter fp16 80
suite deepbench_train backward_filter bf16 100
