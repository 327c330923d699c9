"""Softmax kernels over one reduced axis: fast (no max subtraction), accurate, log.

The host (`plan_softmax`) views the problem as t[o0, o1, o2, p, r]: r is the reduced axis
(C in channel mode; C and all spatial dims merged in instance mode), p is the position dim
with the smallest stride, o* are the other positions (program id). A program owns a
[BLOCK_P, BLOCK_R] tile, so rows that are contiguous (r stride 1: NHWC channel mode, instance
mode, 2-D (N, C)) and positions that are contiguous (p stride 1: NCHW channel mode) are both
read with vector loads.

When p is the contiguous dim, the tile gets few warps (at most two across r), so that the
reductions over r do not go through shared memory and barriers: with 8 warps across r, the
forward ran at a third of the speed of its own memory traffic.

Rows up to FUSED_MAX elements are done in one pass (each byte read once and written once):
the whole row sits in registers. Longer rows are split into segments, enough of them for
thousands of programs: a stats kernel writes per-segment (max, sum) partials, and an apply
kernel combines all partials of its row in one vector load and writes the output, so x is read
twice. That is the floor of this path: the forward moves 3 bytes per 2 of one pass (at most
2/3 of copy bandwidth), the backward 5 per 3 (at most 3/5; log, whose stats kernel reads only
dy: 4 per 3, at most 3/4).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import triton
import triton.language as tl

from ..core import cdiv
from .layout import merge_dims, next_pow2

FAST = tl.constexpr(0)
ACCURATE = tl.constexpr(1)
LOG = tl.constexpr(2)
ALGOS = {"fast": 0, "accurate": 1, "log": 2}
FUSED_MAX = 16384
SPLIT_BLOCK = 4096  # elements of 16-bit data per chunk of a long row (half for 32-bit)
SPLIT_WAVES = 8  # programs per parallel slot that the split path aims for
MAX_SPLITS = 1024  # segments per row: the apply kernel loads all their partials at once


class SoftmaxGeometry(NamedTuple):
    outer: tuple  # (O0, O1, O2)
    p: int
    r: int
    a: tuple  # strides (o0, o1, o2, p, r) of x (forward) or y (backward)
    b: tuple  # dy (backward)
    out: tuple  # y (forward) or dx (backward)
    p_tiles: int
    seg_len: int  # elements of r per split (a multiple of BLOCK_R)


@triton.jit
def _decode(pid, O1, O2, p_tiles):
    pt = pid % p_tiles
    rest = pid // p_tiles
    o2 = rest % O2
    rest = rest // O2
    o1 = rest % O1
    o0 = rest // O1
    return pt, o0, o1, o2


@triton.jit
def _ptrs(T, st, o0, o1, o2, p, r):
    return T + o0 * st[0] + o1 * st[1] + o2 * st[2] + (p * st[3])[:, None] + (r * st[4])[None, :]


@triton.jit
def _safe_max(m):
    # A row of -inf (or a masked-off row) has max -inf: subtract 0 instead of making NaN.
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def softmax_fwd_kernel(
    X, Y, geo, alpha, beta,
    ALGO: tl.constexpr, BETA_NONZERO: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_R: tl.constexpr,
):  # fmt: skip
    O0, O1, O2 = geo.outer
    pt, o0, o1, o2 = _decode(tl.program_id(0), O1, O2, geo.p_tiles)
    p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
    r = tl.arange(0, BLOCK_R)
    mask = (p < geo.p)[:, None] & (r < geo.r)[None, :]
    x = tl.load(_ptrs(X, geo.a, o0, o1, o2, p, r), mask=mask, other=float("-inf"))
    x = x.to(tl.float32)
    if ALGO == FAST:
        e = tl.exp(x)
        s = tl.sum(e, 1)
        y = e / s[:, None]
    else:
        m = _safe_max(tl.max(x, 1))
        e = tl.exp(x - m[:, None])
        s = tl.sum(e, 1)
        if ALGO == LOG:
            y = x - (m + tl.log(s))[:, None]
        else:
            y = e * (1.0 / s)[:, None]
    y_ptrs = _ptrs(Y, geo.out, o0, o1, o2, p, r)
    y = alpha * y
    if BETA_NONZERO:
        y += beta * tl.load(y_ptrs, mask=mask).to(tl.float32)
    tl.store(y_ptrs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def softmax_bwd_kernel(
    Y, DY, DX, geo, alpha, beta,
    ALGO: tl.constexpr, BETA_NONZERO: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_R: tl.constexpr,
):  # fmt: skip
    """dx = y * (dy - sum(dy * y)), or for log: dx = dy - exp(y) * sum(dy)."""
    O0, O1, O2 = geo.outer
    pt, o0, o1, o2 = _decode(tl.program_id(0), O1, O2, geo.p_tiles)
    p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
    r = tl.arange(0, BLOCK_R)
    mask = (p < geo.p)[:, None] & (r < geo.r)[None, :]
    y = tl.load(_ptrs(Y, geo.a, o0, o1, o2, p, r), mask=mask, other=0.0).to(tl.float32)
    g = tl.load(_ptrs(DY, geo.b, o0, o1, o2, p, r), mask=mask, other=0.0).to(tl.float32)
    if ALGO == LOG:
        dx = g - tl.exp(y) * tl.sum(g, 1)[:, None]
    else:
        dx = y * (g - tl.sum(g * y, 1)[:, None])
    dx_ptrs = _ptrs(DX, geo.out, o0, o1, o2, p, r)
    dx = alpha * dx
    if BETA_NONZERO:
        dx += beta * tl.load(dx_ptrs, mask=mask).to(tl.float32)
    tl.store(dx_ptrs, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def softmax_stats_kernel(
    A, B, PART_M, PART_S, geo,
    ALGO: tl.constexpr, BACKWARD: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Per (position, segment): forward (max, sum of exp(x - max)); backward (0, sum(dy * y))
    or, for log, (0, sum(dy)). Partials are float32 [splits, positions]."""
    # Unpack tuples before the loop (Triton 3.6 loses 1-specialized tuple items after loops).
    O0, O1, O2 = geo.outer
    P = geo.p
    R = geo.r
    seg_len = geo.seg_len
    st_a = geo.a
    st_b = geo.b
    a0, a1, a2, a3, a4 = st_a
    b0, b1, b2, b3, b4 = st_b
    pt, o0, o1, o2 = _decode(tl.program_id(0), O1, O2, geo.p_tiles)
    seg = tl.program_id(1)
    p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = p < P
    lanes = tl.arange(0, BLOCK_R)
    m = tl.full((BLOCK_P, BLOCK_R), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_P, BLOCK_R), tl.float32)
    a_base = A + o0 * a0 + o1 * a1 + o2 * a2 + (p * a3)[:, None]
    b_base = B + o0 * b0 + o1 * b1 + o2 * b2 + (p * b3)[:, None]
    start = seg * seg_len
    end = tl.minimum(start + seg_len, R)
    for r0 in range(start, end, BLOCK_R):
        r = r0 + lanes
        mask = p_ok[:, None] & (r < end)[None, :]
        if BACKWARD:
            g = tl.load(b_base + (r * b4)[None, :], mask=mask, other=0.0).to(tl.float32)
            if ALGO == LOG:
                s += g
            else:
                y = tl.load(a_base + (r * a4)[None, :], mask=mask, other=0.0).to(tl.float32)
                s += g * y
        else:
            x = tl.load(a_base + (r * a4)[None, :], mask=mask, other=float("-inf"))
            x = x.to(tl.float32)
            if ALGO == FAST:
                s += tl.exp(x)
            else:
                # Online update with one exp per element: exp(min - max) either scales the
                # old sum (x is the new max) or is x's own term.
                m_new = tl.maximum(m, x)
                e = tl.exp(tl.minimum(m, x) - _safe_max(m_new))
                s = tl.where(x > m, s * e + 1.0, s + e)
                m = m_new
    if BACKWARD or ALGO == FAST:
        row_m = tl.zeros((BLOCK_P,), tl.float32)
        row_s = tl.sum(s, 1)
    else:
        row_m = tl.max(m, 1)
        row_s = tl.sum(s * tl.exp(m - _safe_max(row_m)[:, None]), 1)
    flat = ((o0 * O1 + o1) * O2 + o2) * P + p
    n_pos = O0 * O1 * O2 * P
    tl.store(PART_M + seg * n_pos + flat, row_m, mask=p_ok)
    tl.store(PART_S + seg * n_pos + flat, row_s, mask=p_ok)


