#!/usr/bin/env bash
# One GPU run of torch.compile on converted models: compile_model.py for each "mode:model:kinds"
# word in RUNS, each under a limit of LIMIT seconds; a run still going at LIMIT - 20 s has its
# Python stacks dumped by py-spy (from .whl/, if carried) before it is stopped. Results under $OUT.
# Tiles are tuned at first use unless RTDNN_AUTOTUNE=0 (what `rtdnn bench --model` rows use): on a
# machine that has compiled nothing, tuning a training step's tiles takes minutes.
set -u
export OUT=${OUT:-gpu-results} PYTHONUNBUFFERED=1 PYTHONPATH=src
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
start=$(date +%s)
for run in ${RUNS:-default:resnet50:inference,training}; do
  IFS=: read -r mode model kinds <<< "$run"
  log="$OUT/compile_${mode}_${model}.txt"
  (cd benchmarks/probes && PYTHONPATH=../../src python3 compile_model.py "$mode" "$model" \
    "$kinds") > "$log" 2>&1 &
  pid=$!
  limit=${LIMIT:-240}
  for ((t = 0; t < limit - 20; t += 5)); do
    kill -0 "$pid" 2> /dev/null || break
    sleep 5
  done
  if kill -0 "$pid" 2> /dev/null; then
    [ -x /tmp/site/bin/py-spy ] && /tmp/site/bin/py-spy dump --pid "$pid" > "$OUT/spy_${mode}_${model}.txt" 2>&1
    kill "$pid"
    echo "== $run: stopped at the limit"
  fi
  wait "$pid"
  echo "== $run: exit $?, $(( $(date +%s) - start )) s"
  grep -v Warning "$log" | grep -B2 -A30 "img/s\|Error\|history" | tail -60 | cut -c1-300
done
