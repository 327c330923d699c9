#!/usr/bin/env bash
# The split count before and after whole waves (split_ab.py), resnet50 and vgg16
# backward-filter in bf16 (RTDNN_AUTOTUNE=0, the shipped table), each in its own process.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=0
for suite in ${SUITES:-resnet50 vgg16}; do
  for which in ${WHICH:-old new}; do
    timeout "${LIMIT:-80}" python3 benchmarks/probes/split_ab.py $which bench --suite $suite \
      --direction backward_filter --dtype bf16 > "$OUT/${suite}_$which.txt" 2>&1
    echo "== $suite $which: exit $?"; grep geomean "$OUT/${suite}_$which.txt"
  done
done
if [ -n "${DEEPBENCH:-}" ]; then  # the current count on deepbench_train too
  timeout 100 python3 -m rtdnn.cli bench --suite deepbench_train --direction backward_filter \
    --dtype bf16 --out "$OUT/deepbench" > "$OUT/deepbench_new.txt" 2>&1
  echo "== deepbench_train new: exit $?"; grep geomean "$OUT/deepbench_new.txt"
fi
