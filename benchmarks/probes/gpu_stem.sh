#!/usr/bin/env bash
# One GPU run for few-channel (RGB stem) layers: every IMPLICIT_GEMM forward tile or
# IMPLICIT_GEMM_SPLIT_K backward-filter tile (DIRECTION), the filter-row tiles among them,
# beside cuDNN (conv_tiles_probe.py); ncu on the tiles named in NCU_TILES on ResNet-50's stem;
# the GPU tests of those tiles; then `rtdnn bench` runs named in BENCH ("suite:dtype:direction"
# words). PROBES: "suite:layer:dtype" words. Results under $OUT.
set -u
export OUT=${OUT:-gpu-results} PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
DIRECTION=${DIRECTION:-forward}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
start=$(date +%s)
probe() {  # suite layer dtype limit
  timeout "$4" python3 benchmarks/probes/conv_tiles_probe.py "$1" "$2" "$DIRECTION" "$3" \
    > "$OUT/tiles_$1_$3_$DIRECTION.txt" 2>&1
  echo "== $1 $2 $3: exit $?, $(( $(date +%s) - start )) s"
  sed -n '/best per layer/,$p' "$OUT/tiles_$1_$3_$DIRECTION.txt"
}
for run in ${PROBES:-resnet50:conv1:bf16 resnet50:conv1:fp16 alexnet:conv1:fp16 vgg16:conv3_64_224:fp16}; do
  IFS=: read -r suite layer dtype <<< "$run"
  probe "$suite" "$layer" "$dtype" "${PROBE_LIMIT:-100}"
done
for tiles in ${NCU_TILES:-}; do
  name=$(echo "$tiles" | tr '/' '_')
  timeout 60 ncu --target-processes all -k regex:brgemm -s 2 -c 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section Occupancy --section LaunchStats \
    python3 benchmarks/probes/one_tile_run.py resnet50 conv1 "$DIRECTION" bf16 "$tiles" \
    > "$OUT/ncu_${DIRECTION}_$name.txt" 2>&1
  echo "== ncu $tiles: exit $?, $(( $(date +%s) - start )) s"
done
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-100}" python3 -m pytest -q -n 8 -p no:cacheprovider \
  tests/test_conv_gpu.py::test_few_channel_every_tile > "$OUT/tests.log" 2>&1
echo "== tests: exit $?, $(( $(date +%s) - start )) s"
grep -E "passed|failed|^FAILED|Error" "$OUT/tests.log" | tail -8 | cut -c1-300
for run in ${BENCH:-}; do
  IFS=: read -r suite dtype direction <<< "$run"
  timeout "${BENCH_LIMIT:-150}" python3 -m rtdnn.cli bench --suite "$suite" --dtype "$dtype" \
    --direction "$direction" --out "$OUT" > "$OUT/bench_${suite}_${dtype}_$direction.log" 2>&1
  echo "== bench $run: exit $?, $(( $(date +%s) - start )) s"
  grep -i "geomean" "$OUT/bench_${suite}_${dtype}_$direction.log" | tail -3
done
rm -f "$OUT"/*.md  # the JSON holds the same rows (at most 8 files come back)
