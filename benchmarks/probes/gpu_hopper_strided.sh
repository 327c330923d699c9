#!/usr/bin/env bash
# The Hopper convolution at stride 2 (forward): its GPU tests, then the resnet50 suite forward
# in bf16 and float16, deepbench_train forward in bf16 (RTDNN_AUTOTUNE=0, shipped table),
# beside cuDNN. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
nvidia-smi --query-gpu=name --format=csv,noheader
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-200}" python3 -m pytest -q -n 12 -rf -p no:cacheprovider \
  tests/test_conv_gpu.py -k hopper > "$OUT/gpu_tests.txt" 2>&1
echo "== gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.txt" | head -30
source "$(dirname "$0")/suite.sh"
suite resnet50 forward bf16 70
suite resnet50 forward fp16 70
suite deepbench_train forward bf16 150
