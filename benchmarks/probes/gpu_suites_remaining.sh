#!/usr/bin/env bash
# The suites and dtypes the Hopper kernels have not been measured on yet, beside cuDNN,
# RTDNN_AUTOTUNE=0 (the shipped tiles): alexnet in bf16, float16 and TF32, vgg16 in float16,
# resnet50's float16 weight gradients (64-wide units) and vgg16's TF32 forward and
# backward-data with the shipped tiles. SUITES="name:direction:dtype ..." runs a subset.
# Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
default="alexnet:all:bf16 alexnet:all:fp16 alexnet:all:float32 vgg16:all:fp16
  resnet50:backward_filter:fp16"
for entry in ${SUITES:-$default}; do
  IFS=: read -r name direction dtype <<< "$entry"
  if [ "$direction" = all ]; then
    for d in forward backward_data backward_filter; do suite "$name" "$d" "$dtype" 120; done
  else
    suite "$name" "$direction" "$dtype" 120
  fi
done
