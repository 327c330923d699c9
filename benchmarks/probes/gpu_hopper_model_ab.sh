#!/usr/bin/env bash
# ResNet-50 as a whole model with and without the Hopper convolution (RTDNN_HOPPER_CONV=0),
# in one call: does its per-call host work (building TMA descriptors) show in the eager step?
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
for h in 1 0; do
  RTDNN_HOPPER_CONV=$h timeout "${MODEL_LIMIT:-130}" python3 -m rtdnn.cli bench --model resnet50 \
    --out "$OUT/model_h$h" > "$OUT/model_h$h.txt" 2>&1
  echo "== resnet50 model hopper=$h: exit $?"
  grep -E "^\| (inference|training)|wall time|all kernels" "$OUT/model_h$h.txt"
done
