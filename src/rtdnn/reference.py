"""Float64 references of every primitive, for tests and the self-check.

Each takes the same arguments as the rtdnn function it checks and returns a float64 tensor
computed by PyTorch on upcast copies of the inputs (on the CPU).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}


def _f64(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().to("cpu", torch.float64)


def _filter(w: torch.Tensor, mode: str) -> torch.Tensor:
    """True convolution is cross-correlation with the filter flipped in every spatial dim."""
    return w.flip(list(range(2, w.dim()))) if mode == "convolution" else w


def conv_forward(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1,
                 mode="cross_correlation", alpha=1.0, beta=0.0, out=None) -> torch.Tensor:  # fmt: skip
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


def conv_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1,
                       mode="cross_correlation", alpha=1.0, beta=0.0, out=None) -> torch.Tensor:  # fmt: skip
    x = torch.zeros(x_shape, dtype=torch.float64)
    dx, _ = _conv_grads(x, w, dy, stride, padding, dilation, groups, mode)
    return alpha * dx + (beta * _f64(out) if beta != 0 else 0)


def conv_backward_filter(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1,
                         mode="cross_correlation", alpha=1.0, beta=0.0, out=None) -> torch.Tensor:  # fmt: skip
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


# -- normalization ----------------------------------------------------------------------------
# Forward references compute the statistics in float64 from x (two-pass). Backward references
# use the closed form with the given statistics (the exact gradient when they are the batch
# statistics); tests also compare end to end against torch autograd in float64.


def _bcast(t, dims, ndim):
    """t (of shape [x.shape[d] for d in dims]) viewed for broadcasting against x."""
    if t is None:
        return None
    t = _f64(t)
    shape = [1] * ndim
    for i, d in enumerate(dims):
        shape[d] = t.shape[i]
    return t.reshape(shape)


def _act(v, activation):
    return torch.relu(v) if activation == "relu" else v


def _scaled(y, alpha, beta, out):
    return alpha * y + (beta * _f64(out) if beta != 0 else 0)


def _norm_forward(x, reduced, w, b, z, eps, rms, activation):
    """(pre-activation output, mean, rstd, biased variance) with stats keeping reduced dims."""
    x = _f64(x)
    mean = torch.zeros_like(x.mean(reduced, keepdim=True)) if rms else x.mean(reduced, True)
    var = ((x - mean) ** 2).mean(reduced, keepdim=True)
    rstd = 1.0 / torch.sqrt(var + eps)
    y = (x - mean) * rstd
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    if z is not None:
        y = y + _f64(z)
    return _act(y, activation), mean, rstd, var


def _norm_backward(dy, x, mean, rstd, w, b, z, reduced, training, rms, activation):
    """(dx, dpre) by the closed form; mean, rstd broadcastable against x (float64)."""
    x, dy = _f64(x), _f64(dy)
    xhat = (x - mean) * rstd
    wv = w if w is not None else 1.0
    if activation == "relu":
        pre = xhat * wv + (b if b is not None else 0.0) + (_f64(z) if z is not None else 0.0)
        dy = dy * (pre > 0)
    g = dy * wv
    if not training:
        return rstd * g, dy
    c2 = (g * xhat).mean(reduced, keepdim=True)
    c1 = 0.0 if rms else g.mean(reduced, keepdim=True)
    return rstd * (g - c1 - xhat * c2), dy


def _bn_dims(x, mode):
    kept = [1] if mode == "spatial" else list(range(1, x.dim()))
    return kept, [d for d in range(x.dim()) if d not in kept]


def batch_norm_forward_training(
    x,
    weight=None,
    bias=None,
    *,
    running_mean=None,
    running_var=None,
    momentum=0.1,
    eps=1e-5,
    mode="spatial",
    z=None,
    activation="identity",
    alpha=1.0,
    beta=0.0,
    out=None,
):
    """Returns (y, saved_mean, saved_invstd, new_running_mean, new_running_var); the running
    statistics are returned updated (None without them), not changed in place."""
    kept, red = _bn_dims(x, mode)
    w, b = _bcast(weight, kept, x.dim()), _bcast(bias, kept, x.dim())
    y, mean, rstd, var = _norm_forward(x, red, w, b, z, eps, False, activation)
    n = x.numel() // math.prod(x.shape[d] for d in kept)
    new_rm = new_rv = None
    if running_mean is not None:
        new_rm = (1 - momentum) * _f64(running_mean) + momentum * mean.reshape(running_mean.shape)
        unbiased = (var * n / (n - 1)).reshape(running_var.shape)
        new_rv = (1 - momentum) * _f64(running_var) + momentum * unbiased
    shape = [x.shape[d] for d in kept]
    return (_scaled(y, alpha, beta, out), mean.reshape(shape), rstd.reshape(shape), new_rm, new_rv)


def batch_norm_forward_inference(
    x,
    weight,
    bias,
    running_mean,
    running_var,
    *,
    eps=1e-5,
    mode="spatial",
    z=None,
    activation="identity",
    alpha=1.0,
    beta=0.0,
    out=None,
):
    kept, _ = _bn_dims(x, mode)
    nd = x.dim()
    y = (_f64(x) - _bcast(running_mean, kept, nd)) / torch.sqrt(_bcast(running_var, kept, nd) + eps)
    if weight is not None:
        y = y * _bcast(weight, kept, nd)
    if bias is not None:
        y = y + _bcast(bias, kept, nd)
    if z is not None:
        y = y + _f64(z)
    return _scaled(_act(y, activation), alpha, beta, out)


def batch_norm_backward(
    dy,
    x,
    saved_mean,
    saved_invstd,
    weight=None,
    bias=None,
    *,
    z=None,
    activation="identity",
    mode="spatial",
    training=True,
    alpha=1.0,
    beta=0.0,
    out=None,
):
    """Returns (dx, dweight, dbias, dz or None)."""
    kept, red = _bn_dims(x, mode)
    nd = x.dim()
    mean, rstd = _bcast(saved_mean, kept, nd), _bcast(saved_invstd, kept, nd)
    w, b = _bcast(weight, kept, nd), _bcast(bias, kept, nd)
    dx, dpre = _norm_backward(dy, x, mean, rstd, w, b, z, red, training, False, activation)
    xhat = (_f64(x) - mean) * rstd
    shape = [x.shape[d] for d in kept]
    dw = (dpre * xhat).sum(red).reshape(shape)
    db = dpre.sum(red).reshape(shape)
    return _scaled(dx, alpha, beta, out), dw, db, (dpre if z is not None else None)


def _ln_dims(x, normalized_shape):
    n = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    return list(range(x.dim() - n)), list(range(x.dim() - n, x.dim()))


def layer_norm_forward(
    x,
    normalized_shape,
    weight=None,
    bias=None,
    *,
    eps=1e-5,
    alpha=1.0,
    beta=0.0,
    out=None,
    _rms=False,
):
    """Returns (y, mean, rstd), mean and rstd of shape x.shape[:-len(normalized_shape)]."""
    lead, red = _ln_dims(x, normalized_shape)
    w, b = _bcast(weight, red, x.dim()), _bcast(bias, red, x.dim())
    y, mean, rstd, _ = _norm_forward(x, red, w, b, None, eps, _rms, "identity")
    shape = [x.shape[d] for d in lead]
    return _scaled(y, alpha, beta, out), mean.reshape(shape), rstd.reshape(shape)


def _ln_backward(dy, x, normalized_shape, mean, rstd, weight, param_grads, alpha, beta, out, rms):
    lead, red = _ln_dims(x, normalized_shape)
    shape = [x.shape[d] for d in lead] + [1] * len(red)
    mean = 0.0 if rms else _f64(mean).reshape(shape)
    rstd = _f64(rstd).reshape(shape)
    w = _bcast(weight, red, x.dim())
    dx, dpre = _norm_backward(dy, x, mean, rstd, w, None, None, red, True, rms, "identity")
    dw = db = None
    if param_grads:
        xhat = (_f64(x) - mean) * rstd
        dw = (dpre * xhat).sum(lead) if lead else dpre * xhat
        db = dpre.sum(lead) if lead else dpre
    return _scaled(dx, alpha, beta, out), dw, db


def layer_norm_backward(
    dy,
    x,
    normalized_shape,
    mean,
    rstd,
    weight=None,
    *,
    param_grads=True,
    alpha=1.0,
    beta=0.0,
    out=None,
):
    """Returns (dx, dweight, dbias)."""
    return _ln_backward(
        dy, x, normalized_shape, mean, rstd, weight, param_grads, alpha, beta, out, False
    )


def rms_norm_forward(x, normalized_shape, weight=None, *, eps=None, alpha=1.0, beta=0.0, out=None):
    """Returns (y, rstd)."""
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    y, _, rstd = layer_norm_forward(
        x, normalized_shape, weight, None, eps=eps, alpha=alpha, beta=beta, out=out, _rms=True
    )
    return y, rstd


def rms_norm_backward(
    dy, x, normalized_shape, rstd, weight=None, *, param_grads=True, alpha=1.0, beta=0.0, out=None
):
    """Returns (dx, dweight)."""
    dx, dw, _ = _ln_backward(
        dy, x, normalized_shape, None, rstd, weight, param_grads, alpha, beta, out, True
    )
    return dx, dw


def group_norm_forward(
    x, num_groups, weight=None, bias=None, *, eps=1e-5, alpha=1.0, beta=0.0, out=None
):
    """Returns (y, mean, rstd), mean and rstd of shape (N, num_groups)."""
    n, c = x.shape[:2]
    xg = _f64(x).reshape(n, num_groups, -1)
    y, mean, rstd, _ = _norm_forward(xg, [2], None, None, None, eps, False, "identity")
    y = y.reshape(x.shape)
    if weight is not None:
        y = y * _bcast(weight, [1], x.dim())
    if bias is not None:
        y = y + _bcast(bias, [1], x.dim())
    return _scaled(y, alpha, beta, out), mean.reshape(n, num_groups), rstd.reshape(n, num_groups)


def group_norm_backward(
    dy, x, num_groups, mean, rstd, weight=None, *, param_grads=True, alpha=1.0, beta=0.0, out=None
):
    """Returns (dx, dweight, dbias)."""
    n, c = x.shape[:2]
    g = num_groups
    x5 = _f64(x).reshape(n, g, c // g, -1)
    dy5 = _f64(dy).reshape(n, g, c // g, -1)
    m, r = _f64(mean).reshape(n, g, 1, 1), _f64(rstd).reshape(n, g, 1, 1)
    w = _f64(weight).reshape(1, g, c // g, 1) if weight is not None else None
    dx, dpre = _norm_backward(dy5, x5, m, r, w, None, None, [2, 3], True, False, "identity")
    dw = db = None
    if param_grads:
        dw = (dpre * (x5 - m) * r).sum((0, 3)).reshape(c)
        db = dpre.sum((0, 3)).reshape(c)
    return _scaled(dx.reshape(x.shape), alpha, beta, out), dw, db


def instance_norm_forward(x, weight=None, bias=None, *, eps=1e-5, alpha=1.0, beta=0.0, out=None):
    return group_norm_forward(x, x.shape[1], weight, bias, eps=eps, alpha=alpha, beta=beta, out=out)


def instance_norm_backward(
    dy, x, mean, rstd, weight=None, *, param_grads=True, alpha=1.0, beta=0.0, out=None
):
    return group_norm_backward(
        dy,
        x,
        x.shape[1],
        mean,
        rstd,
        weight,
        param_grads=param_grads,
        alpha=alpha,
        beta=beta,
        out=out,
    )
