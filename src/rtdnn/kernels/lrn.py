"""Cross-channel local response normalization (torch.nn.LocalResponseNorm's definition).

    D[c] = k + alpha / size * sum_{c' = c - size//2}^{c + (size-1)//2} x[c']^2   (0 outside)
    y[c] = x[c] * D[c]^-beta
    dx[i] = dy[i] * D[i]^-beta
            - 2 alpha beta / size * x[i] * sum_{c: i in window(c)} dy[c] x[c] D[c]^(-beta-1)

The problem is viewed like channel-mode softmax: t[o0, o1, o2, p, c] with p the position dim
of smallest stride, and a program owns a [BLOCK_P, BLOCK_C] tile.

Forward: the window sum reads x at size channel offsets; the neighbours come from L1, so DRAM
sees x once. Backward needs, at every channel, a window sum of a quantity (dy x D^(-beta-1))
that is itself made of window sums; recomputing D at each neighbour costs 2*size
transcendental ops per element, more than the memory time on bf16 data. So the backward keeps
all channels of a position in registers and shifts the per-channel values along the channel
axis with tl.gather: D is computed once per element. Channel counts above GATHER_MAX use the
recomputing kernel. y is not read: it is x * D^-beta, recomputed.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import triton
import triton.language as tl

from .layout import merge_dims, next_pow2

GATHER_MAX = 1024


class LrnGeometry(NamedTuple):
    outer: tuple  # (O0, O1, O2)
    p: int
    c: int
    x: tuple  # strides (o0, o1, o2, p, c)
    dy: tuple
    out: tuple
    p_tiles: int
    c_tiles: int


@triton.jit
def _decode(pid, O1, O2, p_tiles, c_tiles):
    ct = pid % c_tiles
    rest = pid // c_tiles
    pt = rest % p_tiles
    rest = rest // p_tiles
    o2 = rest % O2
    rest = rest // O2
    o1 = rest % O1
    o0 = rest // O1
    return ct, pt, o0, o1, o2


@triton.jit
def _base(st, o0, o1, o2, p):
    return o0 * st[0] + o1 * st[1] + o2 * st[2] + (p * st[3])[:, None]


@triton.jit
def _pow(d, e):
    """d ** e for d > 0 (and d = 0 gives 0 ** e like torch: inf for e < 0)."""
    return tl.exp2(e * tl.log2(d))


@triton.jit
def lrn_fwd_kernel(
    X, Y, geo, lrn_alpha, lrn_beta, lrn_k, alpha, beta,
    SIZE: tl.constexpr, BETA_NONZERO: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):  # fmt: skip
    O0, O1, O2 = geo.outer
    C = geo.c
    sx_c = geo.x[4]
    ct, pt, o0, o1, o2 = _decode(tl.program_id(0), O1, O2, geo.p_tiles, geo.c_tiles)
    p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
    c = ct * BLOCK_C + tl.arange(0, BLOCK_C)
    p_ok = (p < geo.p)[:, None]
    mask = p_ok & (c < C)[None, :]
    x_base = X + _base(geo.x, o0, o1, o2, p)
    sq = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for j in tl.static_range(SIZE):
        cj = c + (j - SIZE // 2)
        ok = p_ok & ((cj >= 0) & (cj < C))[None, :]
        v = tl.load(x_base + (cj * sx_c)[None, :], mask=ok, other=0.0).to(tl.float32)
        sq += v * v
        if j == SIZE // 2:
            x = v
    d = lrn_k + (lrn_alpha / SIZE) * sq
    y = alpha * x * _pow(d, -lrn_beta)
    y_ptrs = Y + _base(geo.out, o0, o1, o2, p) + (c * geo.out[4])[None, :]
    if BETA_NONZERO:
        y += beta * tl.load(y_ptrs, mask=mask).to(tl.float32)
    tl.store(y_ptrs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _shift(v, c, u, C, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """v[:, c + u] (0 where c + u is outside [0, C)): a register shift along channels."""
    cu = c + u
    idx = tl.minimum(tl.maximum(cu, 0), BLOCK_C - 1)
    g = tl.gather(v, tl.broadcast_to(idx[None, :], (BLOCK_P, BLOCK_C)), 1)
    return tl.where(((cu >= 0) & (cu < C))[None, :], g, 0.0)


@triton.jit
def lrn_bwd_kernel(
    X, DY, DX, geo, lrn_alpha, lrn_beta, lrn_k, alpha, beta,
    SIZE: tl.constexpr, GATHER: tl.constexpr, BETA_NONZERO: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """GATHER: the tile holds every channel (BLOCK_C >= C, c_tiles == 1)."""
    O0, O1, O2 = geo.outer
    C = geo.c
    sx_c = geo.x[4]
    sg_c = geo.dy[4]
    ct, pt, o0, o1, o2 = _decode(tl.program_id(0), O1, O2, geo.p_tiles, geo.c_tiles)
    p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
    c = ct * BLOCK_C + tl.arange(0, BLOCK_C)
    p_ok = (p < geo.p)[:, None]
    mask = p_ok & (c < C)[None, :]
    x_base = X + _base(geo.x, o0, o1, o2, p)
    g_base = DY + _base(geo.dy, o0, o1, o2, p)
    scale = lrn_alpha / SIZE
    if GATHER:
        x = tl.load(x_base + (c * sx_c)[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_base + (c * sg_c)[None, :], mask=mask, other=0.0).to(tl.float32)
        sq = x * x
        s = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
        for j in tl.static_range(SIZE):
            s += _shift(sq, c, j - SIZE // 2, C, BLOCK_P, BLOCK_C)
        d = lrn_k + scale * s
        d_pow = _pow(d, -lrn_beta)
        t = g * x * d_pow / d  # dy x D^(-beta-1), 0 outside [0, C) since x is
        w = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
        for j in tl.static_range(SIZE):
            w += _shift(t, c, SIZE // 2 - j, C, BLOCK_P, BLOCK_C)
    else:
        # D at the center and, for every channel whose window holds c, recomputed there.
        s = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
        for j in tl.static_range(SIZE):
            cj = c + (j - SIZE // 2)
            ok = p_ok & ((cj >= 0) & (cj < C))[None, :]
            v = tl.load(x_base + (cj * sx_c)[None, :], mask=ok, other=0.0).to(tl.float32)
            s += v * v
            if j == SIZE // 2:
                x = v
        g = tl.load(g_base + (c * sg_c)[None, :], mask=mask, other=0.0).to(tl.float32)
        d = lrn_k + scale * s
        d_pow = _pow(d, -lrn_beta)
        w = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
        for j in tl.static_range(SIZE):
            cu = c + (SIZE // 2 - j)
            ok_u = p_ok & ((cu >= 0) & (cu < C))[None, :]
            su = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
            for i in tl.static_range(SIZE):
                cv = cu + (i - SIZE // 2)
                ok = ok_u & ((cv >= 0) & (cv < C))[None, :]
                v = tl.load(x_base + (cv * sx_c)[None, :], mask=ok, other=0.0).to(tl.float32)
                su += v * v
                if i == SIZE // 2:
                    xu = v
            gu = tl.load(g_base + (cu * sg_c)[None, :], mask=ok_u, other=0.0).to(tl.float32)
            du = lrn_k + scale * su
            w += gu * xu * _pow(du, -lrn_beta - 1.0)
    dx = alpha * (g * d_pow - 2.0 * scale * lrn_beta * x * w)
    dx_ptrs = DX + _base(geo.out, o0, o1, o2, p) + (c * geo.out[4])[None, :]
    if BETA_NONZERO:
        dx += beta * tl.load(dx_ptrs, mask=mask).to(tl.float32)
    tl.store(dx_ptrs, dx.to(DX.dtype.element_ty), mask=mask)


# -- planning (host side) --------------------------------------------------------------------


class LrnPlan(NamedTuple):
    geo: LrnGeometry
    grid: tuple
    block_p: int
    block_c: int
    num_warps: int
    gather: bool


@functools.lru_cache(maxsize=4096)
def plan_lrn(
    shape, strides: tuple, *, elem_bytes: int, whole_c: bool, gather_max: int = GATHER_MAX
) -> LrnPlan:
    """strides: [x, dy, out] over shape (N, C, *S). whole_c: one tile spans all channels
    (the backward's gather path), if C <= gather_max."""
    nd = len(shape)
    pos = sorted((d for d in range(nd) if d != 1), key=lambda d: (-abs(strides[0][d]), d))
    p_sizes, p_st = merge_dims(pos, shape, strides)  # at most N, D, H, W: 4 dims
    if not p_sizes:
        p_sizes, p_st = [1], [[0] for _ in strides]
    pad = 4 - len(p_sizes)
    p_sizes = [1] * pad + p_sizes
    p_st = [[0] * pad + m for m in p_st]
    C = shape[1]
    P = p_sizes[3]
    gather = whole_c and C <= gather_max
    tile = 2048 if elem_bytes >= 4 else 4096
    if gather:
        block_c = next_pow2(C)
    else:
        block_c = min(next_pow2(C), 128 if strides[0][1] == 1 else 16)
    block_p = max(1, min(next_pow2(P), tile // block_c))
    p_tiles = triton.cdiv(P, block_p)
    c_tiles = triton.cdiv(C, block_c)
    geo = LrnGeometry(
        tuple(p_sizes[:3]), P, C,
        *(tuple(m) + (st[1],) for m, st in zip(p_st, strides, strict=True)), p_tiles, c_tiles,
    )  # fmt: skip
    programs = c_tiles * p_tiles * p_sizes[0] * p_sizes[1] * p_sizes[2]
    warps = max(4, min(16, block_p * block_c // 256))
    return LrnPlan(geo, (programs,), block_p, block_c, warps, gather)
