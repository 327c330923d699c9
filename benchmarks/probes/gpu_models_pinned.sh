#!/usr/bin/env bash
# `rtdnn bench --model` for each model in MODELS with the process on one core (taskset) and
# not, alternating, RTDNN_AUTOTUNE=0 with the shipped table: how much of the eager rows is
# the host's threads moving between cores. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 RTDNN_AUTOTUNE=0 RTDNN_TUNING_DB=$OUT/tuning.sqlite
CORE=${CORE:-3}
for m in ${MODELS:-efficientnet_b0 mobilenet_v3_large}; do
  for variant in pinned free; do
    prefix=(); [ "$variant" = pinned ] && prefix=(taskset -c "$CORE")
    timeout "${MODEL_LIMIT:-130}" ${prefix[@]+"${prefix[@]}"} env PYTHONPATH=src python3 -m \
      rtdnn.cli bench --model "$m" --out "$OUT/${m}_$variant" > "$OUT/${m}_$variant.txt" 2>&1
    echo "== $m $variant: exit $?"
    grep -E "^\| (inference|training)|wall time|all kernels" "$OUT/${m}_$variant.txt"
  done
done
