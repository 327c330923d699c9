"""Convolution: the public functional API.

Shapes follow torch: x (N, C, *spatial), w (K, C/groups, *kernel), y (N, K, *out_spatial),
with 1 to 3 spatial dims and any strides. Each call validates everything before a kernel is
launched, builds a ConvProblem, picks an algorithm and runs it:

    out = alpha * conv(...) + beta * out          (out's prior value; beta != 0 needs `out`)

`mode="convolution"` flips the filter (true convolution), "cross_correlation" (the default)
does not, as in cuDNN. `math` is "fp32" (strict) or "tf32" for float32 data; None follows
`torch.backends.cudnn.allow_tf32`. Half-precision data always accumulates in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from .. import select
from ..algos import ConvAlgorithm, ConvTensors
from ..algos.geometry import output_geometry, parallel_slots
from ..core import (
    ConvDesc,
    ConvProblem,
    Direction,
    TensorDesc,
    allocate_workspace,
    bad_param,
    cached_call,
    check_out,
    check_runnable,
    check_scaling,
    check_tensor,
    conv_output_shape,
    empty_like_layout,
    resolve_math_mode,
)
from ..kernels.reduce import channel_partial_sum_kernel, channel_sum_finish_kernel

IntOrSeq = int | Sequence[int]


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _conv_desc(ndim, stride, padding, dilation, groups, mode, math) -> ConvDesc:
    args = (ndim, stride, padding, dilation, groups, mode, resolve_math_mode(math))
    return cached_call(_cached_conv_desc, *map(_hashable, args))


@functools.lru_cache(maxsize=4096)
def _cached_conv_desc(ndim, stride, padding, dilation, groups, mode, math) -> ConvDesc:
    return ConvDesc.create(ndim - 2, stride, padding, dilation, groups, mode, math)


# Shape checks and algorithm choice depend only on shapes, strides, dtype and parameters:
# remember them per problem so that repeated calls (every training step) skip straight to
# the launch. Only problems that passed validation are stored.
_plans: dict[tuple, tuple[ConvProblem, ConvAlgorithm, int]] = {}


@functools.lru_cache(maxsize=4096)
def _output_shape(x_shape: tuple, w_shape: tuple, conv: ConvDesc) -> tuple[int, ...]:
    return conv_output_shape(x_shape, w_shape, conv)


def _shape_arg(name: str, shape, ndim: int) -> tuple[int, ...]:
    try:
        t = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise bad_param(name, shape, f"a sequence of {ndim} ints") from None
    if len(t) != ndim:
        raise bad_param(name, shape, f"a sequence of {ndim} ints")
    return t


def _output(out: torch.Tensor | None, shape, like: torch.Tensor) -> torch.Tensor:
    if out is None:
        return empty_like_layout(shape, like)
    check_out(out, shape, like)
    return out


def _run(
    direction: Direction,
    tensors: ConvTensors,
    conv: ConvDesc,
    alpha: float,
    beta: float,
    algo: str,
    workspace_limit: int | None,
) -> None:
    x, w, y = tensors.x, tensors.w, tensors.y
    device = x.device
    key = (
        direction, x.shape, x.stride(), w.shape, w.stride(), y.shape, y.stride(), x.dtype,
        device, tensors.bias is not None, conv, algo, workspace_limit,
    )  # fmt: skip
    plan = _plans.get(key)
    if plan is None:
        check_runnable(device)
        p = ConvProblem.create(
            direction, TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), conv, device.type,
            tensors.bias is not None,
        )  # fmt: skip
        algorithm = select.resolve(p, algo, workspace_limit)
        plan = _plans[key] = (p, algorithm, algorithm.workspace_bytes(p))
    p, algorithm, workspace_bytes = plan
    algorithm.run(p, tensors, allocate_workspace(workspace_bytes, device), alpha, beta)


def conv_forward(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
    algo: str = "auto",
    workspace_limit: int | None = None,
    math: str | None = None,
) -> torch.Tensor:
    """y = alpha * conv(x, w) + bias + beta * out.

    x: (N, C, *S); w: (K, C/groups, *R); bias: (K,) or None. Returns y (N, K, *O), in x's
    memory format (channels-last in, channels-last out) unless `out` is given, which is then
    written in place and returned. `algo` is "auto" (the fastest whose workspace fits
    `workspace_limit` bytes) or an algorithm name such as "IMPLICIT_GEMM" or "GEMM".
    """
    x = check_tensor("x", x, ndim=(3, 4, 5))
    w = check_tensor("w", w, ndim=x.dim(), dtype=x.dtype, device=x.device)
    conv = _conv_desc(x.dim(), stride, padding, dilation, groups, mode, math)
    y_shape = _output_shape(x.shape, w.shape, conv)
    if bias is not None:
        bias = check_tensor("bias", bias, ndim=1, dtype=x.dtype, device=x.device)
        if bias.shape[0] != w.shape[0]:
            raise bad_param("bias.shape", tuple(bias.shape), f"({w.shape[0]},), one per filter")
        bias = bias.contiguous()
    check_scaling(alpha, beta, out)
    y = _output(out, y_shape, x)
    _run(Direction.FORWARD, ConvTensors(x, w, y, bias), conv, alpha, beta, algo, workspace_limit)
    return y


def conv_backward_data(
    dy: torch.Tensor,
    w: torch.Tensor,
    x_shape: Sequence[int],
    *,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
    algo: str = "auto",
    workspace_limit: int | None = None,
    math: str | None = None,
) -> torch.Tensor:
    """dx = alpha * (gradient of conv(x, w) w.r.t. x, given dy) + beta * out.

    dy: (N, K, *O); w: (K, C/groups, *R); x_shape: (N, C, *S). Returns dx in dy's memory
    format, or `out`.
    """
    dy = check_tensor("dy", dy, ndim=(3, 4, 5))
    w = check_tensor("w", w, ndim=dy.dim(), dtype=dy.dtype, device=dy.device)
    x_shape = _shape_arg("x_shape", x_shape, dy.dim())
    conv = _conv_desc(dy.dim(), stride, padding, dilation, groups, mode, math)
    _output_shape(x_shape, w.shape, conv)
    check_scaling(alpha, beta, out)
    dx = _output(out, x_shape, dy)
    tensors = ConvTensors(dx, w, dy)
    _run(Direction.BACKWARD_DATA, tensors, conv, alpha, beta, algo, workspace_limit)
    return dx


def conv_backward_filter(
    x: torch.Tensor,
    dy: torch.Tensor,
    w_shape: Sequence[int],
    *,
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
    algo: str = "auto",
    workspace_limit: int | None = None,
    math: str | None = None,
) -> torch.Tensor:
    """dw = alpha * (gradient of conv(x, w) w.r.t. w, given dy) + beta * out.

    x: (N, C, *S); dy: (N, K, *O); w_shape: (K, C/groups, *R). Returns dw in x's memory
    format, or `out`.
    """
    x = check_tensor("x", x, ndim=(3, 4, 5))
    dy = check_tensor("dy", dy, ndim=x.dim(), dtype=x.dtype, device=x.device)
    w_shape = _shape_arg("w_shape", w_shape, x.dim())
    conv = _conv_desc(x.dim(), stride, padding, dilation, groups, mode, math)
    _output_shape(x.shape, w_shape, conv)
    check_scaling(alpha, beta, out)
    dw = _output(out, w_shape, x)
    tensors = ConvTensors(x, dw, dy)
    _run(Direction.BACKWARD_FILTER, tensors, conv, alpha, beta, algo, workspace_limit)
    return dw


def conv_backward_bias(
    dy: torch.Tensor,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """db[k] = alpha * sum over n and every pixel of dy[n, k, ...] + beta * out[k].

    dy: (N, K, *O) with any strides. Returns db (K,) in dy's dtype (summed in float32).
    """
    dy = check_tensor("dy", dy, ndim=(3, 4, 5))
    check_scaling(alpha, beta, out)
    k = dy.shape[1]
    db = _output(out, (k,), dy)
    check_runnable(dy.device)
    geo = output_geometry(TensorDesc.of(dy))
    pixels = dy.numel() // k
    block_k, block_p = 32, 64
    slices = max(1, min(parallel_slots(dy.device.type), pixels // (4 * block_p)))
    per_slice = -(-pixels // slices)
    partial = torch.empty((slices, k), dtype=torch.float32, device=dy.device)
    grid = (-(-k // block_k), slices)
    channel_partial_sum_kernel[grid](dy, partial, geo, per_slice, BLOCK_P=block_p, BLOCK_K=block_k)
    channel_sum_finish_kernel[(-(-k // block_k),)](
        partial, db, db.stride(0), k, slices, float(alpha), float(beta),
        BETA_NONZERO=beta != 0, BLOCK_K=block_k,
    )  # fmt: skip
    return db


def _problem_for_selection(
    direction: str, x: torch.Tensor, w: torch.Tensor, stride, padding, dilation, groups, mode,
    math,
) -> tuple[ConvProblem, ConvTensors]:  # fmt: skip
    """The problem described by x and w in `direction`, and scratch tensors to run it on."""
    d = Direction.parse(direction)
    x = check_tensor("x", x, ndim=(3, 4, 5))
    w = check_tensor("w", w, ndim=x.dim(), dtype=x.dtype, device=x.device)
    check_runnable(x.device)
    conv = _conv_desc(x.dim(), stride, padding, dilation, groups, mode, math)
    y = empty_like_layout(conv_output_shape(x.shape, w.shape, conv), x)
    # The caller's x and w are read; the direction's output gets a scratch tensor.
    scratch = ConvTensors(
        torch.empty_like(x) if d == Direction.BACKWARD_DATA else x,
        torch.empty_like(w) if d == Direction.BACKWARD_FILTER else w,
        y if d == Direction.FORWARD else torch.randn_like(y),
    )
    p = ConvProblem.create(
        d, TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), conv, x.device.type
    )
    return p, scratch


def get_conv_algorithm(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    direction: str = "forward",
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    math: str | None = None,
    preference: str = "fastest",
    workspace_limit: int | None = None,
) -> str:
    """The algorithm rtdnn would use for this convolution, without running anything.

    x and w give the shapes, strides, dtype and device (their values are not read).
    preference: "fastest" (within `workspace_limit` bytes, if given) or "no_workspace".
    Times measured by `find_conv_algorithms` for the same problem take precedence.
    """
    p, _ = _problem_for_selection(direction, x, w, stride, padding, dilation, groups, mode, math)
    return select.choose(p, preference, workspace_limit).name


def find_conv_algorithms(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    direction: str = "forward",
    stride: IntOrSeq = 1,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    math: str | None = None,
) -> list[select.AlgoPerf]:
    """Run every algorithm that supports this convolution; return them fastest first.

    Each entry has the algorithm name, its median time in ms, its workspace in bytes and
    whether it is deterministic. Later `algo="auto"` calls for the same problem use the result.
    """
    p, scratch = _problem_for_selection(
        direction, x, w, stride, padding, dilation, groups, mode, math
    )
    return select.find(p, scratch)
