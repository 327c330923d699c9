"""Scaled-dot-product attention: the public functional API.

torch.nn.functional.scaled_dot_product_attention's semantics:

    out = softmax(q @ k^T * scale + mask) @ v

q: (N, Hq, L, E) or (N, L, E); k: (N, Hk, S, E) or (N, S, E); v: (N, Hk, S, Ev) or (N, S, Ev);
out: (N, Hq, L, Ev) (or (N, L, Ev)), contiguous, in q's dtype. Any strides; float32, float16,
bfloat16; head sizes E and Ev up to 256. scale defaults to 1 / sqrt(E).

attn_mask broadcasts to (N, Hq, L, S): boolean (True = take part) or additive (q's dtype or
float32). is_causal masks key j for query i when j > i (top-left aligned, as torch's is_causal,
also when L != S). enable_gqa lets Hq be a multiple of Hk: query head h uses key/value head
h // (Hq / Hk). A query row whose keys are all masked gives zeros (and zero gradients), as
torch does.

The forward also returns the per-row log-sum-exp the backward recomputes the scores from.

dropout_p > 0 drops attention probabilities with a counter-based mask drawn from `seed` (by
default a fresh one from torch's default CPU generator, so torch.manual_seed makes runs
repeat), scaling the kept ones by 1 / (1 - dropout_p); the backward draws the same mask again
from the seed. `attention_dropout_mask` returns the mask a seed gives. The mask is rtdnn's own
(torch's dropout draws differ).
"""

from __future__ import annotations

import math

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ..algos.geometry import multiprocessor_count
from ..core import (
    INTERPRETED,
    bad_param,
    cdiv,
    check_tensor,
    default_matmul_math_mode,
    not_supported,
    tma_aligned,
)
from ..core.prepared import PreparedCalls, signature
from ..kernels import attention as K
from ..kernels.launch import launch_cached, slot_launch
from ._common import check_real

#: Checked call signatures -> prepared calls (core.prepared), and those checked alone.
_calls = PreparedCalls()
_checked = PreparedCalls()

MAX_HEAD_SIZE = 256


def check_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> float:
    """Validate every argument (nothing runs before this); return the resolved scale. What
    the tensors' shapes, dtypes and devices decide is checked once per call signature."""
    key = signature("check_attention", (q, k, v, attn_mask), is_causal, enable_gqa)
    _checked.get(key, lambda: _check_tensors(q, k, v, attn_mask, is_causal, enable_gqa))
    dropout_p = check_real("dropout_p", dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise bad_param("dropout_p", dropout_p, "a probability in [0, 1)")
    if dropout_p > 0.0 and q.shape[-2] * k.shape[-2] >= 2**31:
        raise not_supported(
            "dropout_p", dropout_p, "dropout where L x S < 2**31 (the mask's 32-bit counters)"
        )
    if scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    return check_real("scale", scale)


def _check_tensors(q, k, v, attn_mask, is_causal, enable_gqa) -> bool:
    """check_attention's checks of the tensors and flags; True when they pass."""
    check_tensor("query", q, ndim=(3, 4))
    check_tensor("key", k, ndim=q.dim(), dtype=q.dtype, device=q.device)
    check_tensor("value", v, ndim=q.dim(), dtype=q.dtype, device=q.device)
    if k.shape[-1] != q.shape[-1]:
        raise bad_param("key.shape", tuple(k.shape), f"head size {q.shape[-1]} (query's)")
    if v.shape[-2] != k.shape[-2]:
        raise bad_param("value.shape", tuple(v.shape), f"{k.shape[-2]} keys (key's)")
    for name, t in (("key", k), ("value", v)):
        if t.shape[0] != q.shape[0]:
            raise bad_param(f"{name}.shape", tuple(t.shape), f"batch {q.shape[0]} (query's)")
    for name, size in (("query", q.shape[-1]), ("value", v.shape[-1])):
        if size > MAX_HEAD_SIZE:
            raise not_supported(f"{name}.shape[-1]", size, f"head sizes up to {MAX_HEAD_SIZE}")
    if not isinstance(enable_gqa, bool):
        raise bad_param("enable_gqa", enable_gqa, "a bool")
    if not isinstance(is_causal, bool):
        raise bad_param("is_causal", is_causal, "a bool")
    if q.dim() == 4:
        hq, hk = q.shape[1], k.shape[1]
        if v.shape[1] != hk:
            raise bad_param("value.shape", tuple(v.shape), f"{hk} heads (key's)")
        if hq != hk:
            if not enable_gqa:
                raise bad_param(
                    "key.shape", tuple(k.shape), f"{hq} heads (query's), or enable_gqa=True"
                )
            if hq % hk:
                raise bad_param("enable_gqa", True, f"key heads ({hk}) dividing query heads ({hq})")
    if attn_mask is not None:
        if is_causal:
            raise bad_param("is_causal", True, "False when attn_mask is given (one or the other)")
        if not isinstance(attn_mask, torch.Tensor):
            raise bad_param("attn_mask", type(attn_mask).__name__, "a torch.Tensor or None")
        if attn_mask.dtype not in (torch.bool, q.dtype, torch.float32):
            raise bad_param("attn_mask.dtype", attn_mask.dtype, f"bool, {q.dtype} or float32")
        if attn_mask.device != q.device:
            raise bad_param("attn_mask.device", attn_mask.device, f"{q.device} (query's)")
        full = (*q.shape[:-1], k.shape[-2])
        try:
            ok = torch.broadcast_shapes(attn_mask.shape, full) == torch.Size(full)
        except RuntimeError:
            ok = False
        if not ok:
            raise bad_param("attn_mask.shape", tuple(attn_mask.shape), f"broadcastable to {full}")
    return True


def _as4(t: torch.Tensor) -> torch.Tensor:
    """(N, L, E) as (N, 1, L, E), a view."""
    return t if t.dim() == 4 else t.unsqueeze(1)


def _mask4(attn_mask: torch.Tensor | None, q: torch.Tensor, lk: int) -> torch.Tensor | None:
    """The mask as an additive (N, H, L, S) view with zero strides where it broadcasts; a
    boolean mask becomes 0 / -inf (in its own shape, not the broadcast one)."""
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=torch.float32, device=q.device).masked_fill(
            ~attn_mask, float("-inf")
        )
    return _as4(attn_mask.expand(*q.shape[:-1], lk))


