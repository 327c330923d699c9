#!/usr/bin/env bash
# Descriptor views (branch light-descriptors) against main: the GPU tests of the launches that
# take TMA descriptors (the Hopper convolution kernels in bf16, the TMA GEMM), then what a
# ResNet-50 training step launches and what each launch costs the host (host_launch_counts.py,
# the branch), then the step's host time (host_layers.py: from a drained GPU, with and without
# launches) with main's sources and the branch's. MAIN_SRC: a tarball of main's src/ (git
# archive main src -o main_src.tar, in the working tree so that it travels; delete it after).
# Under $OUT.
set -u
export PYTHONUNBUFFERED=1 RTDNN_AUTOTUNE=0 RTDNN_TUNING_DB=$OUT/tuning.sqlite
. benchmarks/probes/suite.sh
PYTHONPATH=$PWD/src gpu_tests descriptors "${TEST_LIMIT:-220}" \
  "(test_hopper_kernel and bf16) or (test_hopper_filter_kernel and bf16)"
RTDNN_GPU_TESTS=1 timeout 70 env PYTHONPATH=$PWD/src python3 -m pytest -q -n 8 \
  -p no:cacheprovider tests/test_gemm_tma_gpu.py > "$OUT/gpu_tests_gemm_tma.txt" 2>&1
echo "== TMA GEMM gpu tests: exit $?"; grep -E "passed|failed" "$OUT/gpu_tests_gemm_tma.txt"
(cd benchmarks/probes && timeout "${COUNT_LIMIT:-90}" env PYTHONPATH="$PWD/../../src" python3 \
  host_launch_counts.py "$OUT/launch_counts.json")
echo "== launch counts: exit $?"
for tree in "$(main_tree)" "$PWD"; do
  host_step "$tree" "$OUT"
done
