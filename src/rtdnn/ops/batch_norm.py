"""Batch normalization as cuDNN defines it, with its fused BN_ACTIVATION / BN_ADD_ACTIVATION.

x is (N, C, *S) with 0 to 3 spatial dims and any strides (channels-last included); outputs
keep x's memory format. Two modes:

    "spatial"          one statistic per channel, over N and every spatial position;
                       weight, bias, running and saved statistics are (C,)
    "per_activation"   one statistic per (c, *s), over N only; they are (C, *S)

Forward (training and inference) computes

    out = alpha * act(weight * (x - mean) / sqrt(var + eps) + bias + z) + beta * out

where z (optional) is the residual of BN_ADD_ACTIVATION and act is "identity", "relu",
"silu" or "hardswish".
Statistics are float32 whatever the data type. Results are deterministic: every reduction runs
in a fixed order (atomics only count arrivals, never add values).

An empty x (a batch of N = 0, as torch allows) gives empty results without a kernel launch: in
training the running statistics are left as they are and the saved ones are NaN (the mean of
no values); the backward's weight and bias gradients are zeros.

`out` and the inputs: batch_norm_forward_inference is one elementwise pass, so its out may
be exactly x or z (in place). The training forward and the backward read x in two passes,
so there any overlap of out with an input (x, dy, z, weight, bias, statistics) is refused
(BadParamError), as is any overlap of the running statistics (updated in place) with each
other, out or an input. eps must be > 0, momentum in [0, 1].
"""

from __future__ import annotations

import math

import torch

from ..algos import norm as engine
from ..core import (
    bad_param,
    byte_spans,
    check_no_overlap,
    check_out_disjoint,
    check_scaling,
    check_tensor,
    spans_apart,
)
from ..core.prepared import nonzero, signature
from . import _norm as V

MODES = ("spatial", "per_activation")


def _setup(x: torch.Tensor, mode: str) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(kept dims, parameter shape, values per statistic) of x in `mode`."""
    if mode not in MODES:
        raise bad_param("mode", mode, f"one of {MODES}")
    kept = (1,) if mode == "spatial" else tuple(range(1, x.dim()))
    pshape = tuple(x.shape[d] for d in kept)
    if 0 in pshape:
        raise bad_param("x.shape", tuple(x.shape), f"no zero-sized dim among the kept {kept}")
    return kept, pshape, x.numel() // math.prod(pshape)


def batch_norm_forward_training(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    running_mean: torch.Tensor | None = None,
    running_var: torch.Tensor | None = None,
    momentum: float = 0.1,
    eps: float = 1e-5,
    mode: str = "spatial",
    z: torch.Tensor | None = None,
    activation: str = "identity",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training forward with batch statistics. Returns (y, saved_mean, saved_invstd).

    x: (N, C, *S). weight, bias: parameter shape or None (1 and 0). running_mean and
    running_var (both or neither; contiguous, any float dtype) are updated in place:
    running = (1 - momentum) * running + momentum * batch, the variance unbiased
    (cuDNN's exponentialAverageFactor; torch.nn's momentum=None is momentum = 1 / steps).
    saved_mean and saved_invstd = 1 / sqrt(var + eps) (biased variance) are float32 of the
    parameter shape, for batch_norm_backward. z: x's shape, the residual added before the
    activation. Statistics take two reads of x (one for the statistics, one to normalize).
    """
    tensors = (x, weight, bias, running_mean, running_var, z, out)
    call = prepared_training(*tensors, mode, activation, beta)
    return run_training(call, *tensors, momentum, eps, alpha, beta)


def prepared_training(x, weight, bias, running_mean, running_var, z, out, mode, activation,
                      beta):  # fmt: skip
    """batch_norm_forward_training's prepared call for its arguments' signature (checked and
    prepared on the signature's first call): run it with run_training."""
    k = signature("bn_train", (x, weight, bias, running_mean, running_var, z, out), mode,
                  activation, nonzero(beta))  # fmt: skip
    return engine.cache.get(
        k, lambda: _train_call(x, weight, bias, running_mean, running_var, z, out, mode,
                               activation, beta)
    )  # fmt: skip


