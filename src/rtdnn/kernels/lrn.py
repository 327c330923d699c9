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

Where the positions are contiguous (NCHW) and size <= ROWS_MAX, the channel-rows kernels
(lrn_fwd_rows_kernel, lrn_bwd_rows_kernel) take over: each channel of the tile is its own
[BLOCK_P] tensor, so window sums are adds of whole tensors and no shifts are needed, in either
direction.

D^-beta: tl.log2 is a polynomial of about a dozen FMAs, not one special-function instruction,
and exp2(-beta log2 D) was the largest cost of every kernel here. For lrn_beta a multiple of
1/4 (0.75 is the usual one) the kernels raise D^-1/4 = sqrt(rsqrt(D)) to an integer power.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import triton
import triton.language as tl

from ..core import cdiv
from .layout import merge_dims, next_pow2

GATHER_MAX = 1024
ROWS_MAX = 9  # largest window of the channel-rows kernels (unrolled over channels)
ROWS_C = 32  # output channels per program of lrn_fwd_rows_kernel (half in the backward)


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
def _row_base(st, o0, o1, o2, p):
    # _base for [BLOCK_P] tensors (the channel-rows kernels)
    return o0 * st[0] + o1 * st[1] + o2 * st[2] + p * st[3]


@triton.jit
def _pow_neg(d, b, Q: tl.constexpr, ADD: tl.constexpr = 0):
    """d ** -(b + ADD) for d >= 0 (0 gives inf, like torch). Q = 4 b when b is a multiple of
    1/4 (see beta_quarters): (d^-1/4)^(Q + 4 ADD) from one sqrt and one rsqrt, each a single
    special-function instruction; else exp2(-(b + ADD) log2 d), where tl.log2 is a polynomial
    of about a dozen FMAs, the largest cost of these kernels."""
    if Q > 0:
        q = tl.sqrt(tl.rsqrt(d))
        r = q
        for _ in tl.static_range(Q + 4 * ADD - 1):
            r = r * q
        return r
    else:
        return tl.exp2(-(b + ADD) * tl.log2(d))


