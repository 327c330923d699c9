"""The correctness self-check `rtdnn bench` runs on a machine without a GPU: every primitive on
tiny shapes against its float64 reference, through Triton's interpreter (or compiled, on a GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import ops
from .. import reference as R
from . import conv, norm

Check = tuple[str, float, bool]


def _check(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float = 1e-5) -> Check:
    err = R.rel_error(out, ref)
    return name, err, err < tol


def primitives() -> list[Check]:
    """Pooling, activations, softmax, LRN, dropout, tensor ops, linear and cross-entropy."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    x = torch.randn(2, 6, 7, 5, device=device).to(memory_format=torch.channels_last)
    results = []
    for mode in ("max", "avg_include_pad", "avg_exclude_pad"):
        args = dict(stride=2, padding=1)
        y = ops.pooling_forward(x, mode, 3, **args)
        results.append(_check(f"pooling {mode} forward", y, R.pooling_forward(x, mode, 3, **args)))
        dy = torch.randn_like(y)
        dx = ops.pooling_backward(dy, x, y, mode, 3, **args)
        ref = R.pooling_backward(dy, x, y, mode, 3, **args)
        results.append(_check(f"pooling {mode} backward", dx, ref))
    for mode in ("relu", "sigmoid", "tanh", "elu", "swish", "gelu", "gelu_tanh"):
        y = ops.activation_forward(x, mode)
        results.append(_check(f"activation {mode} forward", y, R.activation_forward(x, mode)))
        dy = torch.randn_like(x)
        dx = ops.activation_backward(dy, x, y, mode)
        ref = R.activation_backward(dy, x, y, mode)
        results.append(_check(f"activation {mode} backward", dx, ref))
    for algo in ("fast", "accurate", "log"):
        for mode in ("channel", "instance"):
            y = ops.softmax_forward(x, algo=algo, mode=mode)
            ref = R.softmax_forward(x, algo=algo, mode=mode)
            results.append(_check(f"softmax {algo} {mode} forward", y, ref))
            dy = torch.randn_like(x)
            dx = ops.softmax_backward(y, dy, algo=algo, mode=mode)
            ref = R.softmax_backward(y, dy, algo=algo, mode=mode)
            results.append(_check(f"softmax {algo} {mode} backward", dx, ref))
    y = ops.lrn_forward(x, 3, lrn_k=2.0)
    results.append(_check("lrn forward", y, R.lrn_forward(x, 3, lrn_k=2.0)))
    dy = torch.randn_like(x)
    dx = ops.lrn_backward(dy, x, y, 3, lrn_k=2.0)
    results.append(_check("lrn backward", dx, R.lrn_backward(dy, x, y, 3, lrn_k=2.0)))
    y = ops.dropout_forward(x, 0.3, 1234)
    results.append(_check("dropout forward", y, R.dropout_forward(x, 0.3, 1234)))
    dx = ops.dropout_backward(dy, 0.3, 1234)
    results.append(_check("dropout backward", dx, R.dropout_backward(dy, 0.3, 1234)))
    results.append(_check("op_tensor mul", ops.op_tensor(x, dy, "mul"), R.op_tensor(x, dy, "mul")))
    red = ops.reduce_tensor(x, "norm2", (0, 2, 3))
    results.append(_check("reduce_tensor norm2", red, R.reduce_tensor(x, "norm2", (0, 2, 3))))
    w, b = torch.randn(4, 5, device=device), torch.randn(4, device=device)
    xl = x.reshape(-1, 5)
    y = ops.linear(xl, w, b, math="fp32")
    results.append(_check("linear", y, xl.double() @ w.double().T + b.double()))
    logits = torch.randn(9, 6, device=device)
    target = torch.randint(0, 6, (9,), device=device)
    loss = ops.cross_entropy(logits, target, label_smoothing=0.1)
    ref = F.cross_entropy(logits.double(), target, label_smoothing=0.1)
    results.append(_check("cross_entropy", loss, ref))
    return results


def run_all() -> list[Check]:
    return conv.self_check() + norm.self_check() + primitives()
