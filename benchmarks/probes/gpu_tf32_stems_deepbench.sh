#!/usr/bin/env bash
# Every tile of the implicit GEMMs on the RGB stems' TF32 weight gradients (ResNet-50's 7x7,
# VGG-16's 3x3: which tile should come first untuned), then deepbench_train forward and
# backward-data in bf16 beside cuDNN, RTDNN_AUTOTUNE=0. Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
. benchmarks/probes/suite.sh
for layer in "resnet50 conv1" "vgg16 conv3_64_224"; do
  set -- $layer
  timeout 150 python3 benchmarks/probes/layer_algos.py "$1" "$2:backward_filter" --dtype tf32 \
    --algos IMPLICIT_GEMM_SPLIT_K,IMPLICIT_GEMM --all-tiles > "$OUT/stem_tiles_$1_tf32.txt" 2>&1
  echo "== $1 $2: exit $?"; grep -E "best|cuDNN [0-9]" "$OUT/stem_tiles_$1_tf32.txt"
done
suite deepbench_train forward bf16 150
suite deepbench_train backward_data bf16 150
