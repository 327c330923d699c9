# Sourced by the GPU probe scripts: `suite NAME DIRECTION DTYPE LIMIT [TAG]` runs
# `rtdnn bench --suite NAME` in one direction and dtype under a time limit, writes its tables
# to $OUT/NAME_DIRECTION_DTYPE[_TAG](.txt) and prints its exit status and geomean.
suite() {
  local name="$1_$2_$3${5:+_$5}"
  timeout "$4" python3 -m rtdnn.cli bench --suite "$1" --direction "$2" --dtype "$3" \
    --out "$OUT/$name" > "$OUT/$name.txt" 2>&1
  echo "== $name: exit $?"; grep -E "geomean" "$OUT/$name.txt"
}

# `gpu_tests NAME LIMIT EXPR` runs the GPU tests of tests/test_conv_gpu.py that `-k EXPR`
# selects under a time limit, writes their report to $OUT/gpu_tests_NAME.txt and prints its
# exit status and the lines that say what passed and failed.
gpu_tests() {
  RTDNN_GPU_TESTS=1 timeout "$2" python3 -m pytest -q -n 14 -rf -p no:cacheprovider \
    tests/test_conv_gpu.py -k "$3" > "$OUT/gpu_tests_$1.txt" 2>&1
  echo "== $1 gpu tests: exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests_$1.txt" | head -30
}

# Triton's compile cache between device calls (a fresh machine compiles every kernel again:
# a ResNet-50 step's first call took over 90 s, EfficientNet-B0's over 125). `restore_cache`
# unpacks .device-cache/triton_cache.tgz (carried: name .device-cache in the call's carry;
# .git/info/exclude ignores it) into Triton's cache; `save_cache` packs the cache's compiled
# kernels (not their intermediate IR) into $OUT/triton_cache.tgz when under 16 MiB, for the
# next call to carry (copy it from the files that came back into .device-cache/ first).
restore_cache() {
  local cache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
  if [ -f .device-cache/triton_cache.tgz ]; then
    mkdir -p "$cache" && tar -xzf .device-cache/triton_cache.tgz -C "$cache"
    echo "== Triton cache restored: $(find "$cache" -name '*.cubin' | wc -l) kernels"
  fi
}
save_cache() {
  local cache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
  (cd "$cache" && find . -type f ! -name '*.ttir' ! -name '*.ttgir' ! -name '*.llir' \
    ! -name '*.ptx' ! -name '*.source' -print0 | tar -czf "$OUT/triton_cache.tgz" --null -T -)
  local size; size=$(stat -c %s "$OUT/triton_cache.tgz")
  if [ "$size" -gt 16000000 ]; then
    echo "== Triton cache: $size bytes, over what comes back; not kept"; rm "$OUT/triton_cache.tgz"
  else
    echo "== Triton cache saved: $size bytes"
  fi
}

# `host_step TREE DIR` runs host_layers.py (a ResNet-50 training step's host time, with and
# without launches) on the sources under TREE/src, writes its report to DIR/host_NAME (NAME:
# TREE's folder name) and DIR/host_layers_NAME.txt, and prints the minimum of each variant.
# MAIN_SRC=tarball of main's src/ beside the working tree gives an A/B: `main_tree` unpacks it.
host_step() {
  local name; name=$(basename "$1")
  (cd benchmarks/probes && timeout "${HOST_LIMIT:-100}" env PYTHONPATH="$1/src" python3 \
    host_layers.py "$2/host_$name" > "$2/host_layers_$name.txt" 2>&1)
  echo "== host_layers $name: exit $?"
  python3 -c "import json; d = json.load(open('$2/host_$name/host_layers.json')); \
print({k: v['min_ms'] for k, v in d.items()})"
}
main_tree() {
  mkdir -p /tmp/main_tree && tar -xf "$MAIN_SRC" -C /tmp/main_tree && echo /tmp/main_tree
}

# `packed_results` for scripts whose results go to one file, $OUT/results.tgz (a call brings
# back at most 8 files): RES=/tmp/res to write them in, tuning off with a database of its own
# there; `pack` packs RES again, after each step, so that a call cut short keeps what ran.
packed_results() {
  RES=/tmp/res
  mkdir -p "$RES"
  export PYTHONUNBUFFERED=1 RTDNN_AUTOTUNE=0 RTDNN_TUNING_DB=$RES/tuning.sqlite
}
pack() { tar -czf "$OUT/results.tgz" -C "$RES" .; }
