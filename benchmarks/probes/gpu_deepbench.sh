#!/usr/bin/env bash
# One GPU call for deepbench_train's backward directions: the convolution GPU tests (split-K
# backward-data among them), split-K against the unsplit kernels on the skinny backward-data
# layers (layer_algos.py, first tile candidates), then the suite's backward-filter in bf16
# (RTDNN_AUTOTUNE=0, the shipped table; DIRECTION picks another). Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline -1
RTDNN_GPU_TESTS=1 timeout "${TESTS_LIMIT:-170}" python3 -m pytest -q -rf -n 12 -p no:cacheprovider \
  tests/test_conv_gpu.py > "$OUT/tests.txt" 2>&1
echo "== tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.txt" | tail -12
cd benchmarks/probes
LAYERS=${LAYERS-"db15 db16 db21 db22 db28 db41 db50 db4 db7"}  # LAYERS= skips this step
args=(); for l in $LAYERS; do args+=("$l:backward_data"); done
[ -n "$LAYERS" ] && timeout "${LAYERS_LIMIT:-150}" python3 layer_algos.py deepbench_train "${args[@]}" --dtype bf16 \
  --algos IMPLICIT_GEMM,IMPLICIT_GEMM_SPLIT_K,GEMM > "$OUT/split_backward_data.txt" 2>&1
echo "== layers: exit $?"; grep -E "cuDNN:|^deepbench| ms \(" "$OUT/split_backward_data.txt"
cd ../..
timeout "${SUITE_LIMIT:-200}" python3 -m rtdnn.cli bench --suite deepbench_train \
  --direction "${DIRECTION:-backward_filter}" --dtype bf16 --out "$OUT/suite" > "$OUT/suite.txt" 2>&1
echo "== suite: exit $?"; tail -5 "$OUT/suite.txt"; ls "$OUT/suite"
