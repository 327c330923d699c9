"""Dropout with a counter-based generator: the public functional API.

    y  = alpha * x * mask / (1 - p) + beta * out          (forward)
    dx = alpha * dy * mask / (1 - p) + beta * out         (backward)

mask[e] = u(seed, e) >= p, where e is the element's row-major (logical) index in the tensor's
shape and u is output e % 4 of Philox4x32-10 (Triton's tl.rand4x) on counter e // 4, mapped to
[0, 1) as tl.rand does. The mask therefore depends only on (seed, shape, p): not on strides,
memory format, launch grid or device count, and the backward recomputes it from the seed
instead of storing it (no reserve space). Any shape (empty ones too), any strides,
float32/16/bfloat16.

`out` may be exactly x (forward) or dy (backward): elementwise, so in place is exact. Any
other overlap of `out` with the input is refused (BadParamError).
"""

from __future__ import annotations

import torch

from ..core import bad_param, check_tensor
from ..kernels import elementwise as ew
from ..kernels.tensor_ops import dropout_op
from ._common import check_span, elementwise_plan, output


def check_dropout_args(p, seed) -> tuple[float, float]:
    """p and seed checked (p in [0, 1], seed in [0, 2**63)): (p, the kept values' scale)."""
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise bad_param("p", p, "a probability in [0, 1]")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise bad_param("seed", seed, "an int in [0, 2**63)")
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    return float(p), scale


def _run(name: str, t: torch.Tensor, p, seed, alpha, beta, out) -> torch.Tensor:
    t = check_tensor(name, t, empty=True)
    check_span(name, t)
    prob, scale = check_dropout_args(p, seed)
    y = output(
        out, t.shape, t, alpha, beta, reads=[(name, t)], in_place_ok=True, preserve_strides=True
    )
    if y.numel() == 0:
        return y
    plan = elementwise_plan(t.shape, y, [t], index=True)
    ew.launch(dropout_op, y, [t], plan, alpha=alpha, beta=beta, p=(prob, scale, 0.0), seed=seed)
    return y


def dropout_forward(
    x: torch.Tensor,
    p: float,
    seed: int,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = alpha * dropout(x) + beta * out; y has x's shape, dtype and layout (or is `out`).

    p: drop probability in [0, 1]; seed: int in [0, 2**63).
    """
    return _run("x", x, p, seed, alpha, beta, out)


def dropout_backward(
    dy: torch.Tensor,
    p: float,
    seed: int,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """dx = alpha * dy * mask / (1 - p) + beta * out, with the forward's p and seed."""
    return _run("dy", dy, p, seed, alpha, beta, out)
