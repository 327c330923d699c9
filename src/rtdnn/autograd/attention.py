"""Scaled-dot-product attention as custom ops with autograd, and its differentiable function.

The forward op returns the output and the per-row log-sum-exp; the backward recomputes the
scores from the log-sum-exp (nothing of size L x S is saved), and the dropout mask from the
seed, a 0-d int64 CPU tensor (as dropout's, so that torch.compile traces a fresh one per call).
The mask gets no gradient: a mask that requires grad is refused rather than silently left
without one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ..core import not_supported
from ..ops import attention as A
from ._custom_op import custom_op, public, records_grad


@custom_op("rtdnn::attention_forward")
def attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float,
    enable_gqa: bool,
    dropout_p: float,
    seed: Tensor,
) -> tuple[Tensor, Tensor]:
    return A.attention_forward(
        q, k, v, attn_mask, is_causal, scale, enable_gqa, dropout_p, int(seed.item())
    )


@attention_forward.register_fake
def _(q, k, v, attn_mask, is_causal, scale, enable_gqa, dropout_p, seed):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    return out, q.new_empty(q.shape[:-1], dtype=torch.float32)


@custom_op("rtdnn::attention_backward")
def attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    attn_mask: Tensor | None,
    is_causal: bool,
    scale: float,
    enable_gqa: bool,
    dropout_p: float,
    seed: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    return A.attention_backward(
        dout, q, k, v, out, lse, attn_mask, is_causal, scale, enable_gqa, dropout_p,
        int(seed.item()),
    )  # fmt: skip


@attention_backward.register_fake
def _(dout, q, k, v, out, lse, attn_mask, is_causal, scale, enable_gqa, dropout_p, seed):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    q, k, v, attn_mask, ctx.is_causal, ctx.scale, ctx.enable_gqa, ctx.dropout_p, seed = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, attn_mask, seed)


def _backward(ctx, dout, _dlse=None):
    q, k, v, out, lse, attn_mask, seed = ctx.saved_tensors
    dq, dk, dv = attention_backward(
        dout, q, k, v, out, lse, attn_mask, ctx.is_causal, ctx.scale, ctx.enable_gqa,
        ctx.dropout_p, seed,
    )  # fmt: skip
    return dq, dk, dv, None, None, None, None, None, None


attention_forward.register_autograd(_backward, setup_context=_setup)


@public(ops.scaled_dot_product_attention)
def scaled_dot_product_attention_api(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    seed: int | None = None,
) -> Tensor:
    s = A.check_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    p = float(dropout_p)
    seed = A.resolve_seed(p, seed)
    args = (query, key, value, attn_mask, is_causal, s, enable_gqa, p)
    if not records_grad(query, key, value, attn_mask):
        return A.attention_forward(*args, seed)[0]
    if attn_mask is not None and attn_mask.requires_grad:
        raise not_supported(
            "attn_mask.requires_grad", True, "attention gives no gradient to the mask"
        )
    return attention_forward(*args, torch.tensor(seed, dtype=torch.int64))[0]
