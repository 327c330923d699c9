#!/usr/bin/env bash
# The Hopper convolution's backward-data at stride 2 (a launch per stride phase of dx): its
# GPU tests, then the resnet50 suite's backward-data in bf16 (RTDNN_AUTOTUNE=0, shipped
# table) beside cuDNN. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-120}" python3 -m pytest -q -n 12 -rf -p no:cacheprovider \
  tests/test_conv_gpu.py -k hopper > "$OUT/gpu_tests.txt" 2>&1
echo "== gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.txt" | head -30
timeout "${SUITE_LIMIT:-75}" python3 -m rtdnn.cli bench --suite resnet50 --direction backward_data \
  --dtype bf16 --out "$OUT/resnet50_backward_data" > "$OUT/resnet50_backward_data.txt" 2>&1
echo "== resnet50 backward_data: exit $?"
grep -E "geomean|\.0\.|down" "$OUT/resnet50_backward_data.txt"
