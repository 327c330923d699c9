#!/usr/bin/env bash
# One device call: the GPU test modules, then the memory-bound benchmarks and the demo.
# Everything lands under $OUT as it finishes, so a time-out keeps what was done.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src RTDNN_GPU_TESTS=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
# One module at a time with its own limit and -rf, so a failure is named even if a later
# module runs out of time.
for module in test_conv_gpu test_prims_gpu test_normalization_gpu; do
  RTDNN_AUTOTUNE=0 timeout "${TEST_LIMIT:-150}" python3 -m pytest -q -rf -x -n 8 \
    -p no:cacheprovider "tests/$module.py" > "$OUT/$module.log" 2>&1
  grep -E "passed|failed|^FAILED" "$OUT/$module.log" | tail -5
done
timeout "${BENCH_LIMIT:-240}" python3 -m rtdnn.cli bench --op all --out "$OUT" \
  > "$OUT/bench_ops.log" 2>&1
grep -E "^\|" "$OUT/bench_ops.log" | cut -c1-160 | head -80
timeout 60 python3 -m rtdnn.cli demo > "$OUT/demo.log" 2>&1
tail -2 "$OUT/demo.log"
