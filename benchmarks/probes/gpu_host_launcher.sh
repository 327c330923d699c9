#!/usr/bin/env bash
# SlotLaunch's generated launcher on a GPU, in one call: the GPU tests of the normalizations
# and of the Hopper convolution kernels (test_conv_gpu.py -k hopper; every launch goes
# through the launcher once its key repeats), a training step's launches in parts
# (host_launch_parts.py), the host-time A/B of host_layers.py with the sources before the
# launcher (BEFORE_SRC: `git archive 466320f src -o before_src.tar` in the working tree,
# deleted after; its kernels are these, compiled once) and these with the process on one
# core, then the model bench on that core. About 600 s in all: ROUNDS=1, TEST_LIMIT=150.
# Results packed into $OUT/results.tgz after each step.
set -u
. benchmarks/probes/suite.sh
packed_results
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-150}" env PYTHONPATH=$PWD/src python3 -m pytest -q -n 8 \
  -rf -p no:cacheprovider tests/test_normalization_gpu.py tests/test_conv_gpu.py \
  -k "normalization or batch_norm or hopper" > "$RES/gpu_tests.txt" 2>&1
echo "== gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$RES/gpu_tests.txt" | head -12
pack
(cd benchmarks/probes && timeout 150 env PYTHONPATH=$PWD/../../src python3 host_launch_parts.py \
  "$RES/launch_parts.json" > "$RES/launch_parts.txt" 2>&1)
echo "== launch parts: exit $?"; grep -v Warn "$RES/launch_parts.txt" | head -24
pack
if [ -n "${BEFORE_SRC:-}" ]; then
  before=/tmp/before_tree/before && mkdir -p $before && tar -xf "$BEFORE_SRC" -C $before
  taskset -pc "${CORE:-3}" $$ > /dev/null
  for round in ${ROUNDS:-1}; do
    for tree in $before "$PWD"; do
      mkdir -p "$RES/round$round" && HOST_LIMIT=${HOST_LIMIT:-100} host_step "$tree" "$RES/round$round"
      pack
    done
  done
fi
taskset -pc "${CORE:-3}" $$ > /dev/null
timeout "${MODEL_LIMIT:-150}" env PYTHONPATH=$PWD/src python3 -m rtdnn.cli bench \
  --model resnet50 --out "$RES/model_pinned" > "$RES/model_pinned.txt" 2>&1
echo "== resnet50 model, one core: exit $?"
grep -E "^\| (inference|training)|wall time|all kernels" "$RES/model_pinned.txt"
pack
