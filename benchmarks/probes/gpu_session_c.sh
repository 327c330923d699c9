#!/usr/bin/env bash
# The weight-gradient probe (gpu_hopper_filter.sh), then backward-data suites re-measured
# after the Hopper kernel's stride-2 backward-data: resnet50 fp16 and deepbench_train bf16.
# Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
LIMIT=220 bash benchmarks/probes/gpu_hopper_filter.sh
suite resnet50 backward_data fp16 120
suite deepbench_train backward_data bf16 150
