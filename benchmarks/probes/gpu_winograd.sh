#!/usr/bin/env bash
# One GPU call for WINOGRAD_NONFUSED in strict float32: its GPU tests, then the 3x3 stride-1
# layers of the resnet50 and vgg16 suites beside cuDNN (winograd_probe.py stages; first tile
# candidates, RTDNN_AUTOTUNE=0; IMPLICIT_GEMM timed on resnet50 only). Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=src RTDNN_AUTOTUNE=0
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline -1
RTDNN_GPU_TESTS=1 timeout "${TESTS_LIMIT:-150}" python3 -m pytest -q -n 8 -p no:cacheprovider \
  tests/test_conv_winograd_gpu.py > "$OUT/tests.txt" 2>&1
echo "== tests: exit $?"; grep -E "passed|failed" "$OUT/tests.txt" | tail -3
timeout "${RESNET_LIMIT:-200}" python3 benchmarks/probes/winograd_probe.py stages:resnet50 \
  > "$OUT/stages_resnet50.md" 2>&1
echo "== resnet50: exit $?"; grep "^|" "$OUT/stages_resnet50.md" | cut -d'|' -f2-9
IG=0 timeout "${VGG_LIMIT:-220}" python3 benchmarks/probes/winograd_probe.py stages:vgg16 \
  > "$OUT/stages_vgg16.md" 2>&1
echo "== vgg16: exit $?"; grep "^|" "$OUT/stages_vgg16.md" | cut -d'|' -f2-9
