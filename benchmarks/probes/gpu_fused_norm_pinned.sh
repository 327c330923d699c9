#!/usr/bin/env bash
# Batch norm's fused passes, the host-time A/B on one core: a ResNet-50 training step's host
# time (host_layers.py) with main's sources (MAIN_SRC: `git archive main src -o main_src.tar`
# in the working tree, deleted after) and the branch's, the process on one core (taskset, as
# in gpu_models_pinned.sh: the host's threads otherwise move between the guest's cores and
# the rows drift more than the change), then the branch's model bench on that core. Main's
# kernels are compiled first, unpinned and untimed. Results packed into $OUT/results.tgz
# after each step.
set -u
. benchmarks/probes/suite.sh
packed_results
main=$(main_tree)
mkdir -p $RES/warm
HOST_LIMIT=240 host_step "$main" $RES/warm
taskset -pc "${CORE:-3}" $$ > /dev/null
for round in ${ROUNDS:-1 2}; do
  for tree in "$main" "$PWD"; do
    mkdir -p "$RES/round$round"
    HOST_LIMIT=${HOST_LIMIT:-100} host_step "$tree" "$RES/round$round"
    pack
  done
done
timeout "${MODEL_LIMIT:-150}" env PYTHONPATH=$PWD/src python3 -m rtdnn.cli bench \
  --model resnet50 --out "$RES/model" > "$RES/model.txt" 2>&1
echo "== resnet50 model, one core: exit $?"
grep -E "^\| (inference|training)|wall time|all kernels" "$RES/model.txt"
pack