@triton.jit
def lrn_fwd_kernel(
    X, Y, geo, lrn_alpha, lrn_beta, lrn_k, alpha, beta,
    SIZE: tl.constexpr, BETA_Q: tl.constexpr, BETA_NONZERO: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
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
    y = alpha * x * _pow_neg(d, lrn_beta, BETA_Q)
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
    SIZE: tl.constexpr, BETA_Q: tl.constexpr, GATHER: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
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
        d_pow1 = _pow_neg(d, lrn_beta, BETA_Q, 1)
        d_pow = d_pow1 * d  # D^-beta = D^(-beta-1) * D: one pow, no division
        t = g * x * d_pow1  # dy x D^(-beta-1); _shift zeroes it outside [0, C)
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
        d_pow = _pow_neg(d, lrn_beta, BETA_Q)
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
            w += gu * xu * _pow_neg(du, lrn_beta, BETA_Q, 1)
    dx = alpha * (g * d_pow - 2.0 * scale * lrn_beta * x * w)
    dx_ptrs = DX + _base(geo.out, o0, o1, o2, p) + (c * geo.out[4])[None, :]
    if BETA_NONZERO:
        dx += beta * tl.load(dx_ptrs, mask=mask).to(tl.float32)
    tl.store(dx_ptrs, dx.to(DX.dtype.element_ty), mask=mask)


# -- channel rows: the window as adds of whole tensors ------------------------------------------
#
# A program owns BLOCK_P positions and a chunk of channels; each channel is a separate
# [BLOCK_P] float32 tensor in a tuple, so a window sum is SIZE whole-tensor adds in registers
# (no shifts, no per-element index math), and D and its pow are computed once per element.
# The rows of the chunk's halo (SIZE - 1 channels, twice that in the backward) come from
# cache. Used where the positions are contiguous (NCHW): each row is one load along p.


@triton.jit
def _window_fwd(
    x, lrn_alpha, lrn_beta, lrn_k, alpha, SIZE: tl.constexpr, N: tl.constexpr,
    BETA_Q: tl.constexpr,
):  # fmt: skip
    """x: rows of channels c - SIZE // 2 .. c + N - 1 + (SIZE - 1) // 2 (0 outside [0, C)).
    Returns alpha * y for the N channels c ...: a tuple of rows."""
    y = ()
    for k in tl.static_range(N):
        sq = tl.zeros_like(x[0])
        for j in tl.static_range(SIZE):
            sq += x[k + j] * x[k + j]
        d = lrn_k + (lrn_alpha / SIZE) * sq
        y = y + (alpha * x[k + SIZE // 2] * _pow_neg(d, lrn_beta, BETA_Q),)
    return y


@triton.jit
def _window_bwd(
    x, g, c_first, C, lrn_alpha, lrn_beta, lrn_k, alpha, SIZE: tl.constexpr, N: tl.constexpr,
    BETA_Q: tl.constexpr,
):  # fmt: skip
    """alpha * dx for the N channels c_first ... x: rows of channels c_first - (SIZE - 1) ..
    c_first + N - 1 + (SIZE - 1); g (dy): rows of c_first - HI .. c_first + N - 1 + LO.
    Output channel c needs t = dy x D^(-beta-1) at c - HI .. c + LO, hence D there, hence x
    at SIZE - 1 more channels on each side; D is computed once per row."""
    LO: tl.constexpr = SIZE // 2
    HI: tl.constexpr = (SIZE - 1) // 2
    scale = lrn_alpha / SIZE
    t = ()
    d_pow = ()  # D^-beta at the output channels
    for i in tl.static_range(N + SIZE - 1):
        sq = tl.zeros_like(x[0])
        for j in tl.static_range(SIZE):
            sq += x[i + j] * x[i + j]
        d = lrn_k + scale * sq
        d_pow1 = _pow_neg(d, lrn_beta, BETA_Q, 1)  # D^-beta = D^(-beta-1) * D: one pow per row
        ci = c_first - HI + i
        # 0 outside [0, C): there g and x are 0 but D = lrn_k may be 0 (0 * inf).
        t = t + (tl.where((ci >= 0) & (ci < C), g[i] * x[i + LO] * d_pow1, 0.0),)
        if i >= HI and i < HI + N:
            d_pow = d_pow + (d_pow1 * d,)
    dx = ()
    for k in tl.static_range(N):
        w = tl.zeros_like(x[0])
        for j in tl.static_range(SIZE):
            w += t[k + j]
        dx = dx + (alpha * (g[k + HI] * d_pow[k] - 2.0 * scale * lrn_beta * x[k + HI + LO] * w),)
    return dx


@triton.jit
def _load_rows(base, st_c, c_first, N: tl.constexpr, C, p_ok):
    """Rows c_first .. c_first + N - 1 at positions-contiguous base ([BLOCK_P] pointers)."""
    rows = ()
    for i in tl.static_range(N):
        ci = c_first + i
        ok = p_ok & (ci >= 0) & (ci < C)
        rows = rows + (tl.load(base + ci * st_c, mask=ok, other=0.0).to(tl.float32),)
    return rows


@triton.jit
def _store_rows(rows, base, st_c, c_first, C, p_ok, beta, BETA_NONZERO: tl.constexpr):
    for k in tl.static_range(len(rows)):
        v = rows[k]
        ok = p_ok & (c_first + k < C)
        ptrs = base + (c_first + k) * st_c
        if BETA_NONZERO:
            v += beta * tl.load(ptrs, mask=ok).to(tl.float32)
        tl.store(ptrs, v.to(base.dtype.element_ty), mask=ok)


@triton.jit
def lrn_fwd_rows_kernel(
    X, Y, geo, lrn_alpha, lrn_beta, lrn_k, alpha, beta,
    SIZE: tl.constexpr, BETA_Q: tl.constexpr, BETA_NONZERO: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Positions contiguous: BLOCK_P positions (one per thread: unaligned rows need no
    layout change) and BLOCK_C channels a program."""
    O0, O1, O2 = geo.outer
    ct, pt, o0, o1, o2 = _decode(tl.program_id(0), O1, O2, geo.p_tiles, geo.c_tiles)
    p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = p < geo.p
    c0 = ct * BLOCK_C
    x_base = X + _row_base(geo.x, o0, o1, o2, p)
    x = _load_rows(x_base, geo.x[4], c0 - SIZE // 2, BLOCK_C + SIZE - 1, geo.c, p_ok)
    y = _window_fwd(x, lrn_alpha, lrn_beta, lrn_k, alpha, SIZE, BLOCK_C, BETA_Q)
    y_base = Y + _row_base(geo.out, o0, o1, o2, p)
    _store_rows(y, y_base, geo.out[4], c0, geo.c, p_ok, beta, BETA_NONZERO)


@triton.jit
def lrn_bwd_rows_kernel(
    X, DY, DX, geo, lrn_alpha, lrn_beta, lrn_k, alpha, beta,
    SIZE: tl.constexpr, BETA_Q: tl.constexpr, BETA_NONZERO: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """The backward on lrn_fwd_rows_kernel's tiles (see _window_bwd for the halo)."""
    O0, O1, O2 = geo.outer
    ct, pt, o0, o1, o2 = _decode(tl.program_id(0), O1, O2, geo.p_tiles, geo.c_tiles)
    p = pt * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = p < geo.p
    c0 = ct * BLOCK_C
    C = geo.c
    HI: tl.constexpr = (SIZE - 1) // 2
    x_base = X + _row_base(geo.x, o0, o1, o2, p)
    x = _load_rows(x_base, geo.x[4], c0 - (SIZE - 1), BLOCK_C + 2 * (SIZE - 1), C, p_ok)
    g_base = DY + _row_base(geo.dy, o0, o1, o2, p)
    g = _load_rows(g_base, geo.dy[4], c0 - HI, BLOCK_C + SIZE - 1, C, p_ok)
    dx = _window_bwd(x, g, c0, C, lrn_alpha, lrn_beta, lrn_k, alpha, SIZE, BLOCK_C, BETA_Q)
    dx_base = DX + _row_base(geo.out, o0, o1, o2, p)
    _store_rows(dx, dx_base, geo.out[4], c0, C, p_ok, beta, BETA_NONZERO)


# -- planning (host side) --------------------------------------------------------------------


def beta_quarters(lrn_beta: float) -> int:
    """BETA_Q of the kernels: 4 lrn_beta where lrn_beta is one of 0.25, 0.5, ..., 2 (0.75 is
    the usual one), else 0 (the general pow)."""
    q = round(4 * lrn_beta)
    return q if 1 <= q <= 8 and q == 4 * lrn_beta else 0


class LrnPlan(NamedTuple):
    geo: LrnGeometry
    grid: tuple
    block_p: int
    block_c: int
    num_warps: int
    gather: bool
    rows: bool  # lrn_*_rows_kernel (positions contiguous)


@functools.lru_cache(maxsize=4096)
def plan_lrn(
    shape,
    strides: tuple,
    *,
    elem_bytes: int,
    whole_c: bool,
    size: int,
    gather_max: int = GATHER_MAX,
    rows_max: int = ROWS_MAX,
) -> LrnPlan:
    """strides: [x, dy, out] over shape (N, C, *S). whole_c: one tile spans all channels
    (the backward's gather path), if C <= gather_max. Where x's positions are contiguous
    (NCHW) and size <= rows_max, the channel-rows kernels take the problem."""
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
    if size <= rows_max and p_st[0][3] == 1:
        # Positions contiguous: one position per thread (4 warps), and BLOCK_C channels per
        # program; the halo (SIZE - 1 rows, twice that in the backward) is re-read from cache
        # and its D recomputed. Fewer channels in the backward, which holds more rows.
        block_c = min(C, ROWS_C // 2 if whole_c else ROWS_C)
        return _plan(p_sizes, p_st, strides, P, C, 128, block_c, 4, False, True)
    gather = whole_c and C <= gather_max
    # Elements per tile. Both kernels do several times more instructions per element than a
    # copy (window sums, a pow), so smaller tiles with 4 warps keep more programs resident to
    # hide latency (on an H100, bf16, C = 96: 2048-element forward tiles ran faster than 4096
    # with 16 warps); the gather backward, which also holds shifted copies of its tile,
    # prefers 1024.
    tile = (1024 if gather else 2048) // (2 if elem_bytes >= 4 else 1)
    if gather:
        block_c = next_pow2(C)
    else:
        block_c = min(next_pow2(C), 128 if strides[0][1] == 1 else 16)
    block_p = max(1, min(next_pow2(P), tile // block_c))
    return _plan(p_sizes, p_st, strides, P, C, block_p, block_c, 4, gather, False)


def _plan(p_sizes, p_st, strides, P, C, block_p, block_c, warps, gather, rows) -> LrnPlan:
    p_tiles = cdiv(P, block_p)
    c_tiles = cdiv(C, block_c)
    geo = LrnGeometry(
        tuple(p_sizes[:3]), P, C,
        *(tuple(m) + (st[1],) for m, st in zip(p_st, strides, strict=True)), p_tiles, c_tiles,
    )  # fmt: skip
    programs = c_tiles * p_tiles * p_sizes[0] * p_sizes[1] * p_sizes[2]
    return LrnPlan(geo, (programs,), block_p, block_c, warps, gather, rows)
