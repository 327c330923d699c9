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
    """Max: PyTorch's autograd of max_pool (its tie routing: first max in scan order).
    Average: autograd of the float64 forward above."""
    x64 = _f64(x).requires_grad_(True)
    if mode == "max":
        nd = x.dim() - 2
        stride = window if stride is None else stride
        y64 = _MAXPOOL[x.dim()](x64, _ntuple(window, nd), _ntuple(stride, nd),
                                _ntuple(padding, nd), _ntuple(dilation, nd), ceil_mode)  # fmt: skip
    else:
        y64 = pooling_forward(x64, mode, window, stride=stride, padding=padding,
                              dilation=dilation, ceil_mode=ceil_mode)  # fmt: skip
    (dx,) = torch.autograd.grad(y64, x64, _f64(dy))
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
        v, i = t.min(-1) if op == "min" else t.max(-1)
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
