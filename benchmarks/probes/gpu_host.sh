#!/usr/bin/env bash
# One GPU call that measures the host side of eager training (issue 17's and 16's eager rows):
# the GPU tests of what the host path touches, host_layers.py on ResNet-50 (host ms per step,
# with and without launches, backward on autograd's thread or the calling one), then
# `rtdnn bench --model` for each model in MODELS (eager, calling-thread, folded and graphed
# rows), RTDNN_AUTOTUNE=0 with the shipped tile table. Results under $OUT.
set -u
export OUT=${OUT:-gpu-results} PYTHONUNBUFFERED=1 RTDNN_AUTOTUNE=0
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
git log --oneline -1
RTDNN_GPU_TESTS=1 timeout "${TESTS_LIMIT:-120}" env PYTHONPATH=src python3 -m pytest -q -n 0 \
  --tb=short -p no:cacheprovider tests/test_convert_gpu.py \
  "tests/test_conv_gpu.py::test_strided_backward_data_phases_overlap_safely" \
  > "$OUT/tests.txt" 2>&1
echo "== GPU tests: exit $?"; grep -E "passed|failed|error" "$OUT/tests.txt" | tail -3
(cd benchmarks/probes && timeout "${HOST_LIMIT:-170}" env PYTHONPATH=../../src python3 \
  host_layers.py "$OUT/host" > "$OUT/host_layers.txt" 2>&1)
echo "== host_layers: exit $?"
python3 -c "import json; d = json.load(open('$OUT/host/host_layers.json')); \
print({k: v['min_ms'] for k, v in d.items()})"
for m in ${MODELS:-resnet50 efficientnet_b0}; do
  timeout "${MODEL_LIMIT:-250}" env PYTHONPATH=src python3 -m rtdnn.cli bench --model "$m" \
    --out "$OUT/model_$m" > "$OUT/model_$m.txt" 2>&1
  echo "== $m: exit $?"
  grep -E "^\| (inference|training)|wall time|all kernels" "$OUT/model_$m.txt"
done
