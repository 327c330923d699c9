#!/usr/bin/env bash
# The Hopper weight gradient with taps innermost and least-waste boxes: its GPU tests, both
# units under both box rules (conv_hopper_filter_units.py), then the vgg16 and resnet50
# backward-filter suites in bf16 beside cuDNN (RTDNN_AUTOTUNE=0). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-120}" python3 -m pytest -q -n 12 -rf -p no:cacheprovider \
  tests/test_conv_gpu.py -k hopper_filter > "$OUT/gpu_tests_filter.txt" 2>&1
echo "== filter gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests_filter.txt" | head -20
timeout "${UNITS_LIMIT:-150}" python3 benchmarks/probes/conv_hopper_filter_units.py "$OUT" > "$OUT/units.txt" 2>&1
echo "== units: exit $?"
suite vgg16 backward_filter bf16 "${SUITE_LIMIT:-90}"
suite resnet50 backward_filter bf16 "${SUITE_LIMIT:-90}"
