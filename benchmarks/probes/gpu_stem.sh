#!/usr/bin/env bash
# One GPU run for the forward of few-channel (RGB stem) layers: every IMPLICIT_GEMM forward
# tile, the filter-row tiles among them, beside cuDNN (conv_tiles_probe.py), then ncu on one
# tile of each kind on ResNet-50's stem, then the GPU tests of those tiles. Results under $OUT.
set -u
export OUT=${OUT:-gpu-results} PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
start=$(date +%s)
probe() {  # suite layer dtype limit
  timeout "$4" python3 benchmarks/probes/conv_tiles_probe.py "$1" "$2" forward "$3" \
    > "$OUT/tiles_$1_$3.txt" 2>&1
  echo "== $1 $2 $3: exit $?, $(( $(date +%s) - start )) s"
  sed -n '/best per layer/,$p' "$OUT/tiles_$1_$3.txt"
}
probe resnet50 conv1 bf16 "${R_LIMIT:-130}"
probe resnet50 conv1 fp16 "${R_LIMIT:-100}"
probe alexnet conv1 fp16 70
probe vgg16 conv3_64_224 fp16 70
for tiles in ${NCU_TILES:-128x64x64/w4s4 128x64x32/w4s4/rows}; do
  name=$(echo "$tiles" | tr '/' '_')
  timeout 60 ncu --target-processes all -k regex:brgemm -s 2 -c 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section Occupancy --section LaunchStats \
    python3 benchmarks/probes/one_tile_run.py resnet50 conv1 forward bf16 "$tiles" \
    > "$OUT/ncu_$name.txt" 2>&1
  echo "== ncu $tiles: exit $?, $(( $(date +%s) - start )) s"
done
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-100}" python3 -m pytest -q -n 8 -p no:cacheprovider \
  tests/test_conv_gpu.py::test_few_channel_forward_every_tile \
  "tests/test_conv_direct_gpu.py::test_every_tile_candidate[shape10-backward_filter]" \
  "tests/test_conv_direct_gpu.py::test_every_tile_candidate[shape11-forward]" \
  "tests/test_conv_direct_gpu.py::test_every_tile_candidate[shape11-backward_data]" \
  "tests/test_conv_direct_gpu.py::test_every_tile_candidate[shape11-backward_filter]" \
  > "$OUT/tests.log" 2>&1
echo "== tests: exit $?, $(( $(date +%s) - start )) s"
grep -E "passed|failed|^FAILED|Error" "$OUT/tests.log" | tail -8 | cut -c1-300
