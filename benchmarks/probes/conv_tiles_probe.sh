#!/usr/bin/env bash
# One device call comparing two versions of the implicit GEMM on one GPU: the working tree's
# src/ and a baseline copy of src/ placed, untracked, in base_tree/src (for example
# `mkdir base_tree && git archive REV src | tar -x -C base_tree`), each through
# conv_tiles_probe.py on the same layers; the convolution GPU tests first. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
echo "== tests"
PYTHONPATH=src RTDNN_GPU_TESTS=1 timeout 170 python -m pytest -q -x tests/test_conv_gpu.py tests/test_conv_precomp_gpu.py 2>&1 | tail -6
echo "== new"
PYTHONPATH=src timeout 200 python benchmarks/probes/conv_tiles_probe.py > $OUT/new.txt 2>&1; echo "exit $?"
echo "== base"
PYTHONPATH=base_tree/src timeout 200 python benchmarks/probes/conv_tiles_probe.py > $OUT/base.txt 2>&1; echo "exit $?"
for f in new base; do echo "-- $f"; sed -n '/best per layer/,$p' $OUT/$f.txt; done
