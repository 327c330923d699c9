#!/usr/bin/env bash
# Whether autograd's backward thread runs rtdnn's Python slower because it runs on another
# core than the thread that issued the forward (caches that the forward warmed are elsewhere):
# a ResNet-50 step's host time (host_layers.py) as the process runs, then with the whole
# process on one core (taskset), then what the step launches (host_launch_counts.py), then
# `rtdnn bench --model resnet50` pinned and not. RTDNN_AUTOTUNE=0. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 RTDNN_AUTOTUNE=0 RTDNN_TUNING_DB=$OUT/tuning.sqlite
nproc; grep -m1 "model name" /proc/cpuinfo; git log --oneline -1
CORE=${CORE:-3}
host() {  # host NAME [taskset prefix...]
  local name=$1; shift
  (cd benchmarks/probes && timeout "${HOST_LIMIT:-110}" "$@" env PYTHONPATH=../../src python3 \
    host_layers.py "$OUT/host_$name" > "$OUT/host_layers_$name.txt" 2>&1)
  echo "== host_layers $name: exit $?"
  python3 -c "import json; d = json.load(open('$OUT/host_$name/host_layers.json')); \
print({k: v['min_ms'] for k, v in d.items()})"
}
host free
host pinned taskset -c "$CORE"
(cd benchmarks/probes && timeout 60 env PYTHONPATH=../../src python3 host_launch_counts.py \
  "$OUT/launch_counts.json" > "$OUT/launch_counts.txt" 2>&1)
echo "== launch counts: exit $?"; head -12 "$OUT/launch_counts.txt"
for variant in pinned free; do
  prefix=(); [ "$variant" = pinned ] && prefix=(taskset -c "$CORE")
  timeout "${MODEL_LIMIT:-150}" ${prefix[@]+"${prefix[@]}"} env PYTHONPATH=src python3 -m rtdnn.cli bench \
    --model resnet50 --out "$OUT/model_$variant" > "$OUT/model_$variant.txt" 2>&1
  echo "== resnet50 $variant: exit $?"
  grep -E "^\| (inference|training)|wall time|all kernels" "$OUT/model_$variant.txt"
done