def _config(q: torch.Tensor, e: int, ev: int) -> dict:
    block_d = max(16, triton.next_power_of_2(e))
    block_dv = max(16, triton.next_power_of_2(ev))
    if INTERPRETED:
        block = 16
    else:
        block = 64 if max(block_d, block_dv) <= 128 else 32
    if q.dtype == torch.float32 and default_matmul_math_mode() == "tf32" and not INTERPRETED:
        precision = "tf32"
    else:
        precision = "ieee"
    return dict(
        BLOCK_M=block,
        BLOCK_N=block,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        UPCAST=INTERPRETED,
        PRECISION=precision,
    )


def _forward_config(q: torch.Tensor, e: int, ev: int, extra_tiles: bool) -> dict:
    """The forward's tiles and launch: the backward's (_config) except for 16-bit inputs with
    head sizes up to 128 on the GPU, where 128 keys per block halve the rescales of the
    accumulator (DV multiplies per row and block) and the block-to-block synchronizations
    per score, and the rows per program are picked by what fits on a multiprocessor (H100):

    - heads up to 64: 64 rows and 4 warps (one warp group, Hopper's MMA unit), 2 stages:
      about 160 registers a thread and 75 KB of shared memory, so three programs share a
      multiprocessor and one's softmax overlaps another's MMAs (2-7% faster than 128 rows
      in 8 warps, whose two warp groups step through the key blocks together);
    - wider heads: 128 rows and 8 warps, 3 stages (230 KB, one program per multiprocessor),
      halving the key and value traffic per score (64-row programs, two per multiprocessor
      with 64 keys, measured no faster);
    - with an attention mask or dropout (extra_tiles), whose tiles would not fit beside
      128-key blocks in registers and shared memory: 128 rows, 64 keys, 8 warps, 3 stages."""
    cfg = _config(q, e, ev)
    head = max(cfg["BLOCK_D"], cfg["BLOCK_DV"])
    if INTERPRETED or q.dtype == torch.float32 or head > 128:
        return dict(cfg, num_warps=4, num_stages=3)
    if extra_tiles:
        return dict(cfg, BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    if head <= 64:
        return dict(cfg, BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2)
    return dict(cfg, BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)


def _tma_ready(t: torch.Tensor) -> bool:
    """Whether a host-side tensor descriptor can address t (4-D): the tensor memory accelerator
    wants a 16-byte aligned base, a unit last stride, the other strides multiples of 16
    bytes and no empty dimension."""
    size = t.element_size()
    return (
        t.data_ptr() % 16 == 0
        and t.stride(-1) == 1
        and all(s * size % 16 == 0 for s in t.stride()[:-1])
        and t.numel() > 0
    )


def _use_tma(q4, k4, v4, out, cfg: dict) -> bool:
    """Tensor descriptors (TMA) for the forward's tiles: on Hopper and later, 16-bit tensors
    in _forward_config's GPU tiles, every tensor TMA-addressable."""
    if INTERPRETED or not q4.is_cuda or q4.element_size() != 2:
        return False
    if max(cfg["BLOCK_D"], cfg["BLOCK_DV"]) > 128:  # _config's small tiles for wide heads
        return False
    if torch.cuda.get_device_capability(q4.device)[0] < 9:
        return False
    return all(_tma_ready(t) for t in (q4, k4, v4, out))


def _descriptor(t: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    """A descriptor of the (B, H, L, E) tensor t read or written in [1, 1, rows, cols] blocks."""
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, cols])


