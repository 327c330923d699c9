"""Split-K's two finishes: the last split of each tile summing the partials in the GEMM's own
launch, and a second launch over small tiles (from BrgemmLaunch.FINISH_APART_FROM splits on).
Both add the partials in split order, so they must agree bit for bit, and with the float64
reference: IMPLICIT_GEMM_SPLIT_K's backward-filter and forward (with bias, alpha and beta on
a prior output) and the split linear weight gradient."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close, make_tensor

from rtdnn import ops, reference
from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.kernels import launch
from rtdnn.kernels.launch import BrgemmLaunch
from rtdnn.ops.conv import _problem_for_selection

SPLIT_K = ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]
CONV = dict(stride=1, padding=1, dilation=1, groups=1, mode="cross_correlation", math="fp32")


@pytest.fixture
def finishes(monkeypatch) -> list[int]:
    """The splits of each finish launch made (a second launch), as they are made."""
    made: list[int] = []
    make = launch.split_finish

    def counted(*args, **kwargs):
        made.append(args[4])
        return make(*args, **kwargs)

    monkeypatch.setattr(launch, "split_finish", counted)
    return made


def _run(direction, x, w, dy, bias, alpha, beta, prior, finish_apart_from, monkeypatch):
    """The written tensor of one split-K run with the given finish threshold."""
    monkeypatch.setattr(BrgemmLaunch, "FINISH_APART_FROM", finish_apart_from)
    p, scratch = _problem_for_selection(direction, x, w, **CONV)
    assert SPLIT_K.splits(p) >= 2
    out = prior.clone()
    t = ConvTensors(x, w, out, bias) if direction == "forward" else ConvTensors(x, out, dy, None)
    workspace = torch.empty(SPLIT_K.workspace_bytes(p), dtype=torch.uint8)
    SPLIT_K.prepare(p, SPLIT_K.tile_candidates(p)[0])(t, workspace, alpha, beta)
    return out


@pytest.mark.parametrize("direction", ["forward", "backward_filter"])
def test_both_finishes_agree_bit_for_bit(direction, finishes, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    dtype = torch.float32
    # A 2x2 image with many channels: few output tiles, a long reduction, so several splits.
    x = (
        make_tensor((2, 64, 3, 3), dtype, "channels_last", gen)
        if direction == "forward"
        else (make_tensor((4, 8, 9, 9), dtype, "channels_last", gen))
    )
    k = 8 if direction == "forward" else 16
    w = make_tensor((k, x.shape[1], 3, 3), dtype, "channels_last", gen)
    y_shape = (x.shape[0], k, x.shape[2], x.shape[3])
    dy = make_tensor(y_shape, dtype, "channels_last", gen)
    bias = torch.randn(k, generator=gen) if direction == "forward" else None
    prior = (dy if direction == "forward" else w).clone()
    alpha, beta = 0.5, 2.0
    runs = [
        _run(direction, x, w, dy, bias, alpha, beta, prior, threshold, monkeypatch)
        for threshold in (2, 10**9)  # a second launch; the GEMM's own
    ]
    assert len(finishes) == 1 and finishes[0] >= 2  # the first run's, not the second's
    assert torch.equal(runs[0], runs[1])
    if direction == "forward":
        ref = reference.conv_forward(x, w, bias, padding=1, alpha=alpha, beta=beta, out=prior)
    else:
        ref = reference.conv_backward_filter(x, dy, w.shape, padding=1, alpha=alpha, beta=beta,
                                             out=prior)  # fmt: skip
    assert_close(runs[0], ref)


def test_linear_weight_gradient_split_apart(finishes, monkeypatch):
    monkeypatch.setattr(BrgemmLaunch, "FINISH_APART_FROM", 2)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(300, 24, generator=gen)
    dy = torch.randn(300, 40, generator=gen)
    out = ops.linear_backward_weight(x, dy, out=torch.full((40, 24), float("nan")))
    assert_close(out, dy.double().t() @ x.double())
    assert finishes == [2]
