"""`rtdnn bench --algo all` on the GPU, on two small layers (a 3x3 stride-1 layer every 2-D
algorithm takes, a long 1-D filter): every supported algorithm runs forced, agrees with cuDNN,
is timed through a CUDA graph (no capture falls back), and each (layer, direction) has one
fastest. Run with RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU."""

import math
import warnings

import pytest
from conftest import gpu_only

from rtdnn.bench.conv import DIRECTIONS
from rtdnn.bench.conv_algos import run_algo_suite

pytestmark = gpu_only()

LAYERS = [
    {"name": "r3x3", "n": 8, "c": 64, "k": 64, "spatial": [28, 28], "kernel": [3, 3],
     "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1},
    {"name": "k31", "n": 8, "c": 32, "k": 32, "spatial": [1024], "kernel": [31],
     "stride": [1], "padding": [15], "dilation": [1], "groups": 1},
]  # fmt: skip


@pytest.mark.parametrize("dtype, math_mode", [("bf16", "tf32"), ("float32", "fp32")])
def test_every_algorithm_on_the_gpu(dtype, math_mode, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = run_algo_suite(
            "gpu_test", dtype, list(DIRECTIONS), "all", out_dir=str(tmp_path), layers=LAYERS,
            math_mode=math_mode,
        )  # fmt: skip
    assert not [w for w in caught if "capture failed" in str(w.message)], caught
    for layer in LAYERS:
        for d in DIRECTIONS:
            here = [r for r in rows if (r.layer, r.direction) == (layer["name"], d)]
            assert len(here) >= 3, (layer["name"], d, here)
            for r in here:
                assert r.ok, r
                assert math.isfinite(r.ms) and r.ms > 0 and r.cudnn_ms > 0, r
            assert sum(r.fastest for r in here) == 1
            assert sum(r.auto for r in here) == 1
    winograd = {r.algo for r in rows if r.layer == "r3x3" and r.direction == "forward"}
    assert {"WINOGRAD", "WINOGRAD_NONFUSED", "FFT", "FFT_TILING"} <= winograd
    assert (
        tmp_path / f"conv_algos_gpu_test_{dtype}{'_strict' * (math_mode == 'fp32')}.md"
    ).exists()