def _split(kernel, args: tuple, constants: dict) -> tuple[dict, dict, dict]:
    """A kernel's arguments as (changing, fixed, options): the tensors, tensor descriptors,
    scale, dropout probability and seed change from call to call; sizes, strides, tiles and
    flags are fixed for a problem; num_warps and num_stages are launch options."""
    if len(args) > len(kernel.arg_names):
        raise TypeError(f"{kernel.__name__}: {len(args)} positional arguments, more than it takes")
    named = dict(zip(kernel.arg_names, args, strict=False), **constants)
    changing = {
        name: value
        for name, value in named.items()
        if isinstance(value, torch.Tensor | TensorDescriptor)
        or name in ("sm_scale", "p_drop", "seed")
    }
    fixed = {name: value for name, value in named.items() if name not in changing}
    options = dict(num_warps=fixed.pop("num_warps", 4), num_stages=fixed.pop("num_stages", None))
    return changing, fixed, options


def _launch(kernel, grid: tuple[int, ...], *args, **constants) -> None:
    """kernel[grid](*args, **constants) through a launch kept per problem (launch_cached), for
    calls that keep no prepared launch of their own."""
    changing, fixed, options = _split(kernel, args, constants)
    launch_cached(kernel, grid, changing, **options, **fixed)


class _Launch:
    """One kernel of a prepared call: made from a first call's arguments (as _launch takes
    them), called with the changing ones by name. Holds no tensors."""

    def __init__(self, kernel, grid: tuple[int, ...], *args, **constants):
        changing, fixed, options = _split(kernel, args, constants)
        self.names = tuple(changing)
        self.launch = slot_launch(kernel, grid, self.names, **options, **fixed)

    def __call__(self, **changing) -> None:
        self.launch(*[changing[name] for name in self.names])


def _strides(t: torch.Tensor | None) -> tuple[int, ...]:
    return (0, 0, 0, 0) if t is None else tuple(t.stride())


