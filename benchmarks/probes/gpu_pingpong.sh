#!/usr/bin/env bash
# Ping-pong tiles of the Hopper forward/backward-data kernel (branch pingpong): the kernel's
# 16-bit GPU tests (every tile of every shape, ping-pong included), then every Hopper tile
# candidate one by one on ResNet-50's 3x3 layers (hopper_layer_tiles.py, bf16, beside the
# untuned call and cuDNN). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 RTDNN_AUTOTUNE=0 RTDNN_TUNING_DB=$OUT/tuning.sqlite PYTHONPATH=$PWD/src
. benchmarks/probes/suite.sh
gpu_tests pingpong "${TEST_LIMIT:-200}" "test_hopper_kernel and (bf16 or fp16)"
timeout "${PROBE_LIMIT:-80}" python3 benchmarks/probes/hopper_layer_tiles.py resnet50 forward bf16 \
  l1.0.conv2 l2.x.conv2 l3.x.conv2 l4.x.conv2 l3.0.conv2 > "$OUT/tiles_forward.txt" 2>&1
echo "== forward: exit $?"; cat "$OUT/tiles_forward.txt"
timeout "${PROBE_LIMIT:-80}" python3 benchmarks/probes/hopper_layer_tiles.py resnet50 backward_data \
  bf16 l1.0.conv2 l2.0.conv2 l3.0.conv2 l4.0.conv2 l3.x.conv2 > "$OUT/tiles_backward_data.txt" 2>&1
echo "== backward_data: exit $?"; cat "$OUT/tiles_backward_data.txt"
