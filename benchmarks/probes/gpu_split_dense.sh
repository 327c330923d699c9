#!/usr/bin/env bash
# Whether splitting pays on ResNet-50's late 3x3 layers in forward and backward-data, whose
# output tiles fill 1.5 waves (l3, 196 tiles) or 0.76 of one (l4, 100 tiles) at batch 64:
# IMPLICIT_GEMM beside IMPLICIT_GEMM_SPLIT_K at forced split counts (layer_algos.py
# --splits, first tiles), bf16, beside cuDNN. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
nvidia-smi --query-gpu=name --format=csv,noheader
cd benchmarks/probes
timeout "${LIMIT:-240}" python3 layer_algos.py resnet50 l3.x.conv2:forward l3.x.conv2:backward_data \
  l4.x.conv2:forward l4.x.conv2:backward_data --dtype bf16 \
  --algos IMPLICIT_GEMM,IMPLICIT_GEMM_SPLIT_K --splits "${SPLITS:-2,3,4,5}" \
  2>&1 | grep -v Warning | tee "$OUT/split_dense.txt"
