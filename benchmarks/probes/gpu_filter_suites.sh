#!/usr/bin/env bash
# One GPU call for weight gradients after a split-count change: the backward-filter direction
# of deepbench_train, resnet50 and vgg16, then deepbench_train's backward-data, in bf16
# (RTDNN_AUTOTUNE=0, the shipped table), each beside cuDNN. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
nvidia-smi --query-gpu=name --format=csv,noheader
source "$(dirname "$0")/suite.sh"
suite deepbench_train backward_filter bf16 140
suite resnet50 backward_filter bf16 150
suite vgg16 backward_filter bf16 110
suite deepbench_train backward_data bf16 140
