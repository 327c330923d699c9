"""Activations: the public functional API.

Any shape (N-d, any strides, channels-last), float32 / float16 / bfloat16, float32 arithmetic.

    out = alpha * act(x) + beta * out               (forward)
    out = alpha * act'(x) * dy + beta * out         (backward)

Modes and `coef` (cuDNN's activation coefficient; None takes the default shown):

    identity, relu, sigmoid, tanh, gelu (erf form), gelu_tanh (tanh approximation)
    clipped_relu   min(max(x, 0), coef)              coef = ceiling, default 6.0
    hardtanh       min(max(x, lo), hi)               coef = (lo, hi), default (-1.0, 1.0)
    elu            x > 0 ? x : coef * (e^x - 1)      coef = alpha, default 1.0
    leaky_relu     x > 0 ? x : coef * x              coef = negative slope, default 0.01
    swish          x * sigmoid(coef * x)             coef = beta, default 1.0 (SiLU)

The backward reads dy and one more tensor: y for relu, sigmoid and tanh, x for the others,
nothing for identity (`activation_needs(mode)`); the other may be None.

`out` may be exactly x (forward) or exactly dy, x or y (backward): each element is read
before the same element is written, so `out=x` computes in place. Any other overlap of `out`
with an input is refused (BadParamError).
"""

from __future__ import annotations

import torch

from ..core import bad_param, check_no_overlap, check_scaling, check_tensor
from ..core.prepared import PreparedCalls, nonzero, signature
from ..kernels import elementwise as ew
from ..kernels.activation import ACTIVATIONS
from ._common import check_real, check_span, elementwise_plan, output

MODES = tuple(ACTIVATIONS)

#: Checked call signatures -> prepared calls (core.prepared).
_calls = PreparedCalls()

_DEFAULT_COEF = {
    "clipped_relu": 6.0,
    "hardtanh": (-1.0, 1.0),
    "elu": 1.0,
    "leaky_relu": 0.01,
    "swish": 1.0,
}


def activation_needs(mode: str) -> str:
    """What activation_backward reads besides dy: "x", "y" or "" (nothing)."""
    return _mode(mode).needs


def _mode(mode: str):
    if mode not in ACTIVATIONS:
        raise bad_param("mode", mode, f"one of {MODES}")
    return ACTIVATIONS[mode]


def _params(mode: str, coef) -> tuple[float, float, float]:
    if coef is None:
        coef = _DEFAULT_COEF.get(mode, 0.0)
    if mode == "hardtanh":
        try:
            lo, hi = coef
        except (TypeError, ValueError):
            raise bad_param("coef", coef, "a pair (min_val, max_val) for hardtanh") from None
        lo, hi = check_real("coef", lo), check_real("coef", hi)
        if not lo <= hi:
            raise bad_param("coef", coef, "min_val <= max_val")
        return lo, hi, 0.0
    c = check_real("coef", coef)
    if mode == "clipped_relu":
        if not c >= 0:
            raise bad_param("coef", coef, "a ceiling >= 0 for clipped_relu")
        return 0.0, c, 0.0
    return c, 0.0, 0.0


def activation_forward(
    x: torch.Tensor,
    mode: str,
    *,
    coef: float | tuple[float, float] | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = alpha * act(x) + beta * out. x: any shape; y: x's shape, dtype and layout (or out).

    `out` may be `x` itself (in place).
    """
    check_scaling(alpha, beta, out)
    key = signature("activation", (x, out), mode, coef, nonzero(beta))
    call = _calls.get(key, lambda: _forward_call(x, mode, coef, out, beta))
    if out is not None:
        check_no_overlap(out, [("x", x)], same_index_ok=True)
    return call(x, out, alpha, beta)


def _forward_call(x, mode, coef, out, beta):
    act = _mode(mode)
    x = check_tensor("x", x, empty=True)
    check_span("x", x)
    p = _params(mode, coef)
    y = output(out, x.shape, x, 0.0, beta, reads=[], in_place_ok=True, preserve_strides=True)
    if y.numel() == 0:
        return lambda x, out, alpha, beta: out if out is not None else torch.empty_like(x)
    run = ew.prepared_launch(act.forward, elementwise_plan(x.shape, y, [x]), 1, beta != 0)

    def call(x, out, alpha, beta):
        y = out if out is not None else torch.empty_like(x)
        run(y, (x,), alpha, beta, p)
        return y

    return call


def activation_backward(
    dy: torch.Tensor,
    x: torch.Tensor | None,
    y: torch.Tensor | None,
    mode: str,
    *,
    coef: float | tuple[float, float] | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """dx = alpha * act'(x) * dy + beta * out, all of dy's shape.

    dy: the gradient of y; x: the forward input; y: the forward output. Only the tensor that
    `activation_needs(mode)` names is read; the other may be None. Returns dx in dy's layout,
    or `out`.
    """
    check_scaling(alpha, beta, out)
    key = signature("activation_backward", (dy, x, y, out), mode, coef, nonzero(beta))
    call = _calls.get(key, lambda: _backward_call(dy, x, y, mode, coef, out, beta))
    if out is not None:
        check_no_overlap(out, [("dy", dy), ("x", x), ("y", y)], same_index_ok=True)
    return call(dy, x, y, out, alpha, beta)


def _backward_call(dy, x, y, mode, coef, out, beta):
    act = _mode(mode)
    dy = check_tensor("dy", dy, empty=True)
    check_span("dy", dy)
    inputs = [dy]
    for name, t in (("x", x), ("y", y)):
        if t is None:
            if act.needs == name:
                raise bad_param(name, None, f"a tensor: the {mode} backward reads {name}")
            continue
        check_tensor(name, t, dtype=dy.dtype, device=dy.device, empty=True)
        if tuple(t.shape) != tuple(dy.shape):
            raise bad_param(f"{name}.shape", tuple(t.shape), f"{tuple(dy.shape)}, dy's shape")
        check_span(name, t)
        if act.needs == name:
            inputs.append(t)
    p = _params(mode, coef)
    dx = output(out, dy.shape, dy, 0.0, beta, reads=[], in_place_ok=True, preserve_strides=True)
    if dx.numel() == 0:
        return lambda dy, x, y, out, alpha, beta: out if out is not None else torch.empty_like(dy)
    run = ew.prepared_launch(act.backward, elementwise_plan(dy.shape, dx, inputs), len(inputs),
                             beta != 0)  # fmt: skip
    needs_x, needs_y = act.needs == "x", act.needs == "y"

    def call(dy, x, y, out, alpha, beta):
        dx = out if out is not None else torch.empty_like(dy)
        run(dx, (dy, x) if needs_x else (dy, y) if needs_y else (dy,), alpha, beta, p)
        return dx

    return call
