#!/usr/bin/env bash
# The Hopper weight gradient with taps innermost and least-waste boxes: its GPU tests, both
# units under both box rules (conv_hopper_filter_units.py), then the vgg16 and resnet50
# backward-filter suites in bf16 beside cuDNN (RTDNN_AUTOTUNE=0). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
gpu_tests filter "${TEST_LIMIT:-120}" "hopper_filter"
timeout "${UNITS_LIMIT:-150}" python3 benchmarks/probes/conv_hopper_filter_units.py "$OUT" > "$OUT/units.txt" 2>&1
echo "== units: exit $?"
suite vgg16 backward_filter bf16 "${SUITE_LIMIT:-90}"
suite resnet50 backward_filter bf16 "${SUITE_LIMIT:-90}"
