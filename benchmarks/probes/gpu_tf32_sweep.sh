#!/usr/bin/env bash
# A TF32 tile sweep for the shipped tables: the resnet50 and vgg16 suites' weight gradients
# and resnet50's forward and backward-data in float32 (TF32), tuning on, into a tuning
# database of its own ($OUT/tf32_sweep.sqlite3, for tools/ship_tiles.py). Each suite's
# tables are the tuned times beside cuDNN.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=1 RTDNN_TUNING_DB=$OUT/tf32_sweep.sqlite3
. benchmarks/probes/suite.sh
suite resnet50 backward_filter float32 120 tuned
suite vgg16 backward_filter float32 100 tuned
suite resnet50 forward float32 90 tuned
suite resnet50 backward_data float32 90 tuned
