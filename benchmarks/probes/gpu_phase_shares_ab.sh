#!/usr/bin/env bash
# Backward-data's stride phases on shares of the multiprocessors (branch phase-shares) against
# main: the Hopper kernel's backward-data GPU tests, then the resnet50 and assorted suites'
# backward-data (bf16, RTDNN_AUTOTUNE=0) with main's sources and the branch's, alternating.
# MAIN_SRC: a tarball of main's src/. Under $OUT.
set -u
export PYTHONUNBUFFERED=1 RTDNN_AUTOTUNE=0 RTDNN_TUNING_DB=$OUT/tuning.sqlite
. benchmarks/probes/suite.sh
PYTHONPATH=$PWD/src gpu_tests hopper_data "${TEST_LIMIT:-150}" \
  "test_hopper_kernel and backward_data"
mkdir -p /tmp/main_tree && tar -xf "$MAIN_SRC" -C /tmp/main_tree
for round in 1 2; do
  PYTHONPATH=/tmp/main_tree/src suite resnet50 backward_data bf16 90 "main$round"
  PYTHONPATH=$PWD/src suite resnet50 backward_data bf16 90 "branch$round"
done
PYTHONPATH=/tmp/main_tree/src suite assorted backward_data bf16 90 main
PYTHONPATH=$PWD/src suite assorted backward_data bf16 90 branch
