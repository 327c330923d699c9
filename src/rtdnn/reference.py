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


def conv_forward(
    x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation",
    alpha=1.0, beta=0.0, out=None, activation=None,
) -> torch.Tensor:  # fmt: skip
    y = _CONV[x.dim()](_f64(x), _filter(_f64(w), mode), None, stride, padding, dilation, groups)
    y = alpha * y
    if bias is not None:
        y = y + _f64(bias).view(1, -1, *([1] * (x.dim() - 2)))
    if beta != 0:
        y = y + beta * _f64(out)
    if activation == "relu":
        y = torch.relu(y)
    elif activation not in (None, "identity"):
        raise ValueError(f"no reference for activation {activation!r}")
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


# ===========================================================================================
# Memory-bound primitives. Same arguments as the rtdnn functions; float64 results on the CPU.
# ===========================================================================================


def _scaled(y: torch.Tensor, alpha: float, beta: float, out) -> torch.Tensor:
    y = alpha * y
    return y + beta * _f64(out) if beta != 0 else y


def _ntuple(v, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v


def _pool_windows(x64, window, stride, padding, dilation, ceil_mode):
    """Every window of x as explicit taps: (N, C, O1, K1, O2, K2, ...) values, and masks of
    taps inside the input and inside the padded input, built by index arithmetic."""
    nd = x64.dim() - 2
    window = _ntuple(window, nd)
    stride = window if stride is None else _ntuple(stride, nd)
    padding, dilation = _ntuple(padding, nd), _ntuple(dilation, nd)
    idx, inside, padded = [], [], []
    for i, size in enumerate(x64.shape[2:]):
        k, s, p, d = window[i], stride[i], padding[i], dilation[i]
        span = size + 2 * p - d * (k - 1) - 1
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= size + p:
            o -= 1
        pos = torch.arange(o)[:, None] * s - p + torch.arange(k)[None, :] * d  # (o, k)
        idx.append(pos.clamp(0, size - 1))
        inside.append((pos >= 0) & (pos < size))
        padded.append(pos < size + p)

    # Broadcast the per-dim (o, k) tables over the other dims: dim i -> axes (2i, 2i+1).
    def spread(t, i):
        shape = [1] * (2 * nd)
        shape[2 * i], shape[2 * i + 1] = t.shape
        return t.reshape(shape)

    taps = x64[(slice(None), slice(None), *(spread(t, i) for i, t in enumerate(idx)))]
    m_in = spread(inside[0], 0)
    m_pad = spread(padded[0], 0)
    for i in range(1, nd):
        m_in = m_in & spread(inside[i], i)
        m_pad = m_pad & spread(padded[i], i)
    return taps, m_in, m_pad, nd


def pooling_forward(x, mode, window, *, stride=None, padding=0, dilation=1, ceil_mode=False,
                    alpha=1.0, beta=0.0, out=None) -> torch.Tensor:  # fmt: skip
    """Float64 pooling by explicit window taps (dilation and ceil_mode for every mode)."""
    x64 = x.detach().to("cpu", torch.float64) if not x.requires_grad else x.to(torch.float64)
    taps, m_in, m_pad, nd = _pool_windows(x64, window, stride, padding, dilation, ceil_mode)
    k_axes = tuple(3 + 2 * i for i in range(nd))
    if mode == "max":
        y = taps.masked_fill(~m_in, float("-inf")).amax(dim=k_axes)
    else:
        count = (m_in if mode == "avg_exclude_pad" else m_pad).sum(
            dim=tuple(1 + 2 * i for i in range(nd))
        )
        y = (taps * m_in).sum(dim=k_axes) / count.clamp_min(1)
    return _scaled(y, alpha, beta, out)


_MAXPOOL = {3: F.max_pool1d, 4: F.max_pool2d, 5: F.max_pool3d}


def pooling_backward(dy, x, y, mode, window, *, stride=None, padding=0, dilation=1,
                     ceil_mode=False, alpha=1.0, beta=0.0, out=None) -> torch.Tensor:  # fmt: skip
    """Max: PyTorch's autograd of max_pool (its tie routing: first max in scan order), except
    that a window holding padding only (possible with dilation), whose output is -inf, passes
    no gradient: PyTorch routes it to an element outside the window. Average: autograd of the
    float64 forward above."""
    x64 = _f64(x).requires_grad_(True)
    dy64 = _f64(dy)
    if mode == "max":
        nd = x.dim() - 2
        stride = window if stride is None else stride
        args = (_ntuple(window, nd), _ntuple(stride, nd), _ntuple(padding, nd),
                _ntuple(dilation, nd), ceil_mode)  # fmt: skip
        y64 = _MAXPOOL[x.dim()](x64, *args)
        inside = _MAXPOOL[x.dim()](torch.ones_like(x64[:1, :1]), *args) == 1
        dy64 = torch.where(inside, dy64, 0.0)
    else:
        y64 = pooling_forward(x64, mode, window, stride=stride, padding=padding,
                              dilation=dilation, ceil_mode=ceil_mode)  # fmt: skip
    (dx,) = torch.autograd.grad(y64, x64, dy64)
    return _scaled(dx, alpha, beta, out)


_ADAPTIVE = {3: F.adaptive_avg_pool1d, 4: F.adaptive_avg_pool2d, 5: F.adaptive_avg_pool3d}


def adaptive_avg_pool(x, output_size, *, alpha=1.0, beta=0.0, out=None) -> torch.Tensor:
    return _scaled(_ADAPTIVE[x.dim()](_f64(x), output_size), alpha, beta, out)


def adaptive_avg_pool_backward(dy, x_shape, *, alpha=1.0, beta=0.0, out=None) -> torch.Tensor:
    x64 = torch.zeros(tuple(x_shape), dtype=torch.float64, requires_grad=True)
    y64 = _ADAPTIVE[len(x_shape)](x64, tuple(dy.shape[2:]))
    (dx,) = torch.autograd.grad(y64, x64, _f64(dy))
    return _scaled(dx, alpha, beta, out)


def _activation_fn(mode: str, coef):
    defaults = {"clipped_relu": 6.0, "hardtanh": (-1.0, 1.0), "elu": 1.0, "leaky_relu": 0.01,
                "swish": 1.0}  # fmt: skip
    c = defaults.get(mode) if coef is None else coef
    return {
        "identity": lambda t: t,
        "relu": F.relu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "clipped_relu": lambda t: t.clamp(0.0, c),
        "hardtanh": lambda t: F.hardtanh(t, c[0], c[1]) if c else t,
        "elu": lambda t: F.elu(t, c),
        "leaky_relu": lambda t: F.leaky_relu(t, c),
        "swish": lambda t: t * torch.sigmoid(c * t),
        "gelu": F.gelu,
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    }[mode]


def activation_forward(x, mode, *, coef=None, alpha=1.0, beta=0.0, out=None) -> torch.Tensor:
    return _scaled(_activation_fn(mode, coef)(_f64(x)), alpha, beta, out)


def activation_backward(dy, x, y, mode, *, coef=None, alpha=1.0, beta=0.0, out=None):
    """Derivatives at x (float64 autograd). Hardtanh/clipped ReLU pass the gradient strictly
    inside (lo, hi), as torch's hardtanh_backward; relu at 0 gives 0."""
    x64 = _f64(x).requires_grad_(True)
    f = _activation_fn(mode, coef)
    if mode in ("clipped_relu", "hardtanh"):
        lo, hi = (
            (0.0, 6.0 if coef is None else coef)
            if mode == "clipped_relu"
            else (coef or (-1.0, 1.0))
        )
        dx = _f64(dy) * ((x64 > lo) & (x64 < hi))
        return _scaled(dx.detach(), alpha, beta, out)
    (dx,) = torch.autograd.grad(f(x64), x64, _f64(dy))
    return _scaled(dx, alpha, beta, out)


def _softmax_rows(x64, mode):
    return x64.movedim(1, -1) if mode == "channel" else x64.reshape(x64.shape[0], -1)


def _softmax_back(r, shape, mode):
    return r.movedim(-1, 1) if mode == "channel" else r.reshape(shape)


def softmax_forward(x, *, algo="accurate", mode="channel", alpha=1.0, beta=0.0, out=None):
    x64 = _f64(x)
    rows = _softmax_rows(x64, mode)
    r = torch.log_softmax(rows, -1) if algo == "log" else torch.softmax(rows, -1)
    return _scaled(_softmax_back(r, x64.shape, mode), alpha, beta, out)


def softmax_backward(y, dy, *, algo="accurate", mode="channel", alpha=1.0, beta=0.0, out=None):
    y64, g = _softmax_rows(_f64(y), mode), _softmax_rows(_f64(dy), mode)
    if algo == "log":
        dx = g - torch.exp(y64) * g.sum(-1, keepdim=True)
    else:
        dx = y64 * (g - (g * y64).sum(-1, keepdim=True))
    return _scaled(_softmax_back(dx, _f64(y).shape, mode), alpha, beta, out)


def _lrn(x64, size, a, b, k):
    t = x64.contiguous()
    t = t.unsqueeze(-1) if t.dim() == 2 else t
    y = F.local_response_norm(t, size, a, b, k)
    return y.reshape(x64.shape)


def lrn_forward(x, size, *, lrn_alpha=1e-4, lrn_beta=0.75, lrn_k=1.0, alpha=1.0, beta=0.0,
                out=None) -> torch.Tensor:  # fmt: skip
    return _scaled(_lrn(_f64(x), size, lrn_alpha, lrn_beta, lrn_k), alpha, beta, out)


def lrn_backward(dy, x, y, size, *, lrn_alpha=1e-4, lrn_beta=0.75, lrn_k=1.0, alpha=1.0,
                 beta=0.0, out=None) -> torch.Tensor:  # fmt: skip
    x64 = _f64(x).requires_grad_(True)
    (dx,) = torch.autograd.grad(_lrn(x64, size, lrn_alpha, lrn_beta, lrn_k), x64, _f64(dy))
    return _scaled(dx, alpha, beta, out)


def philox_uniform(seed: int, index: torch.Tensor) -> torch.Tensor:
    """rtdnn's dropout uniform for int32 logical indices e: output e % 4 of Triton's
    tl.rand4x(seed, e // 4) (Philox4x32-10), re-implemented with numpy uint32 arithmetic."""
    import numpy as np

    e = index.numpy().astype(np.int64)
    mask = np.uint64(0xFFFFFFFF)
    c0 = (e // 4).astype(np.uint64) & mask
    c1 = np.zeros_like(c0)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0 = np.uint64(seed & 0xFFFFFFFF)
    k1 = np.uint64((seed >> 32) & 0xFFFFFFFF)
    a, b = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        p0, p2 = a * c0, b * c2  # < 2**64: exact in uint64
        c0, c1, c2, c3 = (
            ((p2 >> np.uint64(32)) ^ c1 ^ k0) & mask,
            p2 & mask,
            ((p0 >> np.uint64(32)) ^ c3 ^ k1) & mask,
            p0 & mask,
        )
        k0 = (k0 + np.uint64(0x9E3779B9)) & mask
        k1 = (k1 + np.uint64(0xBB67AE85)) & mask
    lane = e % 4
    r = np.select([lane == 0, lane == 1, lane == 2], [c0, c1, c2], c3)
    r = r.astype(np.uint32).view(np.int32).astype(np.int64)
    r = np.where(r < 0, -r - 1, r).astype(np.float32) * np.float32(4.6566127342e-10)
    return torch.from_numpy(r.astype(np.float32))


def dropout_mask(shape, p: float, seed: int) -> torch.Tensor:
    """The keep mask rtdnn's dropout uses: u(seed, row-major index) >= p (in float32)."""
    n = 1
    for s in shape:
        n *= s
    u = philox_uniform(seed, torch.arange(n, dtype=torch.int32)).reshape(tuple(shape))
    return u >= torch.tensor(p, dtype=torch.float32)


def dropout_forward(x, p, seed, *, alpha=1.0, beta=0.0, out=None) -> torch.Tensor:
    keep = dropout_mask(x.shape, p, seed)
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    return _scaled(_f64(x) * keep * scale, alpha, beta, out)


def dropout_backward(dy, p, seed, *, alpha=1.0, beta=0.0, out=None) -> torch.Tensor:
    return dropout_forward(dy, p, seed, alpha=alpha, beta=beta, out=out)


def add_tensor(a, c, *, alpha=1.0, beta=1.0) -> torch.Tensor:
    return alpha * _f64(a).expand(c.shape) + beta * _f64(c)


def op_tensor(a, b, op, *, alpha1=1.0, alpha2=1.0, beta=0.0, out=None) -> torch.Tensor:
    u = alpha1 * _f64(a)
    v = alpha2 * _f64(b).expand(a.shape) if b is not None else None
    y = {
        "add": lambda: u + v,
        "mul": lambda: u * v,
        "min": lambda: torch.minimum(u, v),
        "max": lambda: torch.maximum(u, v),
        "sqrt": lambda: torch.sqrt(u),
        "not": lambda: 1.0 - u,
    }[op]()
    return y + beta * _f64(out) if beta != 0 else y


def reduce_tensor(x, op, dims=None, *, keepdim=True, indices=False, alpha=1.0, beta=0.0,
                  out=None):  # fmt: skip
    """Values (and flat indices over the reduced dims, first extremum) in float64."""
    x64 = _f64(x)
    nd = x64.dim()
    dims = tuple(range(nd)) if dims is None else ((dims,) if isinstance(dims, int) else dims)
    red = sorted(d % nd for d in dims)
    kept = [d for d in range(nd) if d not in red]
    # Reduced dims last, in x's order, flattened: row-major flat index over them.
    flat = x64.permute(*kept, *red).reshape(*[x64.shape[d] for d in kept], -1)
    if op in ("add", "avg", "norm1", "norm2", "mul"):
        t = {"add": flat, "avg": flat, "norm1": flat.abs(), "norm2": flat * flat, "mul": flat}[op]
        v = t.prod(-1) if op == "mul" else t.sum(-1)
        v = v / flat.shape[-1] if op == "avg" else v.sqrt() if op == "norm2" else v
        i = None
    else:
        t = flat.abs() if op == "amax" else flat
        v = t.amin(-1) if op == "min" else t.amax(-1)  # NaN propagates
        # The first position holding the result (NaN matching NaN), whatever tie rule
        # torch.max follows on this device.
        hit = (t == v[..., None]) | (t.isnan() & v.isnan()[..., None])
        pos = torch.arange(t.shape[-1], device=t.device)
        i = torch.where(hit, pos, t.shape[-1]).amin(-1)
    full = [1 if d in red else s for d, s in enumerate(x64.shape)]
    v = v.reshape(full)
    i = i.reshape(full) if i is not None else None
    if not keepdim:
        v = v.squeeze(red) if red else v
        i = i.squeeze(red) if i is not None and red else i
    v = _scaled(v, alpha, beta, out)
    return (v, i) if indices else v


def transform_tensor(x, *, out=None, dtype=None, memory_format=None, alpha=1.0, beta=0.0):
    y = alpha * _f64(x)
    return y + beta * _f64(out) if beta != 0 else y


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
    """The normalizations' fused activation (kernels.norm_addressing.ACTIVATIONS)."""
    fn = {"relu": torch.relu, "silu": F.silu, "hardswish": F.hardswish}.get(activation)
    return fn(v) if fn is not None else v


def _act_grad(pre, dy, activation):
    """dy * act'(pre), with torch's values at the kinks."""
    if activation == "relu":
        return dy * (pre > 0)
    if activation == "silu":
        s = torch.sigmoid(pre)
        return dy * s * (1 + pre * (1 - s))
    if activation == "hardswish":
        return torch.where(pre < -3, 0.0, torch.where(pre <= 3, dy * (pre / 3 + 0.5), dy))
    return dy


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
    if activation != "identity":
        pre = xhat * wv + (b if b is not None else 0.0) + (_f64(z) if z is not None else 0.0)
        dy = _act_grad(pre, dy, activation)
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


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
    enable_gqa=False,
) -> torch.Tensor:  # fmt: skip
    """Attention without dropout (dropout_p must be 0): a boolean mask stays boolean."""
    if dropout_p:
        raise ValueError("the reference has no attention dropout")
    mask = attn_mask if attn_mask is None or attn_mask.dtype == torch.bool else _f64(attn_mask)
    mask = None if mask is None else mask.cpu()
    return F.scaled_dot_product_attention(
        _f64(query), _f64(key), _f64(value), attn_mask=mask, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa,
    )  # fmt: skip


# -- spatial transformer and CTC: torch's float64 implementations define the semantics ------
# These keep autograd (float64 inputs pass through unchanged), so tests differentiate them too.


def _f64_graph(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64)


def affine_grid(theta, size, align_corners=False) -> torch.Tensor:
    return torch.nn.functional.affine_grid(
        _f64_graph(theta), list(size), align_corners=align_corners
    )


def grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    return torch.nn.functional.grid_sample(
        _f64_graph(x), _f64_graph(grid), mode, padding_mode, align_corners=align_corners
    )


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
             zero_infinity=False) -> torch.Tensor:  # fmt: skip
    return torch.nn.functional.ctc_loss(
        _f64_graph(log_probs), targets, input_lengths, target_lengths, blank=blank,
        reduction=reduction, zero_infinity=zero_infinity,
    )  # fmt: skip


def squeeze_excitation(x, w1, b1, w2, b2, activation="relu", gate="sigmoid") -> torch.Tensor:
    """x * gate(act(mean(x) @ w1^T + b1) @ w2^T + b2), the means over x's spatial dims; a
    float64 graph (on the inputs' upcast copies, which keep requires_grad) for gradients."""
    x, w1, w2 = _f64_graph(x), _f64_graph(w1), _f64_graph(w2)
    b1 = None if b1 is None else _f64_graph(b1)
    b2 = None if b2 is None else _f64_graph(b2)
    s = x.mean(dim=tuple(range(2, x.dim())))
    h = {"relu": F.relu, "silu": F.silu}[activation](F.linear(s, w1.flatten(1), b1))
    z = F.linear(h, w2.flatten(1), b2)
    g = {"sigmoid": torch.sigmoid, "hardsigmoid": F.hardsigmoid}[gate](z)
    return x * g.reshape(*g.shape, *[1] * (x.dim() - 2))