def check_seed(seed: object) -> int:
    """A dropout seed: an int in [0, 2**62) (the kernels add the batch-head index to it)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**62:
        raise bad_param("seed", seed, "an int in [0, 2**62)")
    return seed


def resolve_seed(dropout_p: float, seed: object) -> int:
    """The dropout seed to use: `seed` checked, or without one and with dropout a fresh one
    from torch's default CPU generator (torch.manual_seed repeats it; no dropout, no draw)."""
    if seed is None:
        return int(torch.randint(0, 2**31 - 1, (), dtype=torch.int64)) if dropout_p > 0 else 0
    return check_seed(seed)


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    enable_gqa: bool,
    dropout_p: float = 0.0,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward on validated arguments (check_attention): (out, lse), lse float32 of shape
    q.shape[:-1], the base-2 log-sum-exp of each row's scaled scores (+inf for an empty row),
    taken before dropout. Tiles and launch are prepared once per call signature."""
    flags = (is_causal, dropout_p > 0, scale < 0, default_matmul_math_mode())
    key = signature("attention_forward", (q, k, v, attn_mask), *flags, tma_aligned(q, k, v))
    call = _calls.get(key, lambda: _forward_call(q, k, v, attn_mask, *flags[:3]))
    return call(q, k, v, attn_mask, scale, dropout_p, seed)


#: Head sizes the Hopper forward takes (kernels/attention_hopper.py).
HOPPER_HEAD_SIZES = (64, 128)


#: Keys from which the Hopper forward also takes head sizes of 64: below it the Triton kernel's
#: 64-row programs (three a multiprocessor) win. H200, bf16: at 197 keys (ViT-B/16) 0.102
#: against 0.174 ms, at 512 to 1024 keys 0.75 to 0.91 of torch against 0.58 to 0.86, even at
#: 2048, ahead from 4096 (0.93 to 1.02 against 0.93 to 0.96). At head size 128 the Hopper
#: kernel wins from 512 keys on (BENCHMARKS.md, "Attention forward on Hopper").
HOPPER_MIN_KEYS_AT_64 = 4096


def hopper_forward_fits(q4, k4, v4, has_mask: bool, dropout: bool, neg_scale: bool) -> bool:
    """Whether the warp-specialized Hopper forward (kernels/attention_hopper.py) takes these
    (B, H, L, E) tensors, the device aside: 16-bit, head sizes in HOPPER_HEAD_SIZES (64 only
    with HOPPER_MIN_KEYS_AT_64 keys or more), both lengths at least 1, every tensor
    TMA-addressable; no mask, dropout or negative scale."""
    e, ev, lk = q4.shape[-1], v4.shape[-1], k4.shape[2]
    return (
        q4.dtype in (torch.float16, torch.bfloat16)
        and e in HOPPER_HEAD_SIZES
        and ev in HOPPER_HEAD_SIZES
        and (max(e, ev) > 64 or lk >= HOPPER_MIN_KEYS_AT_64)
        and q4.shape[2] > 0
        and lk > 0
        and not (has_mask or dropout or neg_scale)
        and all(_tma_ready(t) for t in (q4, k4, v4))
    )


#: The Triton release whose Gluon (an experimental API, which changes between releases) the
#: Hopper forward is written for; with another the Triton kernel runs.
GLUON_TRITON = "3.6."


def _on_hopper(t: torch.Tensor) -> bool:
    """Whether t lives on a Hopper GPU (sm_90: the warp-group MMA the Gluon kernel uses) and
    Triton is the release the kernel is written for."""
    return (
        not INTERPRETED
        and t.is_cuda
        and triton.__version__.startswith(GLUON_TRITON)
        and torch.cuda.get_device_capability(t.device)[0] == 9
    )


def _forward_call(q, k, v, attn_mask, is_causal: bool, dropout: bool, neg_scale: bool):
    q4, k4, v4 = _as4(q), _as4(k), _as4(v)
    if _on_hopper(q4) and hopper_forward_fits(
        q4, k4, v4, attn_mask is not None, dropout, neg_scale
    ):
        return _hopper_forward_call(q, k, v, is_causal)
    n, h, lq, e = q4.shape
    lk, ev = k4.shape[2], v4.shape[3]
    out, lse = _forward_outputs(q, n, h, lq, ev)
    mask = _mask4(attn_mask, q, lk)
    cfg = _forward_config(q, e, ev, mask is not None or dropout)
    tma = _use_tma(q4, k4, v4, out, cfg)
    bm, bn, bd, bdv = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_D"], cfg["BLOCK_DV"]

    def operands(q4, k4, v4, out) -> tuple:
        """Q, K, V and the output as the kernel reads and writes them."""
        if not tma:
            return q4, k4, v4, out
        return (
            _descriptor(q4, bm, bd), _descriptor(k4, bn, bd), _descriptor(v4, bn, bdv),
            _descriptor(out, bm, bdv),
        )  # fmt: skip

    launch = _Launch(
        K.attention_forward_kernel, (cdiv(lq, bm), n * h), *operands(q4, k4, v4, out), lse,
        q4 if mask is None else mask, 1.0, 0.0, 0, h, lq, lk, e, ev, h // k4.shape[1],
        *q4.stride(), *k4.stride(), *v4.stride(), *out.stride(), *_strides(mask),
        HAS_MASK=mask is not None, CAUSAL=is_causal, DROPOUT=dropout, NEG_SCALE=neg_scale,
        TMA=tma, **cfg,
    )  # fmt: skip
    shape, lse_shape = (*q.shape[:-1], ev), tuple(q.shape[:-1])

    def call(q, k, v, attn_mask, scale, dropout_p, seed):
        q4, k4, v4 = _as4(q), _as4(k), _as4(v)
        out, lse = _forward_outputs(q, n, h, lq, ev)
        mask = _mask4(attn_mask, q, lk)
        tq, tk, tv, to = operands(q4, k4, v4, out)
        launch(
            Q=tq, K=tk, V=tv, OUT=to, LSE=lse, M=q4 if mask is None else mask, sm_scale=scale,
            p_drop=dropout_p, seed=seed,
        )  # fmt: skip
        return out.view(shape), lse.view(lse_shape)

    return call


def _forward_outputs(q, n: int, h: int, lq: int, ev: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's output (B, H, Lq, Ev) in q's dtype and its float32 lse (B, H, Lq)."""
    out = torch.empty((n, h, lq, ev), dtype=q.dtype, device=q.device)
    return out, torch.empty((n, h, lq), dtype=torch.float32, device=q.device)


