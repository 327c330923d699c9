#!/usr/bin/env bash
# The forward/backward-data Hopper kernel with least-waste boxes: its GPU tests, then the
# resnet50 forward and backward-data suites in bf16 beside cuDNN (RTDNN_AUTOTUNE=0). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-110}" python3 -m pytest -q -n 14 -rf -p no:cacheprovider \
  tests/test_conv_gpu.py -k "test_hopper_kernel" > "$OUT/gpu_tests_hopper.txt" 2>&1
echo "== hopper gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests_hopper.txt" | head -20
suite resnet50 forward bf16 75
suite resnet50 backward_data bf16 75
