#!/usr/bin/env bash
# One GPU call of sweeps for the shipped tile table, into $OUT/tuning.sqlite3 (bring it back,
# then tools/ship_tiles.py). RUNS: words "model:NAME:BATCH[,BATCH]" (tile_sweep.py) or
# "suite:NAME" (`rtdnn bench --suite NAME`, every direction), each under LIMIT seconds; what a
# run tuned before its limit stays in the database. MISSING=1: tune only what the shipped
# table lacks (tuning's default road), so that a sweep cut by its limit can be continued.
set -u
export OUT=${OUT:-gpu-results} PYTHONUNBUFFERED=1 PYTHONPATH=src RTDNN_AUTOTUNE=1
if [ "${MISSING:-0}" = 1 ]; then unset RTDNN_AUTOTUNE; fi
export RTDNN_TUNING_DB=$OUT/tuning.sqlite3
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
for run in ${RUNS:-model:resnet50:128 suite:resnet50}; do
  IFS=: read -r kind name batches <<< "$run"
  start=$(date +%s)
  if [ "$kind" = model ]; then
    timeout "${LIMIT:-240}" python3 benchmarks/probes/tile_sweep.py "$name" ${batches//,/ } \
      > "$OUT/sweep_${kind}_${name}.txt" 2>&1
  else
    timeout "${LIMIT:-240}" python3 -c "from rtdnn.cli import main; main(['bench', '--suite', \
'$name', '--out', '$OUT/suite_$name'])" > "$OUT/sweep_${kind}_${name}.txt" 2>&1
  fi
  echo "== $run: exit $?, $(( $(date +%s) - start )) s"
  grep -v Warn "$OUT/sweep_${kind}_${name}.txt" | grep "tuned in\|Error" | tail -5
done
python3 -c "import sqlite3; c = sqlite3.connect('$RTDNN_TUNING_DB'); \
print('tile choices stored:', c.execute('select count(*) from tile_choices').fetchone()[0])"
