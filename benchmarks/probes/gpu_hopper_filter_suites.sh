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
gpu_tests split_filter "${TEST_LIMIT:-110}" "split_k or filter"
