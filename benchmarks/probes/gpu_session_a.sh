#!/usr/bin/env bash
# One device call, four parts, each under its own limit; results under $OUT.
# 1. split-K on ResNet-50's late 3x3 layers in forward and backward-data (gpu_split_dense.sh);
# 2. the GPU tests of split-K backward-data not yet run (TF32 cases, a whole-wave shape);
# 3. ncu of the Gluon TMA-per-tap convolution on VGG's 256-channel 56x56 layer: is L2 the limit?
# 4. fused WINOGRAD against WINOGRAD_NONFUSED on VGG-16's RGB stem, strict float32.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
LIMIT=${SPLIT_LIMIT:-200} bash benchmarks/probes/gpu_split_dense.sh
echo "== split dense: exit $?"
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-150}" python3 -m pytest -q -n 12 -rf -p no:cacheprovider \
  tests/test_conv_gpu.py -k split_k_backward_data > "$OUT/gpu_tests.txt" 2>&1
echo "== gpu tests: exit $?"; tail -5 "$OUT/gpu_tests.txt"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section LaunchStats"
timeout "${NCU_LIMIT:-100}" ncu --kernel-name regex:conv_forward_tma --launch-count 1 $SECTIONS \
  python3 benchmarks/probes/conv_gluon_probe.py profile-tma 4 0 > "$OUT/ncu_tma_vgg256.txt" 2>&1
echo "== ncu: exit $?"
grep -E "Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|L2 Cache Throughput|Compute \(SM\)|Issued Warp|No Eligible|Warp Cycles Per Issued|Mem Busy|Max Bandwidth|Stall" "$OUT/ncu_tma_vgg256.txt" | head -40
cd benchmarks/probes
timeout "${WINO_LIMIT:-110}" python3 layer_algos.py vgg16 conv3_64_224:forward \
  conv3_64_224:backward_data --dtype fp32 --algos WINOGRAD,WINOGRAD_NONFUSED \
  2>&1 | grep -v Warning > "$OUT/vgg_stem_winograd.txt"
echo "== winograd stem: exit $?"; tail -30 "$OUT/vgg_stem_winograd.txt"