def run_training(call, x, weight, bias, running_mean, running_var, z, out, momentum, eps, alpha,
                 beta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """What batch_norm_forward_training checks on every call (what its signature does not
    fix: the scalars, overlaps), then the prepared `call` of these arguments' signature."""
    momentum = V.momentum(momentum)
    eps = V.eps(eps)
    check_scaling(alpha, beta, out)
    check_out_disjoint(
        out,
        x=x,
        weight=weight,
        bias=bias,
        running_mean=running_mean,
        running_var=running_var,
        z=z,
    )
    # running_mean and running_var (both or neither, checked by _train_call) are written in
    # place while x, weight, bias and z are read (out against them: above). The spans are
    # the prepared call's; an overlap found from them is named by the full checks.
    stats = (running_mean, running_var, x, weight, bias, z)
    if running_mean is not None and not spans_apart(stats, call.spans, written=2):
        others = [("x", x), ("weight", weight), ("bias", bias), ("z", z)]
        check_no_overlap(running_mean, others, out_name="running_mean")
        others.append(("running_mean", running_mean))
        check_no_overlap(running_var, others, out_name="running_var")
    return call(
        x, weight, bias, running_mean, running_var, z, out, momentum, eps, float(alpha),
        float(beta),
    )  # fmt: skip


def _train_call(x, weight, bias, running_mean, running_var, z, out, mode, activation, beta):
    given = (running_mean, running_var, x, weight, bias, z)  # as the caller passes them
    x = check_tensor("x", x, ndim=(2, 3, 4, 5), empty=True)
    kept, pshape, count = _setup(x, mode)
    weight = V.param("weight", weight, pshape, x)
    bias = V.param("bias", bias, pshape, x)
    if (running_mean is None) != (running_var is None):
        raise bad_param("running_var", "one of the pair", "running_mean and running_var together")
    if running_mean is not None:
        V.running("running_mean", running_mean, pshape, x)
        V.running("running_var", running_var, pshape, x)
    z = V.like("z", z, x) if z is not None else None
    act = V.activation(activation)
    check_scaling(0.0, beta, out)
    if count == 1:
        raise bad_param("x.shape", tuple(x.shape), "more than one value per statistic in training")
    y = V.output(out, x)
    V.ready(x)
    y_strides = y.stride()
    spans = byte_spans(*given)  # of the tensors checked above
    if count == 0:  # an empty batch: nothing to normalize, no statistics to update

        def empty_call(x, weight, bias, running_mean, running_var, z, out, momentum, eps, *_):
            y = out if out is not None else V.empty(x.shape, y_strides, x)
            nan = torch.full(pshape, math.nan, dtype=torch.float32, device=x.device)
            return y, nan, nan.clone()

        empty_call.spans = spans
        return empty_call
    shape = x.shape
    plan = engine.ForwardPlan(
        x, y, kept, V.broadcast(weight, kept, shape), V.broadcast(bias, kept, shape), z,
        rms=False, activation=act, beta_nonzero=beta != 0, running=running_mean is not None,
    )  # fmt: skip

    def call(x, weight, bias, running_mean, running_var, z, out, momentum, eps, alpha, beta):
        y = out if out is not None else V.empty(x.shape, y_strides, x)
        mean = torch.empty(pshape, dtype=torch.float32, device=x.device)
        invstd = torch.empty(pshape, dtype=torch.float32, device=x.device)
        plan(
            x, y, mean, invstd, V.contiguous(weight), V.contiguous(bias), z, running_mean,
            running_var, eps, momentum, alpha, beta,
        )  # fmt: skip
        return y, mean, invstd

    call.spans = spans
    return call


def batch_norm_forward_inference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    *,
    eps: float = 1e-5,
    mode: str = "spatial",
    z: torch.Tensor | None = None,
    activation: str = "identity",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Inference forward with given (estimated) statistics: one elementwise pass.

    y = alpha * act(weight * (x - running_mean) / sqrt(running_var + eps) + bias + z)
        + beta * out. Shapes as in batch_norm_forward_training; the statistics may have any
    float dtype and strides.
    """
    tensors = (x, weight, bias, running_mean, running_var, z, out)
    k = signature("bn_infer", tensors, mode, activation, nonzero(beta))
    call = engine.cache.get(k, lambda: _infer_call(*tensors, mode, activation, beta))
    eps = V.eps(eps)
    check_scaling(alpha, beta, out)
    if out is not None:
        # One elementwise pass: out may be exactly x or z (in place), nothing else they read.
        check_no_overlap(out, [("x", x), ("z", z)], same_index_ok=True)
        check_out_disjoint(
            out, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var
        )
    return call(*tensors, eps, float(alpha), float(beta))


def _infer_call(x, weight, bias, running_mean, running_var, z, out, mode, activation, beta):
    x = check_tensor("x", x, ndim=(2, 3, 4, 5), empty=True)
    kept, pshape, _ = _setup(x, mode)
    weight = V.param("weight", weight, pshape, x)
    bias = V.param("bias", bias, pshape, x)
    running_mean = V.param("running_mean", running_mean, pshape, x)
    running_var = V.param("running_var", running_var, pshape, x)
    if running_mean is None or running_var is None:
        raise bad_param("running_mean", None, "running_mean and running_var tensors")
    z = V.like("z", z, x) if z is not None else None
    act = V.activation(activation)
    check_scaling(0.0, beta, out)
    y = V.output(out, x)
    V.ready(x)
    y_strides = y.stride()
    if x.numel() == 0:
        return lambda x, weight, bias, rm, rv, z, out, *_: (
            out if out is not None else V.empty(x.shape, y_strides, x)
        )
    shape = x.shape
    plan = engine.ApplyPlan(
        x, y, kept, V.broadcast(running_mean, kept, shape),
        V.broadcast(running_var, kept, shape), True, V.broadcast(weight, kept, shape),
        V.broadcast(bias, kept, shape), z, rms=False, activation=act, beta_nonzero=beta != 0,
    )  # fmt: skip

    def call(x, weight, bias, running_mean, running_var, z, out, eps, alpha, beta):
        y = out if out is not None else V.empty(x.shape, y_strides, x)
        plan(
            x, y, running_mean.contiguous(), running_var.contiguous(), V.contiguous(weight),
            V.contiguous(bias), z, eps, alpha, beta,
        )  # fmt: skip
        return y

    return call


def batch_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    saved_mean: torch.Tensor,
    saved_invstd: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    z: torch.Tensor | None = None,
    activation: str = "identity",
    mode: str = "spatial",
    training: bool = True,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Backward of batch norm (and of its fused activation and residual add).

    Returns (dx, dweight, dbias, dz): dx = alpha * dL/dx + beta * out in x's memory format;
    dweight and dbias (parameter shape, weight's dtype or float32 without a weight) are always
    computed, as in cuDNN; dz = dL/dz (z's shape) when z is given, else None.

    saved_mean, saved_invstd: from the training forward (training=True), or for an inference
    forward the running mean and 1 / sqrt(running_var + eps) (training=False: the statistics
    are constants and dx = dy * weight * invstd). With an activation, pass the forward's
    weight, bias and z: the activation's input is recomputed from them and x (y is not
    needed). Two passes over dy and x: sums per statistic, then dx.
    """
    tensors = (dy, x, saved_mean, saved_invstd, weight, bias, z, out)
    call = prepared_backward(*tensors, activation, mode, training, beta)
    check_scaling(alpha, beta, out)
    check_out_disjoint(
        out,
        dy=dy,
        x=x,
        saved_mean=saved_mean,
        saved_invstd=saved_invstd,
        weight=weight,
        bias=bias,
        z=z,
    )
    return call(*tensors, float(alpha), float(beta))


def prepared_backward(dy, x, saved_mean, saved_invstd, weight, bias, z, out, activation, mode,
                      training, beta):  # fmt: skip
    """batch_norm_backward's prepared call for its arguments' signature, called with (dy, x,
    saved_mean, saved_invstd, weight, bias, z, out, alpha, beta) once batch_norm_backward's
    per-call checks (scalars, out's overlaps) have passed."""
    tensors = (dy, x, saved_mean, saved_invstd, weight, bias, z, out)
    k = signature("bn_bwd", tensors, activation, mode, training, nonzero(beta))
    return engine.cache.get(k, lambda: _backward_call(*tensors, activation, mode, training, beta))


def _backward_call(dy, x, saved_mean, saved_invstd, weight, bias, z, out, activation, mode,
                   training, beta):  # fmt: skip
    x = check_tensor("x", x, ndim=(2, 3, 4, 5), empty=True)
    dy = V.like("dy", dy, x)
    kept, pshape, _ = _setup(x, mode)
    saved_mean = V.stat("saved_mean", saved_mean, pshape, x)
    saved_invstd = V.stat("saved_invstd", saved_invstd, pshape, x)
    weight = V.param("weight", weight, pshape, x)
    bias = V.param("bias", bias, pshape, x)
    z = V.like("z", z, x) if z is not None else None
    act = V.activation(activation)
    if not isinstance(training, bool):
        raise bad_param("training", training, "True or False")
    check_scaling(0.0, beta, out)
    dx = V.output(out, x)
    V.ready(x)
    dz = V.output(None, z) if z is not None else None
    gdt = V.grad_dtype(weight)
    dx_strides = dx.stride()
    dz_strides = dz.stride() if dz is not None else None
    if x.numel() == 0:  # an empty batch: sums over no values

        def empty_call(dy, x, saved_mean, saved_invstd, weight, bias, z, out, alpha, beta):
            dx = out if out is not None else V.empty(x.shape, dx_strides, x)
            dz = V.empty(z.shape, dz_strides, z) if z is not None else None
            return dx, V.zeros(pshape, gdt, x), V.zeros(pshape, gdt, x), dz

        return empty_call
    shape = x.shape
    plan = engine.SplitBackwardPlan(
        dy, x, dx, kept, V.broadcast(saved_mean, kept, shape), (1, math.prod(pshape), 1),
        V.broadcast(weight, kept, shape), V.broadcast(bias, kept, shape), z, dz, grads=True,
        training=training, rms=False, activation=act, beta_nonzero=beta != 0,
    )  # fmt: skip

    def call(dy, x, saved_mean, saved_invstd, weight, bias, z, out, alpha, beta):
        dx = out if out is not None else V.empty(x.shape, dx_strides, x)
        dz = V.empty(z.shape, dz_strides, z) if z is not None else None
        dw = torch.empty(pshape, dtype=gdt, device=x.device)
        db = torch.empty(pshape, dtype=gdt, device=x.device)
        mean, invstd = V.float_contiguous(saved_mean), V.float_contiguous(saved_invstd)
        plan(
            dy, x, dx, mean, invstd, V.contiguous(weight), V.contiguous(bias), z, dz, dw, db,
            alpha, beta,
        )  # fmt: skip
        return dx, dw, db, dz

    return call
