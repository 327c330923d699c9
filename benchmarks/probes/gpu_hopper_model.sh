#!/usr/bin/env bash
# After the Hopper convolution: ResNet-50 as a whole model (`rtdnn bench --model`), then
# deepbench_train backward-data in bf16 and resnet50 backward-data in float16
# (RTDNN_AUTOTUNE=0, shipped table), beside cuDNN/PyTorch. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
nvidia-smi --query-gpu=name --format=csv,noheader
timeout "${MODEL_LIMIT:-230}" python3 -m rtdnn.cli bench --model resnet50 \
  --out "$OUT/model_resnet50" > "$OUT/model_resnet50.txt" 2>&1
echo "== resnet50 model: exit $?"
grep -E "^\| (inference|training)|wall time|all kernels" "$OUT/model_resnet50.txt"
source "$(dirname "$0")/suite.sh"
suite resnet50 backward_data fp16 60
suite deepbench_train backward_data bf16 140
