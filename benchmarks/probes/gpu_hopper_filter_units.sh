#!/usr/bin/env bash
# The Hopper weight gradient's cooperative 128 x 256 unit beside ping-pong's 128 x 128: the
# GPU tests of the kernel, both units timed on the suites' layers and beyond
# (conv_hopper_filter_units.py), and Nsight Compute on VGG-16's conv512_512_28. Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-200}" python3 -m pytest -q -n 12 -rf -p no:cacheprovider \
  tests/test_conv_gpu.py -k hopper_filter > "$OUT/gpu_tests_filter.txt" 2>&1
echo "== filter gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests_filter.txt" | head -30
timeout "${UNITS_LIMIT:-200}" python3 benchmarks/probes/conv_hopper_filter_units.py "$OUT" > "$OUT/units.txt" 2>&1
echo "== units: exit $?"; tail -3 "$OUT/units.txt"
timeout "${NCU_LIMIT:-120}" ncu --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section ComputeWorkloadAnalysis --section WarpStateStats -k regex:conv_filter_hopper -c 2 \
  python3 benchmarks/probes/conv_hopper_filter_ncu.py > "$OUT/ncu_filter_units.txt" 2>&1
echo "== ncu: exit $?"
