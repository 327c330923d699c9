# Sourced by the GPU probe scripts: `suite NAME DIRECTION DTYPE LIMIT [TAG]` runs
# `rtdnn bench --suite NAME` in one direction and dtype under a time limit, writes its tables
# to $OUT/NAME_DIRECTION_DTYPE[_TAG](.txt) and prints its exit status and geomean.
suite() {
  local name="$1_$2_$3${5:+_$5}"
  timeout "$4" python3 -m rtdnn.cli bench --suite "$1" --direction "$2" --dtype "$3" \
    --out "$OUT/$name" > "$OUT/$name.txt" 2>&1
  echo "== $name: exit $?"; grep -E "geomean" "$OUT/$name.txt"
}
