#!/usr/bin/env bash
# Backward-filter suites in bf16 beside cuDNN (RTDNN_AUTOTUNE=0) once the heuristic leaves the
# layers the Hopper weight-gradient kernel serves to it, then the GPU tests of split-K and the
# weight gradient. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
for s in resnet50 vgg16; do
  suite $s backward_filter bf16 100
  grep -E "^\| (conv|l)" "$OUT/${s}_backward_filter_bf16/conv_${s}_bf16.md" | grep -v "conv1 \|conv3 \|down" | cut -c1-90
done
suite deepbench_train backward_filter bf16 120
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-110}" python3 -m pytest -q -n 12 -rf -p no:cacheprovider \
  tests/test_conv_gpu.py -k "split_k or filter" > "$OUT/gpu_tests_split_filter.txt" 2>&1
echo "== split-K and filter gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests_split_filter.txt" | head -20
