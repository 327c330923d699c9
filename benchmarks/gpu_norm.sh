#!/usr/bin/env bash
# One device call for the normalization work: the GPU tests, benchmarks/pdl_probe.py and
# `rtdnn bench --op norm`. Everything lands under $OUT as it finishes.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src RTDNN_GPU_TESTS=1 RTDNN_AUTOTUNE=0
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
git log --oneline | head -1
start=$(date +%s)
timeout "${TEST_LIMIT:-240}" python3 -m pytest -q -rf -n 14 -p no:cacheprovider \
  tests/test_normalization_gpu.py > "$OUT/tests.log" 2>&1
grep -E "passed|failed|^FAILED|Error" "$OUT/tests.log" | tail -8 | cut -c1-300
echo "== tests: $(( $(date +%s) - start )) s"
if [ "${PROBE:-1}" = 1 ]; then
  timeout "${PROBE_LIMIT:-200}" python3 benchmarks/pdl_probe.py "$OUT" > "$OUT/pdl_probe.log" 2>&1
  grep -A80 "^op |" "$OUT/pdl_probe.log" | cut -c1-120; tail -3 "$OUT/pdl_probe.log" | cut -c1-300
  echo "== probe: $(( $(date +%s) - start )) s"
fi
timeout "${BENCH_LIMIT:-240}" python3 -m rtdnn.cli bench --op norm --out "$OUT" \
  > "$OUT/bench_norm.log" 2>&1
grep -E "^\| (bn train|layer norm bwd)" "$OUT/bench_norm.log" | cut -c1-140; tail -2 "$OUT/bench_norm.log" | cut -c1-300
echo "== bench: $(( $(date +%s) - start )) s"
