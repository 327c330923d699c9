#!/usr/bin/env bash
# One GPU call for weight gradients after a split-count change: the backward-filter direction
# of deepbench_train, resnet50 and vgg16, then deepbench_train's backward-data, in bf16
# (RTDNN_AUTOTUNE=0, the shipped table), each beside cuDNN. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
nvidia-smi --query-gpu=name --format=csv,noheader
suite() {  # name direction limit
  timeout "$3" python3 -m rtdnn.cli bench --suite "$1" --direction "$2" --dtype bf16 \
    --out "$OUT/$1_$2" > "$OUT/$1_$2.txt" 2>&1
  echo "== $1 $2: exit $?"; grep -E "geomean" "$OUT/$1_$2.txt"
}
suite deepbench_train backward_filter 140
suite resnet50 backward_filter 150
suite vgg16 backward_filter 110
suite deepbench_train backward_data 140