def _hopper_forward_call(q, k, v, is_causal: bool):
    """The forward through the warp-specialized Hopper kernel, for calls hopper_forward_fits."""
    from ..kernels import attention_hopper as KH  # Gluon: imported where it runs

    q4, k4, v4 = _as4(q), _as4(k), _as4(v)
    n, h, lq, _ = q4.shape
    lk, ev = k4.shape[2], v4.shape[3]
    launch = slot_launch(
        KH.attention_forward_hopper_kernel, (cdiv(lq, 2 * KH.HALF_M), n * h),
        ("q_desc", "k_desc", "v_desc", "o_desc", "LSE", "sm_scale"), num_warps=4,
        maxnreg=KH.LAUNCH_REGISTERS, H=h, Lq=lq, Lk=lk, GROUP=h // k4.shape[1],
        CAUSAL=is_causal, STAGES=KH.STAGES, CONSUMER_REGS=KH.CONSUMER_REGISTERS,
    )  # fmt: skip
    shape, lse_shape = (*q.shape[:-1], ev), tuple(q.shape[:-1])

    def call(q, k, v, attn_mask, scale, dropout_p, seed):
        q4, k4, v4 = _as4(q), _as4(k), _as4(v)
        out, lse = _forward_outputs(q, n, h, lq, ev)
        launch(
            KH.descriptor(q4, KH.HALF_M), KH.descriptor(k4, KH.BLOCK_N),
            KH.descriptor(v4, KH.BLOCK_N), KH.descriptor(out, KH.HALF_M), lse, scale,
        )  # fmt: skip
        return out.view(shape), lse.view(lse_shape)

    return call


