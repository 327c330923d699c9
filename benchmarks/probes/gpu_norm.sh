#!/usr/bin/env bash
# One device call for the normalization work: the GPU tests, benchmarks/probes/flush_probe.py, a
# Find smoke test (core.timing on the default stream) and `rtdnn bench --op all` (the norm and
# primitives tables). Everything lands under $OUT as it finishes.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src RTDNN_GPU_TESTS=1 RTDNN_AUTOTUNE=0
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
start=$(date +%s)
timeout "${TEST_LIMIT:-240}" python3 -m pytest -q -rf -n 14 -p no:cacheprovider \
  tests/test_normalization_gpu.py > "$OUT/tests.log" 2>&1
grep -E "passed|failed|^FAILED|Error" "$OUT/tests.log" | tail -8 | cut -c1-300
echo "== tests: $(( $(date +%s) - start )) s"
if [ "${PROBE:-1}" = 1 ]; then
  timeout "${PROBE_LIMIT:-150}" python3 benchmarks/probes/flush_probe.py "$OUT" > "$OUT/flush_probe.log" 2>&1
  grep -E "^\{\"op\": \"copy|^op \||\| (rtdnn|eager) \|" "$OUT/flush_probe.log" | cut -c1-130
  tail -2 "$OUT/flush_probe.log" | grep -i error | cut -c1-300
  echo "== probe: $(( $(date +%s) - start )) s"
fi
timeout 60 python3 -W error::UserWarning -c "
import torch, rtdnn
x = torch.randn(8, 16, 14, 14, device='cuda'); w = torch.randn(32, 16, 3, 3, device='cuda')
print('find:', [(a.algo, round(a.time_ms, 4)) for a in rtdnn.find_conv_algorithms(x, w, padding=1)])
" 2>&1 | tail -2 | cut -c1-300
timeout "${BENCH_LIMIT:-300}" python3 -m rtdnn.cli bench --op all --out "$OUT" \
  > "$OUT/bench_ops.log" 2>&1
grep -c "^| " "$OUT/bench_ops.log"; grep -i "warn\|error" "$OUT/bench_ops.log" | head -5 | cut -c1-200
echo "== bench: $(( $(date +%s) - start )) s"
