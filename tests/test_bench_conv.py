"""The convolution benchmark's correctness verdict: where rtdnn and cuDNN disagree, the float64
result of the same call decides (rtdnn passes if it is no further from it than cuDNN)."""

import math

import pytest
import torch

from rtdnn import reference as R
from rtdnn.bench.conv import AGREEMENT, Row, _verdict, judge, layer_calls

LAYER = dict(name="tiny", n=2, c=3, k=4, spatial=[5, 6], kernel=[3, 3], stride=[2, 1],
             padding=[1, 0], dilation=[1, 1], groups=1)  # fmt: skip


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_exact_is_the_float64_result(direction):
    c = layer_calls(LAYER, direction, torch.float32, None, device="cpu")
    args = dict(stride=(2, 1), padding=(1, 0))
    exact = c.exact()
    assert exact.dtype == torch.float64
    if direction == "forward":
        ref = R.conv_forward(c.x, c.w, **args)
    elif direction == "backward_data":
        ref = R.conv_backward_data(c.dy, c.w, c.x.shape, **args)
    else:
        ref = R.conv_backward_filter(c.x, c.dy, c.w.shape, **args)
    assert R.rel_error(exact, ref) < 1e-12


def _row(ok: bool, err64: float = math.nan, cudnn64: float = math.nan) -> Row:
    return Row("l", "forward", "GEMM", 1.0, 1.0, 1.0, math.nan, math.nan, 1.0, 1.0, 6e-3, ok,
               rel_err_vs_float64=err64, cudnn_err_vs_float64=cudnn64)  # fmt: skip


def test_verdict_names_both_errors_where_they_disagreed():
    assert _verdict(_row(True)) == "yes"
    closer = _verdict(_row(True, 2e-5, 5e-3))
    assert closer.startswith("yes") and "rtdnn 2.0e-05" in closer and "cuDNN 5.0e-03" in closer
    further = _verdict(_row(False, 7e-3, 1e-3))
    assert further.startswith("NO (6.0e-03 vs cuDNN)") and "rtdnn 7.0e-03" in further


def test_judge_asks_float64_where_rtdnn_and_cudnn_disagree():
    """Within the dtype's agreement of cuDNN's result: right, float64 not asked for. Beyond
    it: right only within that agreement of the float64 result, whatever cuDNN's error
    (an off cuDNN does not excuse rtdnn; non-finite results never pass)."""
    c = layer_calls(LAYER, "forward", torch.float32, None, device="cpu")
    bound = AGREEMENT[torch.float32]
    exact = c.exact()
    asked = []

    def truth():
        asked.append(1)
        return exact

    right = exact.float()
    assert judge(right, c, torch.float32, truth).ok and not asked
    c.expected = exact.float() * (1 + 4 * bound)  # cuDNN off
    verdict = judge(right, c, torch.float32, truth)
    assert verdict.ok and asked and verdict.err64 < 1e-6 < bound < verdict.cudnn_err64
    assert not judge(right * (1 + 2 * bound), c, torch.float32, truth).ok  # both off
    assert not judge(torch.full_like(right, float("nan")), c, torch.float32, truth).ok
