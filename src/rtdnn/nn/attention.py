"""Multi-head attention: a drop-in for torch.nn.MultiheadAttention with the same constructor,
parameters, state_dict keys and forward, computed by rtdnn.

The input and output projections run through rtdnn's linear, the attention through
rtdnn.scaled_dot_product_attention (one fused kernel; key_padding_mask and attn_mask are merged
into its one mask, as torch merges them). Shapes as torch's: query (L, N, E), key (S, N, kdim),
value (S, N, vdim), or (N, L, E) ... with batch_first, or unbatched (L, E), (S, kdim),
(S, vdim); key_padding_mask (N, S) or (S,); attn_mask (L, S) or (N * num_heads, L, S), boolean
(True = masked out) or additive. add_bias_kv and add_zero_attn append one key and value each,
and a column the masks leave open.

need_weights=True (torch's default) also returns the attention weights, softmax(q k^T * scale +
mask) per head, averaged over the heads with average_attn_weights: they are computed apart
from the fused kernel (which never forms them), so need_weights=False is the fast call. A query
whose keys are all masked gets zeros from the attention (so out_proj's bias as its output), as
torch's need_weights=False path gives, and NaN weights, as torch's (whose need_weights=True
path then gives a NaN output too).

Dropout applies in training only, inside the attention, with a seed drawn from torch's default
generator per call (torch.manual_seed repeats a run); the weights returned with
need_weights=True carry the same dropout as the output (torch returns its dropped weights
too), from rtdnn.attention_dropout_mask with that seed. The mask is rtdnn's own: torch's
module with the same seed drops other elements.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import autograd
from ..core import SUPPORTED_DTYPES, bad_param, not_supported
from ..ops.attention import attention_dropout_mask, resolve_seed
from ._inputs import check_dtype
from .conv import autocast_inputs


def _linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    x, w, b = autocast_inputs(x, w, b)
    return autograd.linear(x, w, b, None)


def _chunk(b: Tensor | None, i: int, n: int) -> Tensor | None:
    return None if b is None else b.chunk(n)[i]


class MultiheadAttention(torch.nn.MultiheadAttention):
    """torch.nn.MultiheadAttention computed by rtdnn (same arguments, parameters and
    state_dict keys; see the module docstring)."""

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """(attn_output, attn_weights or None) as torch's forward returns them."""
        batched = self._check_inputs(query, key, value)
        self._check_masks(query, key, key_padding_mask, attn_mask, batched)
        if not isinstance(is_causal, bool):
            raise bad_param("is_causal", is_causal, "a bool")
        if is_causal and attn_mask is None:
            raise bad_param(
                "is_causal", True,
                "attn_mask too: is_causal is a hint that attn_mask is the causal mask (as torch's)",
            )  # fmt: skip
        dropout_p = float(self.dropout) if self.training else 0.0
        seed = resolve_seed(dropout_p, None)

        q, k, v = self._project(query, key, value)
        if not batched:  # as a batch of one, batch first
            q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        batch_first = self.batch_first or not batched
        seq = 1 if batch_first else 0
        n = q.shape[1 - seq]
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.to(k.dtype).expand_as(k.narrow(seq, 0, 1))], seq)
            v = torch.cat([v, self.bias_v.to(v.dtype).expand_as(v.narrow(seq, 0, 1))], seq)
        q, k, v = (self._heads(t, batch_first) for t in (q, k, v))  # (N, H, L or S, D)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros((*k.shape[:2], 1, k.shape[3]))], 2)
            v = torch.cat([v, v.new_zeros((*v.shape[:2], 1, v.shape[3]))], 2)

        # torch's is_causal hint goes to the attention only when no other mask is needed;
        # otherwise attn_mask (which it describes) is used.
        causal = is_causal and key_padding_mask is None and not need_weights
        extra = (self.bias_k is not None) + bool(self.add_zero_attn)
        mask = _merged_mask(
            None if causal else attn_mask, key_padding_mask, n, self.num_heads, extra
        )
        out = autograd.scaled_dot_product_attention_api(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal, seed=seed
        )
        # (N, H, L, D) to (N, L, E) or (L, N, E), then the output projection.
        out = out.permute((0, 2, 1, 3) if batch_first else (2, 0, 1, 3)).flatten(2)
        out = _linear(out, self.out_proj.weight, self.out_proj.bias)
        weights = None
        if need_weights:
            weights = _weights(q, k, mask, average_attn_weights, dropout_p, seed)
        if not batched:
            out = out.squeeze(0)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, ...]:
        """The input projections, in the inputs' layout. Self-attention (one tensor for all
        three) is one GEMM with in_proj_weight, and key-is-value attention two."""
        b = self.in_proj_bias
        if not self._qkv_same_embed_dim:
            return (
                _linear(query, self.q_proj_weight, _chunk(b, 0, 3)),
                _linear(key, self.k_proj_weight, _chunk(b, 1, 3)),
                _linear(value, self.v_proj_weight, _chunk(b, 2, 3)),
            )
        w, e = self.in_proj_weight, self.embed_dim
        if query is key and key is value:
            return _linear(query, w, b).chunk(3, -1)
        q = _linear(query, w[:e], _chunk(b, 0, 3))
        if key is value:
            bkv = None if b is None else b[e:]
            return (q, *_linear(key, w[e:], bkv).chunk(2, -1))
        k = _linear(key, w[e : 2 * e], _chunk(b, 1, 3))
        return q, k, _linear(value, w[2 * e :], _chunk(b, 2, 3))

    def _heads(self, t: Tensor, batch_first: bool) -> Tensor:
        """(N, L, E) or (L, N, E) as an (N, H, L, D) view."""
        t = t if batch_first else t.transpose(0, 1)
        return t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> bool:
        """Validate query, key and value (as torch's forward does, by rtdnn.Error); return
        whether they are batched."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor):
                raise bad_param(name, type(t).__name__, "a torch.Tensor")
            check_dtype(self, t, name)
        if query.dim() not in (2, 3):
            raise bad_param(
                "query.dim()", query.dim(), "2 (unbatched (L, E)) or 3 (batched), got "
                f"query of size {list(query.shape)}",
            )  # fmt: skip
        for name, t, size in (
            ("query", query, self.embed_dim),
            ("key", key, self.kdim),
            ("value", value, self.vdim),
        ):
            if t.dim() != query.dim():
                raise bad_param(f"{name}.dim()", t.dim(), f"{query.dim()}, as query's")
            if t.shape[-1] != size:
                what = {"query": "embed_dim", "key": "kdim", "value": "vdim"}[name]
                raise bad_param(f"{name}.shape", tuple(t.shape), f"(..., {size}): {what}")
            if t.dtype != query.dtype:
                raise bad_param(f"{name}.dtype", t.dtype, f"{query.dtype}, as query's")
            if t.device != query.device:
                raise bad_param(f"{name}.device", t.device, f"{query.device}, as query's")
            if t.numel() == 0:
                raise not_supported(
                    f"{name}.shape", tuple(t.shape), "zero-sized dims: the attention takes none"
                )
        batched = query.dim() == 3
        seq = 1 if self.batch_first and batched else 0
        if value.shape[seq] != key.shape[seq]:
            raise bad_param("value.shape", tuple(value.shape), f"{key.shape[seq]} keys (key's)")
        if batched:
            for name, t in (("key", key), ("value", value)):
                if t.shape[1 - seq] != query.shape[1 - seq]:
                    raise bad_param(
                        f"{name}.shape", tuple(t.shape),
                        f"batch {query.shape[1 - seq]} in dim {1 - seq} (query's)",
                    )  # fmt: skip
        weight = self.in_proj_weight if self._qkv_same_embed_dim else self.q_proj_weight
        if not torch.is_autocast_enabled(query.device.type) and query.dtype != weight.dtype:
            raise bad_param(
                "query.dtype", query.dtype, f"{weight.dtype}, the dtype of the module's parameters"
            )
        return batched

    def _check_masks(
        self,
        query: Tensor,
        key: Tensor,
        key_padding_mask: Tensor | None,
        attn_mask: Tensor | None,
        batched: bool,
    ) -> None:
        """Validate the masks' types and shapes against the inputs (torch's rules)."""
        seq = 1 if self.batch_first and batched else 0
        lq, lk = query.shape[seq], key.shape[seq]
        n = query.shape[1 - seq] if batched else 1
        shapes = {
            "key_padding_mask": [(n, lk)] if batched else [(lk,)],
            "attn_mask": [(lq, lk), (n * self.num_heads, lq, lk)],
        }
        for name, mask in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
            if mask is None:
                continue
            if not isinstance(mask, Tensor):
                raise bad_param(name, type(mask).__name__, "a torch.Tensor or None")
            if mask.dtype != torch.bool and mask.dtype not in SUPPORTED_DTYPES:
                raise bad_param(
                    f"{name}.dtype", mask.dtype, "bool (True = masked out) or an additive "
                    "float32, float16 or bfloat16 mask",
                )  # fmt: skip
            if tuple(mask.shape) not in shapes[name]:
                expected = " or ".join(str(s) for s in shapes[name])
                raise bad_param(f"{name}.shape", tuple(mask.shape), expected)
            if mask.device != query.device:
                raise bad_param(f"{name}.device", mask.device, f"{query.device}, as query's")
            if mask.requires_grad:
                raise not_supported(
                    f"{name}.requires_grad", True, "attention gives no gradient to the masks"
                )


def _masked(mask: Tensor, extra: int) -> Tensor:
    """torch's convention (bool True = masked out, or additive) as an additive float32 mask,
    with `extra` open columns appended (the bias and zero keys)."""
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, device=mask.device).masked_fill(mask, float("-inf"))
    else:
        mask = mask.float()
    return torch.nn.functional.pad(mask, (0, extra)) if extra else mask


def _merged_mask(
    attn_mask: Tensor | None, key_padding_mask: Tensor | None, n: int, heads: int, extra: int
) -> Tensor | None:
    """key_padding_mask (N, S) and attn_mask ((L, S) or (N * H, L, S)) as one mask for the
    attention, broadcastable to (N, H, L, S + extra): boolean (True = takes part) when both are
    boolean, else additive float32 (a boolean one as 0 / -inf), their sum as torch adds them."""
    masks = []
    if attn_mask is not None:
        masks.append(attn_mask if attn_mask.dim() == 2 else attn_mask.unflatten(0, (n, heads)))
    if key_padding_mask is not None:
        masks.append(key_padding_mask[:, None, None, :])
    if not masks:
        return None
    if all(m.dtype == torch.bool for m in masks):
        out = masks[0] if len(masks) == 1 else masks[0] | masks[1]
        return torch.nn.functional.pad(~out, (0, extra), value=True) if extra else ~out
    out = _masked(masks[0], extra)
    return out if len(masks) == 1 else out + _masked(masks[1], extra)


def _weights(
    q: Tensor, k: Tensor, mask: Tensor | None, average: bool, dropout_p: float, seed: int
) -> Tensor:
    """softmax(q k^T * scale + mask) per head, (N, H, L, S), with the attention's dropout
    (the same mask, from the seed), averaged over H if `average`.

    The scores go through torch.matmul: rtdnn's linear takes one weight matrix, not a batch
    of them, and a loop of GEMMs per (batch, head) would be far slower. They are formed in
    float32, as the fused kernel accumulates them; the softmax is rtdnn's."""
    n, h, lq, d = q.shape
    scores = (q.float() * d**-0.5) @ k.float().transpose(-2, -1)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask
    s = scores.shape[-1]
    weights = autograd.softmax_forward(scores.reshape(-1, s), "accurate", "channel")
    weights = weights.view(n, h, lq, s)
    if dropout_p > 0.0:
        keep = attention_dropout_mask((n, h, lq, s), dropout_p, seed, q.device)
        weights = weights * keep / (1.0 - dropout_p)
    weights = weights.to(q.dtype)
    return weights.mean(1) if average else weights
