#!/usr/bin/env bash
# The Winograd FMA products on few reduced channels (branch winograd-fma: WINOGRAD (fused)
# forward and backward-data, WINOGRAD_NONFUSED's weight gradient): their GPU tests, then
# every algorithm on VGG-16's RGB stem (`rtdnn bench --algo all`, the suite's first layer)
# in strict float32 forward and backward-filter beside cuDNN, tiles tuned
# (RTDNN_AUTOTUNE=1 into a fresh database, so each FMA tile shape is timed). Under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src RTDNN_AUTOTUNE=1
export RTDNN_TUNING_DB=$OUT/tuning.sqlite
RTDNN_GPU_TESTS=1 timeout "${TEST_LIMIT:-200}" python3 -m pytest -q -n 8 -p no:cacheprovider \
  tests/test_conv_winograd_gpu.py -k "fma or every_direction" > "$OUT/tests.txt" 2>&1
echo "== tests: exit $?"; grep -E "passed|failed|FAILED" "$OUT/tests.txt" | tail -5
for d in forward backward_filter; do
  timeout "${ALGO_LIMIT:-150}" python3 -m rtdnn.cli bench --algo all --suite vgg16 \
    --dtype float32 --math fp32 --limit 1 --direction "$d" > "$OUT/stem_$d.txt" 2>&1
  echo "== stem $d: exit $?"; grep -E "^\| conv3" "$OUT/stem_$d.txt"
done
