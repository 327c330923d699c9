#!/usr/bin/env bash
# The weight-gradient probe on Hopper (conv_hopper_filter_probe.py): error against float64
# and times beside cuDNN and rtdnn's shipped backward-filter on ResNet-50's and VGG-16's 3x3
# layers. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
timeout "${LIMIT:-400}" python3 benchmarks/probes/conv_hopper_filter_probe.py "$OUT" 2>&1 \
  | grep -v Warning | tail -20
