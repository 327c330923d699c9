#!/usr/bin/env bash
# Batch norm's fused passes (branch fused-norm-passes) on a GPU: the GPU tests of the
# normalizations (the fused kernels' own test among them) and of the RNN's persistent kernels
# (whose grid barrier moved to arrival.py); the device time of ResNet-50's batch norms fused
# and not (fused_norm_ab.py); a training step's host time with main's sources and the
# branch's (host_layers.py; MAIN_SRC: `git archive main src -o main_src.tar`, in the working
# tree, deleted after); the model bench (eager and graphed rows). Triton's cache is restored
# from .device-cache when carried, and saved. A call brings back at most 8 files: the results
# go to $OUT/results.tgz (packed again after each step, so that a call cut short keeps what
# ran), beside $OUT/triton_cache.tgz.
set -u
. benchmarks/probes/suite.sh
packed_results
restore_cache
for t in test_normalization_gpu test_rnn_gpu; do
  RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-150}" env PYTHONPATH=$PWD/src python3 -m pytest -q \
    -n 8 -rf -p no:cacheprovider "tests/$t.py" > "$RES/$t.txt" 2>&1
  echo "== $t: exit $?"; grep -E "passed|failed|FAILED|Error" "$RES/$t.txt" | head -12
  pack
done
timeout 150 env PYTHONPATH=$PWD/src python3 benchmarks/probes/fused_norm_ab.py \
  "$RES/fused_norm_ab.md" > "$RES/fused_norm_ab.txt" 2>&1
echo "== fused_norm_ab: exit $?"; tail -24 "$RES/fused_norm_ab.txt"
pack
trees=$PWD
if [ -n "${MAIN_SRC:-}" ]; then trees="$(main_tree) $PWD"; fi
for tree in $trees; do
  host_step "$tree" "$RES"
  pack
done
timeout "${MODEL_LIMIT:-150}" env PYTHONPATH=$PWD/src python3 -m rtdnn.cli bench \
  --model resnet50 --out "$RES/model" > "$RES/model.txt" 2>&1
echo "== resnet50 model: exit $?"; grep -E "^\| (inference|training)|wall time|all kernels" "$RES/model.txt"
pack
save_cache
