#!/usr/bin/env bash
# One device call: the GPU test modules, then the memory-bound benchmarks and the demo.
# Everything lands under $OUT as it finishes, so a time-out keeps what was done.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src RTDNN_GPU_TESTS=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
RTDNN_AUTOTUNE=0 timeout 130 python3 -m pytest -q -n 8 -p no:cacheprovider \
  tests/test_conv_gpu.py tests/test_prims_gpu.py tests/test_normalization_gpu.py \
  > "$OUT/gpu_tests.log" 2>&1
grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -25
timeout 150 python3 -m rtdnn.cli bench --op all --out "$OUT" > "$OUT/bench_ops.log" 2>&1
grep -E "^\|" "$OUT/bench_ops.log" | cut -c1-160 | head -80
timeout 45 python3 -m rtdnn.cli demo > "$OUT/demo.log" 2>&1
tail -2 "$OUT/demo.log"
