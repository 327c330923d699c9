#!/usr/bin/env bash
# One device call: GPU tests, then the benchmarks. Results land under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pytest -q -x tests -m gpu -p no:cacheprovider 2>&1 | tail -20 | tee "$OUT/gpu_tests.log"
for dtype in ${DTYPES:-bf16}; do
  python3 -m rtdnn.cli bench --suite resnet50 --dtype "$dtype" --out "$OUT" ${BENCH_ARGS:-} 2>&1 \
    | grep -v Warning | tee "$OUT/bench_$dtype.log"
done
