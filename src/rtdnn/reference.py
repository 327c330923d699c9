"""Float64 references of every primitive, for tests and the self-check.

Each takes the same arguments as the rtdnn function it checks and returns a float64 tensor
computed by PyTorch on upcast copies of the inputs (on the CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}


def _f64(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().to("cpu", torch.float64)


def _filter(w: torch.Tensor, mode: str) -> torch.Tensor:
    """True convolution is cross-correlation with the filter flipped in every spatial dim."""
    return w.flip(list(range(2, w.dim()))) if mode == "convolution" else w


def conv_forward(
    x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation",
    alpha=1.0, beta=0.0, out=None,
) -> torch.Tensor:  # fmt: skip
    y = _CONV[x.dim()](_f64(x), _filter(_f64(w), mode), None, stride, padding, dilation, groups)
    y = alpha * y
    if bias is not None:
        y = y + _f64(bias).view(1, -1, *([1] * (x.dim() - 2)))
    if beta != 0:
        y = y + beta * _f64(out)
    return y


def _conv_grads(x, w, dy, stride, padding, dilation, groups, mode):
    x = _f64(x).requires_grad_(True)
    w = _f64(w).requires_grad_(True)
    y = _CONV[x.dim()](x, _filter(w, mode), None, stride, padding, dilation, groups)
    dx, dw = torch.autograd.grad(y, (x, w), _f64(dy))
    return dx, dw


def conv_backward_data(
    dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation",
    alpha=1.0, beta=0.0, out=None,
) -> torch.Tensor:  # fmt: skip
    x = torch.zeros(x_shape, dtype=torch.float64)
    dx, _ = _conv_grads(x, w, dy, stride, padding, dilation, groups, mode)
    return alpha * dx + (beta * _f64(out) if beta != 0 else 0)


def conv_backward_filter(
    x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation",
    alpha=1.0, beta=0.0, out=None,
) -> torch.Tensor:  # fmt: skip
    w = torch.zeros(w_shape, dtype=torch.float64)
    _, dw = _conv_grads(x, w, dy, stride, padding, dilation, groups, mode)
    return alpha * dw + (beta * _f64(out) if beta != 0 else 0)


def conv_backward_bias(dy, *, alpha=1.0, beta=0.0, out=None) -> torch.Tensor:
    dims = [0, *range(2, dy.dim())]
    db = alpha * _f64(dy).sum(dims)
    return db + (beta * _f64(out) if beta != 0 else 0)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere in out gives inf."""
    out64 = _f64(out)
    if not torch.isfinite(out64).all():
        return float("inf")
    return float((out64 - ref).norm() / ref.norm().clamp_min(1e-300))
