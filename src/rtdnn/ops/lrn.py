"""Cross-channel local response normalization: the public functional API.

x: (N, C, *S) with 0 to 3 spatial dims, any strides, float32 / float16 / bfloat16; a zero-sized
dim gives an empty result without a kernel launch. The normalization is
torch.nn.LocalResponseNorm's (cuDNN's LRN_CROSS_CHANNEL_DIM1):

    D[c] = lrn_k + lrn_alpha / size * sum of x[c']^2 over c' in [c - size//2, c + (size-1)//2]
    y    = alpha * x * D^-lrn_beta + beta * out
    dx   = alpha * (gradient given dy) + beta * out

The LRN constants are named lrn_alpha, lrn_beta and lrn_k because alpha and beta are the
output scaling shared by every rtdnn primitive.

`out` must share no memory with x or dy (BadParamError): each output reads its neighbours
across channels, so even out=x is refused.
"""

from __future__ import annotations

import torch

from ..core import bad_param, check_tensor
from ..kernels import lrn as K
from ._common import check_real, check_span, output


def _params(size, lrn_alpha, lrn_beta, lrn_k) -> tuple[int, float, float, float]:
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise bad_param("size", size, "an int >= 1")
    a = check_real("lrn_alpha", lrn_alpha)
    b = check_real("lrn_beta", lrn_beta)
    k = check_real("lrn_k", lrn_k)
    # With these signs the base lrn_k + lrn_alpha / size * sum(x^2) stays > 0, so its power
    # is finite: a zero or negative base would give inf or NaN.
    if not a >= 0:
        raise bad_param("lrn_alpha", lrn_alpha, "a finite real number >= 0")
    if not b >= 0:
        raise bad_param("lrn_beta", lrn_beta, "a finite real number >= 0")
    if not k > 0:
        raise bad_param("lrn_k", lrn_k, "a finite real number > 0")
    return size, a, b, k


def lrn_forward(
    x: torch.Tensor,
    size: int,
    *,
    lrn_alpha: float = 1e-4,
    lrn_beta: float = 0.75,
    lrn_k: float = 1.0,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = alpha * lrn(x) + beta * out; y has x's shape and layout (or is `out`)."""
    x = check_tensor("x", x, ndim=(2, 3, 4, 5), empty=True)
    check_span("x", x)
    size, a, b, k = _params(size, lrn_alpha, lrn_beta, lrn_k)
    bq = K.beta_quarters(b)  # lrn_beta as a number of quarters, for a cheaper pow
    y = output(out, x.shape, x, alpha, beta, reads=[("x", x)], preserve_strides=True)
    if y.numel() == 0:
        return y
    strides = (x.stride(), x.stride(), y.stride())
    plan = K.plan_lrn(
        x.shape, strides, elem_bytes=x.element_size(), whole_c=False, size=size,
        rows_max=K.ROWS_MAX,
    )  # fmt: skip
    kernel = K.lrn_fwd_rows_kernel if plan.rows else K.lrn_fwd_kernel
    kernel[plan.grid](
        x, y, plan.geo, a, b, k, float(alpha), float(beta), SIZE=size, BETA_Q=bq,
        BETA_NONZERO=beta != 0, BLOCK_P=plan.block_p, BLOCK_C=plan.block_c,
        num_warps=plan.num_warps,
    )  # fmt: skip
    return y


def lrn_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor | None,
    size: int,
    *,
    lrn_alpha: float = 1e-4,
    lrn_beta: float = 0.75,
    lrn_k: float = 1.0,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """dx = alpha * (gradient of lrn at x, given dy) + beta * out; dx in dy's layout.

    y (the forward output) is checked for shape when given but not read: it is recomputed.
    """
    x = check_tensor("x", x, ndim=(2, 3, 4, 5), empty=True)
    dy = check_tensor("dy", dy, ndim=x.dim(), dtype=x.dtype, device=x.device, empty=True)
    if tuple(dy.shape) != tuple(x.shape):
        raise bad_param("dy.shape", tuple(dy.shape), f"{tuple(x.shape)}, x's shape")
    if y is not None:
        check_tensor("y", y, dtype=x.dtype, device=x.device, empty=True)
        if tuple(y.shape) != tuple(x.shape):
            raise bad_param("y.shape", tuple(y.shape), f"{tuple(x.shape)}, x's shape")
    check_span("x", x)
    check_span("dy", dy)
    size, a, b, k = _params(size, lrn_alpha, lrn_beta, lrn_k)
    bq = K.beta_quarters(b)  # lrn_beta as a number of quarters, for a cheaper pow
    reads = [("dy", dy), ("x", x)]
    dx = output(out, dy.shape, dy, alpha, beta, reads=reads, preserve_strides=True)
    if dx.numel() == 0:
        return dx
    strides = (x.stride(), dy.stride(), dx.stride())
    plan = K.plan_lrn(
        x.shape, strides, elem_bytes=x.element_size(), whole_c=True, size=size,
        gather_max=K.GATHER_MAX, rows_max=K.ROWS_MAX,
    )  # fmt: skip
    if plan.rows:
        K.lrn_bwd_rows_kernel[plan.grid](
            x, dy, dx, plan.geo, a, b, k, float(alpha), float(beta), SIZE=size, BETA_Q=bq,
            BETA_NONZERO=beta != 0, BLOCK_P=plan.block_p, BLOCK_C=plan.block_c,
            num_warps=plan.num_warps,
        )  # fmt: skip
        return dx
    K.lrn_bwd_kernel[plan.grid](
        x, dy, dx, plan.geo, a, b, k, float(alpha), float(beta), SIZE=size, BETA_Q=bq,
        GATHER=plan.gather, BETA_NONZERO=beta != 0, BLOCK_P=plan.block_p,
        BLOCK_C=plan.block_c, num_warps=plan.num_warps,
    )  # fmt: skip
    return dx
