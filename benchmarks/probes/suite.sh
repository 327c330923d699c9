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
