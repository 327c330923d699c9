"""Softmax: the public functional API.

x: (C,), (N, C) or (N, C, *S) with up to 3 spatial dims, any strides, float32 / float16 /
bfloat16. A 1-D x is one row (softmax over all of it, as torch.softmax(x, 0)); a zero-sized
dim gives an empty result.

    mode "channel":   softmax over C at each (n, *s) position
    mode "instance":  softmax over C and all spatial positions of each sample n
    algo "fast":      exp(x) / sum exp(x)                (no max subtraction: may overflow)
         "accurate":  exp(x - max) / sum exp(x - max)
         "log":       x - max - log(sum exp(x - max))    (log-softmax)

    y  = alpha * softmax(x) + beta * out
    dx = alpha * (gradient given y and dy) + beta * out:
         y * (dy - sum(dy * y)) for fast/accurate, dy - exp(y) * sum(dy) for log

Rows (the reduced extent) of 1 to 2**20 elements and more. Rows up to 16384 elements are
one pass over memory; longer rows take two kernels and read the input twice.

`out` must share no memory with x, y or dy (BadParamError): a row is read more than once,
possibly by several programs, so even out=x is refused.
"""

from __future__ import annotations

import torch

from ..algos.geometry import parallel_slots
from ..core import bad_param, check_tensor
from ..kernels import softmax as K
from ._common import check_span, output

ALGOS = tuple(K.ALGOS)
MODES = ("channel", "instance")


def _check(algo: str, mode: str) -> None:
    if algo not in K.ALGOS:
        raise bad_param("algo", algo, f"one of {ALGOS}")
    if mode not in MODES:
        raise bad_param("mode", mode, f"one of {MODES}")


def _reduced(mode: str, ndim: int) -> tuple[int, ...]:
    return (1,) if mode == "channel" else tuple(range(1, ndim))


def _plan(shape, mode, tensors, device, elem_bytes):
    strides = [t.stride() for t in tensors]
    strides = tuple(strides + [strides[-1]] * (3 - len(strides)))
    slots = 2 * parallel_slots(device.type)
    return K.plan_softmax(
        tuple(shape), _reduced(mode, len(shape)), strides, slots=slots, elem_bytes=elem_bytes,
        fused_max=K.FUSED_MAX, split_block=K.SPLIT_BLOCK, max_splits=K.MAX_SPLITS,
    )  # fmt: skip


def _row(out: object) -> object:
    """A 1-D `out` as the one row the 2-D call writes (anything else is checked there)."""
    return out.unsqueeze(0) if isinstance(out, torch.Tensor) else out


def softmax_forward(
    x: torch.Tensor,
    *,
    algo: str = "accurate",
    mode: str = "channel",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = alpha * softmax(x) + beta * out; y has x's shape and layout (or is `out`)."""
    _check(algo, mode)
    x = check_tensor("x", x, ndim=(1, 2, 3, 4, 5), empty=True)
    if x.dim() == 1:  # one row of C
        y = softmax_forward(
            x.unsqueeze(0), algo=algo, mode=mode, alpha=alpha, beta=beta, out=_row(out)
        )
        return y.squeeze(0) if out is None else out
    check_span("x", x)
    y = output(out, x.shape, x, alpha, beta, reads=[("x", x)], preserve_strides=True)
    if y.numel() == 0:
        return y
    plan = _plan(x.shape, mode, [x, x, y], x.device, x.element_size())
    if plan is None:
        # Strides that do not merge into (positions, one reduced axis): go through a dense copy.
        from .tensor_ops import transform_tensor

        xc = transform_tensor(x, memory_format=torch.contiguous_format)
        yc = softmax_forward(xc, algo=algo, mode=mode)
        return transform_tensor(yc, out=y, alpha=alpha, beta=beta)
    K.launch_softmax(x, None, y, plan, algo, False, alpha, beta)
    return y


def softmax_backward(
    y: torch.Tensor,
    dy: torch.Tensor,
    *,
    algo: str = "accurate",
    mode: str = "channel",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """dx = alpha * (softmax gradient given y and dy) + beta * out; dx in dy's layout.

    y: softmax_forward's output with the same algo and mode; dy: the gradient of y.
    """
    _check(algo, mode)
    y = check_tensor("y", y, ndim=(1, 2, 3, 4, 5), empty=True)
    dy = check_tensor("dy", dy, ndim=y.dim(), dtype=y.dtype, device=y.device, empty=True)
    if tuple(dy.shape) != tuple(y.shape):
        raise bad_param("dy.shape", tuple(dy.shape), f"{tuple(y.shape)}, y's shape")
    if y.dim() == 1:  # one row of C
        dx = softmax_backward(
            y.unsqueeze(0), dy.unsqueeze(0), algo=algo, mode=mode, alpha=alpha, beta=beta,
            out=_row(out),
        )  # fmt: skip
        return dx.squeeze(0) if out is None else out
    check_span("y", y)
    check_span("dy", dy)
    reads = [("y", y), ("dy", dy)]
    dx = output(out, dy.shape, dy, alpha, beta, reads=reads, preserve_strides=True)
    if dx.numel() == 0:
        return dx
    plan = _plan(y.shape, mode, [y, dy, dx], y.device, y.element_size())
    if plan is None:
        from .tensor_ops import transform_tensor

        yc = transform_tensor(y, memory_format=torch.contiguous_format)
        dyc = transform_tensor(dy, memory_format=torch.contiguous_format)
        dxc = softmax_backward(yc, dyc, algo=algo, mode=mode)
        return transform_tensor(dxc, out=dx, alpha=alpha, beta=beta)
    K.launch_softmax(y, dy, dx, plan, algo, True, alpha, beta)
    return dx
