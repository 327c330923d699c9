"""IMPLICIT_GEMM's TMA kernels compiled for the GPU (Hopper or later), every direction
(backward-filter also split, as IMPLICIT_GEMM_SPLIT_K): every TMA tile candidate against the
float64 reference on ResNet-style and odd shapes in bfloat16, float16 and TF32, with bias
(forward), alpha and beta, and the pointer path taking over for a misaligned view. Run with
RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU of compute capability 9 or more."""

import pytest
import torch
from conftest import NEEDS_TMA, gpu_only

from rtdnn import reference as R
from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.algos import implicit_gemm as ig
from rtdnn.ops.conv import _problem_for_selection

pytestmark = gpu_only(NEEDS_TMA)

CASES = {
    "bf16": (torch.bfloat16, None, 1e-2),
    "fp16": (torch.float16, None, 2e-3),
    "tf32": (torch.float32, "tf32", 2e-3),
}
SHAPES = [
    ((4, 64, 56, 56), (64, 64, 3, 3), dict(padding=1)),
    ((3, 128, 13, 11), (96, 128, 3, 3), dict(padding=1)),
    ((2, 256, 7, 7), (200, 256, 1, 1), dict()),
    ((2, 64, 20, 19), (64, 32, 5, 5), dict(padding=4, dilation=2, groups=2)),
]


def _channels_last(t):
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


DIRECTIONS = [
    ("forward", "IMPLICIT_GEMM"),
    ("backward_data", "IMPLICIT_GEMM"),
    ("backward_filter", "IMPLICIT_GEMM"),
    ("backward_filter", "IMPLICIT_GEMM_SPLIT_K"),
]


@pytest.mark.parametrize("direction,algo_name", DIRECTIONS)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_every_tma_candidate(direction, algo_name, case, shape, monkeypatch):
    monkeypatch.setenv(ig.TMA_ENV, "1")
    dtype, math_mode, tol = CASES[case]
    xs, ws, conv = SHAPES[shape]
    x = _channels_last(torch.randn(xs, device="cuda", dtype=dtype))
    w = _channels_last(torch.randn(ws, device="cuda", dtype=dtype) / (ws[1] * 9) ** 0.5)
    args = {**dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation"), **conv}
    p, scratch = _problem_for_selection(direction, x, w, math=math_mode, **args)
    dy = scratch.y  # channels-last like x, random
    bias = torch.randn(ws[0], device="cuda", dtype=dtype) if direction == "forward" else None
    algo = ALGORITHMS[algo_name]
    workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
    candidates = [t for t in algo.tile_candidates(p) if getattr(t, "tma", False)]
    if not candidates:  # backward-data needs K/groups a multiple of every tile's chunk
        assert direction == "backward_data"
        assert all(ig.tma_unsupported(p, t.block_k) for t in algo.tile_candidates(p))
        return
    written = {"forward": dy, "backward_data": x, "backward_filter": w}[direction]
    for tiles in candidates:
        prior = torch.randn_like(written)
        out = prior.clone()
        t = {
            "forward": ConvTensors(x, w, out, bias),
            "backward_data": ConvTensors(out, w, dy),
            "backward_filter": ConvTensors(x, out, dy),
        }[direction]
        algo.prepare(p, tiles)(t, workspace, 0.5, 0.25)
        kw = dict(alpha=0.5, beta=0.25, out=prior, **conv)
        if direction == "forward":
            ref = R.conv_forward(x, w, bias, **kw)
        elif direction == "backward_data":
            ref = R.conv_backward_data(dy, w, xs, **kw)
        else:
            ref = R.conv_backward_filter(x, dy, ws, **kw)
        err = R.rel_error(out, ref)
        assert err < tol, f"{direction} {algo_name} {tiles}: relative error {err:.2e}"


def test_misaligned_view_takes_the_pointer_path(monkeypatch):
    monkeypatch.setenv(ig.TMA_ENV, "1")
    xs, ws, conv = SHAPES[0]
    base = torch.randn(xs[0] * 56 * 56 * 64 + 1, device="cuda", dtype=torch.bfloat16)
    x = base[1:].view(xs[0], 56, 56, 64).permute(0, 3, 1, 2)  # 2 bytes past 16-byte alignment
    w = _channels_last(torch.randn(ws, device="cuda", dtype=torch.bfloat16) / 24)
    args = dict(stride=1, padding=1, dilation=1, groups=1, mode="cross_correlation")
    p, scratch = _problem_for_selection("forward", x, w, math=None, **args)
    algo = ALGORITHMS["IMPLICIT_GEMM"]
    tiles = next(t for t in algo.tile_candidates(p) if getattr(t, "tma", False))
    out = torch.full_like(scratch.y, float("nan"))
    algo.prepare(p, tiles)(ConvTensors(x, w, out), None, 1.0, 0.0)
    assert R.rel_error(out, R.conv_forward(x, w, padding=1)) < 1e-2
