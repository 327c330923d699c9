#!/usr/bin/env bash
# The warp-specialized Hopper convolution (kernels/conv_hopper.py): its GPU tests, then the
# resnet50 and vgg16 suites in forward and backward-data (bf16, RTDNN_AUTOTUNE=0, the shipped
# table), each with the kernel (default) and without it (RTDNN_HOPPER_CONV=0), beside cuDNN,
# in one call. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
nvidia-smi --query-gpu=name --format=csv,noheader
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-180}" python3 -m pytest -q -n 12 -rf -p no:cacheprovider \
  tests/test_conv_gpu.py -k "hopper or all_directions" > "$OUT/gpu_tests.txt" 2>&1
echo "== gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.txt" | head -30
source "$(dirname "$0")/suite.sh"
for d in ${DIRECTIONS:-forward backward_data}; do
  for s in ${SUITES:-resnet50 vgg16}; do
    for h in 1 0; do
      RTDNN_HOPPER_CONV=$h && export RTDNN_HOPPER_CONV
      suite "$s" "$d" bf16 "${SUITE_LIMIT:-70}" "h$h"
    done
  done
done
