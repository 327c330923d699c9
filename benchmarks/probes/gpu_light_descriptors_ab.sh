#!/usr/bin/env bash
# Descriptor views (branch light-descriptors) against main: the GPU tests of every launch that
# takes TMA descriptors (the Hopper convolution kernels, the TMA GEMM), then the host time of a
# ResNet-50 training step (host_layers.py: from a drained GPU, with and without launches)
# with main's sources and the branch's, alternating, then `rtdnn bench --model resnet50` on
# the branch. MAIN_SRC: a tarball of main's src/ (git archive main src -o main_src.tar, in the
# working tree so that it travels; delete it after). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 RTDNN_AUTOTUNE=0 RTDNN_TUNING_DB=$OUT/tuning.sqlite
. benchmarks/probes/suite.sh
PYTHONPATH=$PWD/src gpu_tests descriptors "${TEST_LIMIT:-200}" \
  "(test_hopper_kernel and bf16) or test_hopper_filter_kernel or tma"
RTDNN_GPU_TESTS=1 timeout 120 env PYTHONPATH=$PWD/src python3 -m pytest -q -n 8 \
  -p no:cacheprovider tests/test_gemm_tma_gpu.py > "$OUT/gpu_tests_gemm_tma.txt" 2>&1
echo "== TMA GEMM gpu tests: exit $?"; grep -E "passed|failed" "$OUT/gpu_tests_gemm_tma.txt"
mkdir -p /tmp/main_tree && tar -xf "$MAIN_SRC" -C /tmp/main_tree
for tree in /tmp/main_tree $PWD; do
  name=$(basename "$tree")
  (cd benchmarks/probes && timeout "${HOST_LIMIT:-110}" env PYTHONPATH="$tree/src" python3 \
    host_layers.py "$OUT/host_$name" > "$OUT/host_layers_$name.txt" 2>&1)
  echo "== host_layers $name: exit $?"
  python3 -c "import json; d = json.load(open('$OUT/host_$name/host_layers.json')); \
print({k: v['min_ms'] for k, v in d.items()})"
done
timeout "${MODEL_LIMIT:-150}" env PYTHONPATH=$PWD/src python3 -m rtdnn.cli bench \
  --model resnet50 --out "$OUT/model" > "$OUT/model.txt" 2>&1
echo "== resnet50 model: exit $?"; grep -E "^\| (inference|training)|wall time|all kernels" "$OUT/model.txt"