@triton.jit
def softmax_apply_kernel(
    A, B, OUT, PART_M, PART_S, geo, splits, alpha, beta,
    ALGO: tl.constexpr, BACKWARD: tl.constexpr, BETA_NONZERO: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Combine all segments' partials of each position (BLOCK_S >= splits), then write this
    segment's output."""
    O0, O1, O2 = geo.outer
    P = geo.p
    R = geo.r
    seg_len = geo.seg_len
    a0, a1, a2, a3, a4 = geo.a
    b0, b1, b2, b3, b4 = geo.b
    c0, c1, c2, c3, c4 = geo.out
    pt, o0, o1, o2 = _decode(tl.program_id(0), O1, O2, geo.p_tiles)
    seg = tl.program_id(1)
    p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = p < P
    flat = ((o0 * O1 + o1) * O2 + o2) * P + p
    n_pos = O0 * O1 * O2 * P
    # All segments' partials of these positions in one [BLOCK_S, BLOCK_P] load (a fixed-order
    # tree reduction: deterministic), not a serial loop over hundreds of segments.
    k = tl.arange(0, BLOCK_S)
    part_ok = (k < splits)[:, None] & p_ok[None, :]
    part = k[:, None] * n_pos + flat[None, :]
    ps = tl.load(PART_S + part, mask=part_ok, other=0.0)
    if BACKWARD or ALGO == FAST:
        shift = tl.zeros((BLOCK_P,), tl.float32)
        row_s = tl.sum(ps, 0)
    else:
        pm = tl.load(PART_M + part, mask=part_ok, other=float("-inf"))
        shift = _safe_max(tl.max(pm, 0))
        row_s = tl.sum(ps * tl.exp(pm - shift[None, :]), 0)
    log_s = tl.log(row_s)
    inv_s = 1.0 / row_s
    lanes = tl.arange(0, BLOCK_R)
    a_base = A + o0 * a0 + o1 * a1 + o2 * a2 + (p * a3)[:, None]
    b_base = B + o0 * b0 + o1 * b1 + o2 * b2 + (p * b3)[:, None]
    c_base = OUT + o0 * c0 + o1 * c1 + o2 * c2 + (p * c3)[:, None]
    start = seg * seg_len
    end = tl.minimum(start + seg_len, R)
    for r0 in range(start, end, BLOCK_R):
        r = r0 + lanes
        mask = p_ok[:, None] & (r < end)[None, :]
        if BACKWARD:
            y = tl.load(a_base + (r * a4)[None, :], mask=mask, other=0.0).to(tl.float32)
            g = tl.load(b_base + (r * b4)[None, :], mask=mask, other=0.0).to(tl.float32)
            if ALGO == LOG:
                v = g - tl.exp(y) * row_s[:, None]
            else:
                v = y * (g - row_s[:, None])
        else:
            x = tl.load(a_base + (r * a4)[None, :], mask=mask, other=0.0).to(tl.float32)
            if ALGO == LOG:
                v = x - (shift + log_s)[:, None]
            else:
                v = tl.exp(x - shift[:, None]) * inv_s[:, None]
        v = alpha * v
        out_ptrs = c_base + (r * c4)[None, :]
        if BETA_NONZERO:
            v += beta * tl.load(out_ptrs, mask=mask).to(tl.float32)
        tl.store(out_ptrs, v.to(OUT.dtype.element_ty), mask=mask)


# -- planning (host side) --------------------------------------------------------------------


class SoftmaxPlan(NamedTuple):
    geo: SoftmaxGeometry
    fused: bool
    grid: tuple
    splits: int
    block_p: int
    block_r: int
    num_warps: int


@functools.lru_cache(maxsize=4096)
def plan_softmax(
    shape,
    reduced,
    strides: tuple,
    *,
    slots: int,
    elem_bytes: int,
    fused_max: int = FUSED_MAX,
    split_block: int = SPLIT_BLOCK,
    max_splits: int = MAX_SPLITS,
) -> SoftmaxPlan | None:
    """strides: [a, b, out] stride tuples over `shape`. None when the reduced dims do not
    merge into one strided axis or more than 4 position dims remain."""
    nd = len(shape)
    red_dims = sorted(reduced, key=lambda d: (-abs(strides[0][d]), d))
    pos_dims = sorted((d for d in range(nd) if d not in reduced),
                      key=lambda d: (-abs(strides[0][d]), d))  # fmt: skip
    r_sizes, r_st = merge_dims(red_dims, shape, strides)
    p_sizes, p_st = merge_dims(pos_dims, shape, strides)
    if len(r_sizes) > 1 or len(p_sizes) > 4:
        return None
    if not r_sizes:
        r_sizes, r_st = [1], [[0] for _ in strides]
    if not p_sizes:
        p_sizes, p_st = [1], [[0] for _ in strides]
    pad = 4 - len(p_sizes)
    p_sizes = [1] * pad + p_sizes
    p_st = [[0] * pad + m for m in p_st]
    R = r_sizes[0]
    P = p_sizes[3]

    def st(k):
        return (*p_st[k], r_st[k][0])

    fused = R <= fused_max
    if fused:
        block_r = next_pow2(R)
        tile = max(block_r, 2048 if elem_bytes >= 4 else 4096)
    else:
        block_r = min(next_pow2(R), split_block // 2 if elem_bytes >= 4 else split_block)
        tile = block_r
    block_p = max(1, min(next_pow2(P), tile // block_r))
    p_tiles = cdiv(P, block_p)
    programs = p_tiles * p_sizes[0] * p_sizes[1] * p_sizes[2]
    splits, seg_len = 1, R
    if not fused:
        # Enough segments for SPLIT_WAVES programs per parallel slot: a long row's segments
        # each loop over a few chunks, and every row's segments run side by side.
        chunks = cdiv(R, block_r)
        splits = max(1, min(chunks, max_splits, cdiv(SPLIT_WAVES * slots, programs)))
        seg_len = cdiv(chunks, splits) * block_r
        splits = cdiv(R, seg_len)
    geo = SoftmaxGeometry(tuple(p_sizes[:3]), P, R, st(0), st(1), st(2), p_tiles, seg_len)
    if all(t[3] == 1 for t in (st(0), st(1), st(2))) and block_p > 1:
        # Positions contiguous (NCHW channel mode): each warp reads 256 bytes along p, and at
        # most two warps share a position, so the reductions over r stay (almost) inside a
        # warp; more warps across r make them go through shared memory and barriers.
        warps = min(8, 2 * max(1, block_p * elem_bytes // 512))
    else:
        warps = max(4, min(16, block_p * block_r // 512))
    return SoftmaxPlan(geo, fused, (programs, splits), splits, block_p, block_r, warps)


def launch_softmax(a, b, out, plan: SoftmaxPlan, algo: str, backward: bool, alpha, beta):
    """Forward: a = x, out = y (b unused). Backward: a = y, b = dy, out = dx."""
    import torch

    code = ALGOS[algo]
    alpha, beta = float(alpha), float(beta)
    opts = dict(BLOCK_P=plan.block_p, BLOCK_R=plan.block_r, num_warps=plan.num_warps)
    if plan.fused:
        if backward:
            softmax_bwd_kernel[plan.grid[:1]](
                a, b, out, plan.geo, alpha, beta, ALGO=code, BETA_NONZERO=beta != 0, **opts
            )
        else:
            softmax_fwd_kernel[plan.grid[:1]](
                a, out, plan.geo, alpha, beta, ALGO=code, BETA_NONZERO=beta != 0, **opts
            )
        return
    g = plan.geo
    n_pos = g.outer[0] * g.outer[1] * g.outer[2] * g.p
    part = torch.empty((2, plan.splits, n_pos), dtype=torch.float32, device=a.device)
    b = a if b is None else b
    softmax_stats_kernel[plan.grid](a, b, part[0], part[1], g, ALGO=code, BACKWARD=backward, **opts)
    softmax_apply_kernel[plan.grid](
        a, b, out, part[0], part[1], g, plan.splits, alpha, beta, ALGO=code,
        BACKWARD=backward, BETA_NONZERO=beta != 0, BLOCK_S=next_pow2(plan.splits), **opts,
    )  # fmt: skip
