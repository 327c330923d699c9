#!/usr/bin/env bash
# The split count before and after whole waves (split_ab.py), resnet50 and vgg16
# backward-filter in bf16 (RTDNN_AUTOTUNE=0, the shipped table), each in its own process.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
for suite in ${SUITES:-resnet50 vgg16}; do
  for which in old new; do
    timeout "${LIMIT:-80}" python3 benchmarks/probes/split_ab.py $which bench --suite $suite \
      --direction backward_filter --dtype bf16 > "$OUT/${suite}_$which.txt" 2>&1
    echo "== $suite $which: exit $?"; grep geomean "$OUT/${suite}_$which.txt"
  done
done
