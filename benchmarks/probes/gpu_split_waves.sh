#!/usr/bin/env bash
# Split counts of backward-filter's split-K as whole waves: filter_split_probe.py at the old
# count (cdiv(2 x multiprocessors, tiles)) and at the count that fills whole waves of one
# program per multiprocessor, on layers where they differ. Results under $OUT.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # suite layer old new
  timeout "${LIMIT:-75}" python3 benchmarks/probes/filter_split_probe.py "$1" "$2" "$3,$4" \
    2>&1 | grep -v Warning | tee -a "$OUT/split_waves.txt"
}
run deepbench_train db24 30 14
run resnet50 l3.x.conv2 8 7
run vgg16 conv512_512_14 2 7
run deepbench_train db56 11 5
RTDNN_GPU_TESTS=1 timeout 150 python3 -m pytest -q -rf -n 12 -p no:cacheprovider \
  tests/test_conv_gpu.py -k "(few_channel and tf32) or split_k_backward_data" > "$OUT/tests.txt" 2>&1
echo "== tests: exit $?"; grep -E "passed|failed|FAILED" "$OUT/tests.txt" | tail -8