def _backward_config(
    q: torch.Tensor, e: int, ev: int, extra_tiles: bool, causal: bool
) -> tuple[dict, dict]:
    """The tiles and launches of the backward's two kernels, (dK/dV, dQ).

    float32, head sizes above 128 and the interpreter keep _config's square tiles. 16-bit
    inputs on the GPU take tiles per head size, picked by timing variants on an H100
    (benchmarks/probes/attention_backward_probe.py; one kernel's tiles changed at a time):

    - dK/dV holds its key block's K and V and two float32 accumulators through the loop over
      query blocks, so few query rows (32) per step. Heads up to 64: 64 keys in 4 warps
      (several programs per multiprocessor) without a causal mask, 128 keys in 8 warps and 4
      stages with one (whose programs' work is uneven: longer ones keep more in flight);
      wider heads: 64 rows x 128 keys in 8 warps, 5-15% faster than 32 rows although ptxas
      spills a little, and 3 stages (1.5-4% faster than 2 on an H200).
    - Causal dK/dV (SPLIT_DIAGONAL, every path): heads up to 64 run the diagonal's masked
      query blocks in their own loop, so the rest skip the mask; wider heads run one loop
      that masks every block, because the second loop made the sm_90 compile spill 308
      registers against 64 (dK/dV 5.54 -> 4.73 ms at N16 H16 L4096, head size 128, on an
      H200), while at head size 64 the one loop was 8-10% slower.
    - dQ holds one accumulator: 64 rows x 64 keys in 4 warps up to head size 64, 128 x 64 in
      8 warps and 3 stages above (5-12% faster than 2 stages).
    - With an attention mask or dropout (extra_tiles), whose tiles compete for registers:
      32 query rows for dK/dV, 32 keys for dQ on wide heads (not timed)."""
    cfg = _config(q, e, ev)
    head = max(cfg["BLOCK_D"], cfg["BLOCK_DV"])
    split = dict(SPLIT_DIAGONAL=head <= 64)
    if INTERPRETED or q.dtype == torch.float32 or head > 128:
        same = dict(cfg, num_warps=4, num_stages=3)
        return dict(same, **split), same
    if head <= 64:
        if causal:
            dkdv = dict(cfg, BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=4)
        else:
            dkdv = dict(cfg, BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3)
        dq = dict(cfg, BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    else:
        dkdv = dict(cfg, BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3)
        dq = dict(cfg, BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    if extra_tiles:
        dkdv = dict(dkdv, BLOCK_M=32)
        if head > 64:
            dq = dict(dq, BLOCK_N=32)
    return dict(dkdv, **split), dq


def _sum_group_in_kernel(q: torch.Tensor, n: int, hk: int, group: int, programs: int) -> bool:
    """Whether the dK/dV program of a key block sums its key/value head's whole group of query
    heads (in a fixed order: deterministic) rather than writing one float32 gradient per query
    head for the caller to add up (group - 1 extra reads and writes of the whole gradient, a
    third of the backward's time at group 4 on an H100). Always without a group; with one,
    unless that leaves too few programs (n * hk * key blocks) to fill the GPU twice over."""
    if group == 1 or INTERPRETED or not q.is_cuda:
        return True
    sms = multiprocessor_count(q.device.index)
    return n * hk * programs >= 2 * sms


def attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    enable_gqa: bool,
    dropout_p: float = 0.0,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) given the forward's out and lse, on validated arguments (the
    forward's dropout_p and seed). Tiles and launches are prepared once per call signature."""
    flags = (is_causal, dropout_p > 0, scale < 0, default_matmul_math_mode())
    tensors = (dout, q, k, v, out, lse, attn_mask)
    key = signature("attention_backward", tensors, *flags, tma_aligned(q, k, v, dout))
    call = _calls.get(key, lambda: _backward_call(*tensors, *flags[:3]))
    return call(*tensors, scale, dropout_p, seed)


def _backward_call(dout, q, k, v, out, lse, attn_mask, is_causal, dropout, neg_scale):
    q4, k4, v4, do4, out4 = _as4(q), _as4(k), _as4(v), _as4(dout), _as4(out)
    n, h, lq, e = q4.shape
    hk, lk, ev = k4.shape[1], k4.shape[2], v4.shape[3]
    group = h // hk
    lse = lse.reshape(n, h, lq).contiguous()
    mask = _mask4(attn_mask, q, lk)
    mask_arg = q4 if mask is None else mask
    dkdv_cfg, dq_cfg = _backward_config(q, e, ev, mask is not None or dropout, is_causal)
    bdv = dkdv_cfg["BLOCK_DV"]

    # The preprocessing step: delta_i = sum_j dO_ij O_ij = sum_j P_ij dP_ij.
    delta = torch.empty((n, h, lq), dtype=torch.float32, device=q.device)
    rows = 16 if INTERPRETED else max(16, 8192 // bdv)
    delta_launch = _Launch(
        K.attention_backward_delta_kernel, (cdiv(lq, rows), n * h), out4, do4, delta, h,
        lq, ev, *out4.stride(), *do4.stride(), BLOCK_M=rows, BLOCK_DV=bdv,
    )  # fmt: skip

    tma = _use_tma(q4, k4, v4, do4, dkdv_cfg)

    def operands(cfg: dict, q4, k4, v4, do4) -> tuple:
        """Q, K, V and dO as the kernel with these tiles reads them."""
        if not tma:
            return q4, k4, v4, do4
        bm, bn, bd = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_D"]
        return (
            _descriptor(q4, bm, bd), _descriptor(k4, bn, bd), _descriptor(v4, bn, bdv),
            _descriptor(do4, bm, bdv),
        )  # fmt: skip

    common = (1.0, 0.0, 0, h, lq, lk, e, ev, group)
    strides = (*q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *_strides(mask))
    flags = dict(HAS_MASK=mask is not None, CAUSAL=is_causal, DROPOUT=dropout, TMA=tma)

    key_blocks = cdiv(lk, dkdv_cfg["BLOCK_N"])
    if _sum_group_in_kernel(q, n, hk, group, key_blocks):
        heads = group
        dk_shape, dv_shape, d_dtype = (n, hk, lk, e), (n, hk, lk, ev), k.dtype
    else:
        heads = 1
        dk_shape, dv_shape, d_dtype = (n, h, lk, e), (n, h, lk, ev), torch.float32
    dk = torch.empty(dk_shape, dtype=d_dtype, device=q.device)
    dv = torch.empty(dv_shape, dtype=d_dtype, device=q.device)
    dkdv_launch = _Launch(
        K.attention_backward_dkdv_kernel, (key_blocks, n * h // heads),
        *operands(dkdv_cfg, q4, k4, v4, do4), lse, delta, dk, dv, mask_arg, *common, heads,
        *strides, *dk.stride(), *dv.stride(), **flags, **dkdv_cfg,
    )  # fmt: skip
    dq = torch.empty((n, h, lq, e), dtype=q.dtype, device=q.device)
    dq_launch = _Launch(
        K.attention_backward_dq_kernel, (cdiv(lq, dq_cfg["BLOCK_M"]), n * h),
        *operands(dq_cfg, q4, k4, v4, do4), lse, delta, dq, mask_arg, *common, *strides,
        *dq.stride(), **flags, **dq_cfg,
    )  # fmt: skip

    def call(dout, q, k, v, out, lse, attn_mask, scale, dropout_p, seed):
        q4, k4, v4, do4 = _as4(q), _as4(k), _as4(v), _as4(dout)
        lse = lse.reshape(n, h, lq).contiguous()
        mask = _mask4(attn_mask, q, lk)
        mask_arg = q4 if mask is None else mask
        delta = torch.empty((n, h, lq), dtype=torch.float32, device=q.device)
        delta_launch(OUT=_as4(out), DO=do4, DELTA=delta)
        dk = torch.empty(dk_shape, dtype=d_dtype, device=q.device)
        dv = torch.empty(dv_shape, dtype=d_dtype, device=q.device)
        dq = torch.empty((n, h, lq, e), dtype=q.dtype, device=q.device)
        scalars = dict(sm_scale=scale, p_drop=dropout_p, seed=seed)
        tq, tk, tv, tdo = operands(dkdv_cfg, q4, k4, v4, do4)
        dkdv_launch(
            Q=tq, K=tk, V=tv, DO=tdo, LSE=lse, DELTA=delta, DK=dk, DV_OUT=dv, M=mask_arg,
            **scalars,
        )  # fmt: skip
        tq, tk, tv, tdo = operands(dq_cfg, q4, k4, v4, do4)
        dq_launch(Q=tq, K=tk, V=tv, DO=tdo, LSE=lse, DELTA=delta, DQ=dq, M=mask_arg, **scalars)
        if heads != group:  # each key/value head gets the sum over the query heads of its group
            dk = dk.view(n, hk, group, lk, e).sum(2).to(k.dtype)
            dv = dv.view(n, hk, group, lk, ev).sum(2).to(v.dtype)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)

    return call


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    seed: int | None = None,
) -> torch.Tensor:
    """dropout(softmax(query @ key^T * scale + attn_mask)) @ value, fused (see the module
    docstring for shapes, masks, causal alignment, grouped-query attention and the dropout
    seed), as torch.nn.functional.scaled_dot_product_attention."""
    s = check_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    p = float(dropout_p)
    seed = resolve_seed(p, seed)
    return attention_forward(query, key, value, attn_mask, is_causal, s, enable_gqa, p, seed)[0]


def attention_dropout_mask(
    shape: tuple[int, int, int, int], dropout_p: float, seed: int, device: str | torch.device
) -> torch.Tensor:
    """The keep mask (bool, `shape` = (N, H, L, S) with H the query heads) that attention with
    this dropout_p and seed applies to its probabilities: True where an element is kept."""
    dropout_p = check_real("dropout_p", dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise bad_param("dropout_p", dropout_p, "a probability in [0, 1)")
    check_seed(seed)
    if len(shape) != 4 or any(not isinstance(d, int) or d < 1 for d in shape):
        raise bad_param("shape", shape, "(N, H, L, S), positive ints")
    n, h, lq, lk = shape
    keep = torch.empty((n, h, lq, lk), dtype=torch.int8, device=device)
    block = 16 if INTERPRETED else 64
    grid = (cdiv(lq, block), cdiv(lk, block), n * h)
    _launch(
        K.attention_dropout_keep_kernel, grid, keep, seed, float(dropout_p), h, lq, lk,
        BLOCK_M=block, BLOCK_N=block,
    )  # fmt: skip
    return keep.bool()
