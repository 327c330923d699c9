"""Split-K's second-launch finish compiled for the GPU: IMPLICIT_GEMM_SPLIT_K's weight gradient
of a 3x3 layer that splits 16 ways or more (so its partials are summed by
brgemm.split_finish_kernel), in bfloat16, float16 and TF32, against the float64 reference, and
the same bits as the finish in the GEMM's own launch. Run with RTDNN_GPU_TESTS=1 on a machine
with a CUDA GPU."""

import pytest
import torch
from conftest import gpu_only

from rtdnn import reference as R
from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.kernels.launch import BrgemmLaunch
from rtdnn.ops.conv import _problem_for_selection

pytestmark = gpu_only()

CASES = {
    "bf16": (torch.bfloat16, None, 1e-2),
    "fp16": (torch.float16, None, 2e-3),
    "tf32": (torch.float32, "tf32", 2e-3),
}


@pytest.mark.parametrize("case", CASES)
def test_weight_gradient_finished_apart(case, monkeypatch):
    dtype, math_mode, tol = CASES[case]
    algo = ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]
    cl = torch.channels_last
    x = torch.randn(32, 64, 28, 28, device="cuda").to(dtype).to(memory_format=cl)
    w = torch.randn(64, 64, 3, 3, device="cuda").to(dtype).to(memory_format=cl)
    conv = dict(stride=1, padding=1, dilation=1, groups=1, mode="cross_correlation")
    p, _ = _problem_for_selection("backward_filter", x, w, math=math_mode, **conv)
    assert algo.splits(p) >= BrgemmLaunch.FINISH_APART_FROM
    dy = torch.randn(32, 64, 28, 28, device="cuda").to(dtype).to(memory_format=cl)
    workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
    results = []
    for finish_apart_from in (BrgemmLaunch.FINISH_APART_FROM, 10**9):
        monkeypatch.setattr(BrgemmLaunch, "FINISH_APART_FROM", finish_apart_from)
        for tiles in algo.tile_candidates(p)[:2]:
            dw = torch.full_like(w, float("nan"))
            algo.prepare(p, tiles)(ConvTensors(x, dw, dy, None), workspace, 1.0, 0.0)
            results.append(dw)
    ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), padding=1)
    for dw in results:
        assert R.rel_error(dw, ref.cpu()) < tol
    half = len(results) // 2
    for apart, together in zip(results[:half], results[half:], strict=True):
        assert torch.equal(apart, together)
