#!/usr/bin/env bash
# One GPU run for DIRECT: its GPU tests (TEST_FILES to run others), then `rtdnn bench
# --suite depthwise` and `--suite grouped` in bf16 beside cuDNN (tiles tuned on first use;
# SUITES to run fewer, DIRECTION to run one direction), then, with BREAKDOWN=1, each grouped
# layer's kernels one by one (benchmarks/probes/kernel_breakdown.py).
# Everything lands under $OUT (default gpu-results) as it finishes; a short summary is printed
# last. The tests run with pytest-xdist (-n 14). Every candidate's time per problem:
# benchmarks/probes/tiles_log.py $OUT/tiles.log.
set -u
export OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=src
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
start=$(date +%s)
if [ "${TESTS:-1}" = 1 ]; then
  RTDNN_GPU_TESTS=1 RTDNN_AUTOTUNE=0 timeout "${TEST_LIMIT:-150}" python3 -m pytest -v -rf \
    -n 14 -p no:cacheprovider ${TEST_FILES:-tests/test_conv_direct_gpu.py} > "$OUT/tests.log" 2>&1
  echo "PASSED $(grep -c PASSED "$OUT/tests.log"), FAILED $(grep -c FAILED "$OUT/tests.log")"
  grep -E " passed| failed|^FAILED|Error" "$OUT/tests.log" | tail -8 | cut -c1-300
  echo "== tests: $(( $(date +%s) - start )) s"
fi
# Compile the suites' DIRECT kernels in parallel first (Triton's disk cache keeps them).
SUITES=${SUITES:-depthwise grouped}
timeout "${PRE_LIMIT:-100}" python3 benchmarks/probes/precompile_direct.py $SUITES 2>&1 \
  | tail -3 | cut -c1-300
echo "== precompile: $(( $(date +%s) - start )) s"
bench() {  # suite, time limit
  timeout "$2" python3 -c "
import logging, sys
logging.getLogger('rtdnn.tiles').setLevel(logging.DEBUG)
logging.basicConfig(filename='$OUT/tiles.log', level=logging.DEBUG)
from rtdnn.cli import main
sys.exit(main(['bench', '--suite', '$1', '--dtype', 'bf16', '--out', '$OUT'] + sys.argv[1:]))
" ${DIRECTION:+--direction $DIRECTION} > "$OUT/bench_$1.log" 2>&1
  rc=$?
  echo "== $1: $(( $(date +%s) - start )) s, exit $rc"
}
case " $SUITES " in *" depthwise "*) bench depthwise "${DW_LIMIT:-150}" ;; esac
case " $SUITES " in *" grouped "*) bench grouped "${GR_LIMIT:-70}" ;; esac
if [ "${BREAKDOWN:-0}" = 1 ]; then
  timeout "${BD_LIMIT:-90}" python3 benchmarks/probes/kernel_breakdown.py grouped \
    > "$OUT/breakdown_grouped.txt" 2>&1
  echo "== breakdown: $(( $(date +%s) - start )) s, exit $?"
fi
rm -f "$OUT"/*.md  # the JSON holds the same rows (at most 8 files come back)
# Per tuned problem: the best tensor-core tile and the best FMA tile (from the tuner's log).
python3 - <<'PY'
import os, re
best = {}
for line in open(os.environ["OUT"] + "/tiles.log"):
    m = re.search(r"\('DIRECT', (.*)\): DirectTiles\((.*)\) ([0-9.]+) ms", line)
    if m:
        kind = re.search(r"kernel='(\w+)'", m.group(2)).group(1)
        slot = best.setdefault(m.group(1), {})
        slot[kind] = min(slot.get(kind, 1e9), float(m.group(3)))
wins = [v["fma"] / v["dot"] for v in best.values() if "dot" in v and "fma" in v]
print(f"DIRECT tiles: {len(best)} problems; fma/dot time ratio per problem:",
      " ".join(f"{w:.2f}" for w in wins))
PY
python3 - <<'PY'
import json, math, os
out = os.environ["OUT"]
for suite in ("depthwise", "grouped"):
    path = f"{out}/conv_{suite}_bf16.json"
    if not os.path.exists(path):
        print(suite, "no results"); continue
    data = json.load(open(path))
    print(data["title"])
    for d in ("forward", "backward_data", "backward_filter"):
        rows = [r for r in data["rows"] if r["direction"] == d]
        if not rows:
            continue
        g = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
        pct = [r["copy_pct"] for r in rows]
        bad = [r["layer"] for r in rows if not r["ok"]]
        print(f"{suite:9s} {d:15s} n={len(rows):2d} geomean {g:.2f}x  % copy min {min(pct):.0f} "
              f"max {max(pct):.0f}  algos {sorted({r['algo'] for r in rows})} wrong {bad}")
    for r in data["rows"]:
        print(f"  {r['layer']:24s} {r['direction'][:10]:10s} {r['algo'][:8]:8s} "
              f"{r['rtdnn_ms']:.3f} {r['cudnn_ms']:.3f} {r['ratio']:.2f}x {r['gbps']:.0f} GB/s "
              f"{r['copy_pct']:.0f}%")
PY
