"""Precomputed-index addressing for the batch-reduce GEMM (IMPLICIT_PRECOMP_GEMM).

The implicit GEMM's im2col addressing (conv_addressing.py) works out, for every row and every
reduction step, which input pixel a filter tap reads and whether it lies inside the image:
divisions by the output sizes and six bounds checks per element. Here a table, built once per
call by `build_table_kernel` into the workspace, holds the answers; the loads read it.

A table covers the `rows` pixels of one gather (output pixels for forward and backward-filter,
the input pixels of one stride phase for backward-data), for a grid of `taps` filter taps:

    origin[r]            offset of row r's window origin in the gathered tensor (n, d, h, w),
                         stored only where the loads cannot cheaply compute it themselves
                         (backward-filter, whose rows change every step)
    words[w, r]          validity bits: bit b of word w says whether tap 32 * w + b of row r
                         reads inside the tensor (not padding, not past the output)

Tap j's offset from the origin is linear in its indices (jd, jh, jw): `delta . (jd, jh, jw)`,
one scalar per step. So a row's element of tap j is at `origin + tap_delta(j)`, valid when the
bit is set: one load of a word and a shift, where the implicit GEMM computes three coordinates
and six comparisons.

Operands that use a table take a tuple (tensor, table) as their pointer argument; brgemm_kernel
hands it to the load function unchanged.
"""

from typing import NamedTuple

import triton
import triton.language as tl

from . import conv_addressing as ca
from .conv_addressing import ConvGeometry, DataGeometry, split_pixel, split_tap, tap_and_chunk

#: Validity bits per table word (the words are int32, or int64 holding 32 bits); the kernels
#: below spell it as 32, >> 5 and & 31.
BITS = 32


class TableSpec(NamedTuple):
    """What `build_table_kernel` writes. Row r splits as (n, a0, a1, a2) over (N, *count);
    its origin coordinates are first + scale * a, tap j adds step * j (per spatial dim), and
    the tap is valid when every coordinate lies in [0, limit)."""

    rows: int
    count: tuple  # (3) row pixels per spatial dim
    first: tuple  # (3)
    scale: tuple  # (3)
    taps: tuple  # (3) the tap grid
    step: tuple  # (3)
    limit: tuple  # (3)
    n_stride: int  # offsets of the origin: n * n_stride + coordinates . strides
    strides: tuple  # (3)
    origin_at: int  # element offset of the origins in the table (unused without WITH_ORIGIN)
    words_at: int  # element offset of the validity words
    words: int


class Gather(NamedTuple):
    """How a load reads a table: its rows and sections, the tap grid with each tap index's
    offset step `delta`, and the channels reduced per tap (count and stride)."""

    rows: int
    origin_at: int
    words_at: int
    taps: tuple
    delta: tuple
    depth: int
    chan_stride: int


class GatherGeometry(NamedTuple):
    conv: ConvGeometry
    gather: Gather


class DataGatherGeometry(NamedTuple):
    data: DataGeometry
    gather: Gather


# -- the table --------------------------------------------------------------------------------


@triton.jit
def build_table_kernel(TAB, spec, WITH_ORIGIN: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = r < spec.rows
    n, a0, a1, a2 = split_pixel(r, spec.count)
    f0, f1, f2 = spec.first
    s0, s1, s2 = spec.scale
    p0 = f0 + s0 * a0
    p1 = f1 + s1 * a1
    p2 = f2 + s2 * a2
    if WITH_ORIGIN:
        t0, t1, t2 = spec.strides
        wide = TAB.dtype.element_ty  # int64 tables: offsets past 2^31
        origin = n.to(wide) * spec.n_stride + p0.to(wide) * t0 + p1.to(wide) * t1
        tl.store(TAB + spec.origin_at + r, origin + p2.to(wide) * t2, mask=ok)
    # Everything read from `spec` before the loops: Triton 3.6 loses a geometry leaf
    # specialized to 1 (a tap grid of (1, 1, 41)) read inside the nested loops (a GPU
    # compile error the interpreter does not show).
    k0, k1, k2 = spec.taps
    q0, q1, q2 = spec.step
    l0, l1, l2 = spec.limit
    taps = k0 * k1 * k2
    rows = spec.rows
    words = TAB + spec.words_at + r
    for word in range(spec.words):
        bits = tl.zeros([BLOCK], dtype=TAB.dtype.element_ty)
        for tap in range(word * 32, tl.minimum(word * 32 + 32, taps)):
            j2 = tap % k2
            j1 = (tap // k2) % k1
            j0 = tap // (k2 * k1)
            c0 = p0 + q0 * j0
            c1 = p1 + q1 * j1
            c2 = p2 + q2 * j2
            inside = (c0 >= 0) & (c0 < l0) & (c1 >= 0) & (c1 < l1) & (c2 >= 0) & (c2 < l2)
            bits |= inside.to(TAB.dtype.element_ty) << (tap - word * 32)
        tl.store(words + word * rows, bits, mask=ok)


@triton.jit
def tap_valid(TAB, g, tap, rows, rows_ok):
    """Whether filter tap `tap` of each row reads inside the tensor (tap and rows broadcast)."""
    word = tl.load(TAB + g.words_at + (tap >> 5) * g.rows + rows, mask=rows_ok, other=0)
    return ((word >> (tap & 31)) & 1) != 0


@triton.jit
def tap_delta(tap, g):
    """Offset of tap `tap` from a row's origin."""
    j0, j1, j2 = split_tap(tap, g.taps)
    d0, d1, d2 = g.delta
    return j0 * d0 + j1 * d1 + j2 * d2


@triton.jit
def num_taps(g):
    k0, k1, k2 = g.taps
    return k0 * k1 * k2


# -- rows gathered through the table (forward: x; backward-data: dy) ---------------------------


@triton.jit
def fwd_a_setup(geo, group, offs_m):
    """Each output pixel's window origin in x: the divisions once per tile."""
    conv = geo.conv
    base, id0, ih0, iw0, rows_ok = ca.fwd_a_setup(conv, group, offs_m)
    xs_n, xs_c, xs_d, xs_h, xs_w = conv.x_strides
    return base + id0 * xs_d + ih0 * xs_h + iw0 * xs_w, offs_m, rows_ok


@triton.jit
def bwd_data_a_setup(geo, group, offs_m):
    """Each input pixel's origin in dy: the output pixel its phase's first tap reaches."""
    data = geo.data
    conv = data.conv
    base, idp, ihp, iwp, rows_ok = ca.bwd_data_a_setup(data, group, offs_m)
    r0d, r0h, r0w = data.phase.tap0
    sd, sh, sw = conv.stride
    dd, dh, dw = conv.dilation
    ys_n, ys_k, ys_d, ys_h, ys_w = conv.y_strides
    # Exact divisions: the phase's taps reach these pixels.
    od = (idp - r0d * dd) // sd
    oh = (ihp - r0h * dh) // sh
    ow = (iwp - r0w * dw) // sw
    return base + od * ys_d + oh * ys_h + ow * ys_w, offs_m, rows_ok


@triton.jit
def gather_a_load(P, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    """Step t = (tap, chunk of channels): each row's pixel under the tap, [rows, channels]."""
    X, TAB = P
    origin, rows, rows_ok = state
    g = geo.gather
    tap, c = tap_and_chunk(t, num_taps(g), offs_k, BLOCK_K)
    ok = tap_valid(TAB, g, tap, rows, rows_ok)
    ptrs = X + (origin + tap_delta(tap, g))[:, None] + c[None, :] * g.chan_stride
    return tl.load(ptrs, mask=ok[:, None] & (c < g.depth)[None, :], other=0.0)


@triton.jit
def gather_packed_a_load(P, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    """Forward with few channels: the reduction index packs (tap, channel)."""
    X, TAB = P
    origin, rows, rows_ok = state
    g = geo.gather
    kappa = t * BLOCK_K + offs_k
    tap = kappa // g.depth
    cols = tap_delta(tap, g) + (kappa - tap * g.depth) * g.chan_stride
    inside = rows_ok[:, None] & (kappa < num_taps(g) * g.depth)[None, :]
    ok = tap_valid(TAB, g, tap[None, :], rows[:, None], inside)
    return tl.load(X + origin[:, None] + cols[None, :], mask=ok, other=0.0)


# -- backward-filter: the pixels of each step through the tables --------------------------------


@triton.jit
def bwd_filter_a_setup(geo, batch, offs_m):
    return ca.bwd_filter_a_setup(geo.conv, batch, offs_m)


@triton.jit
def bwd_filter_packed_a_setup(geo, group, offs_m):
    return ca.bwd_filter_packed_a_setup(geo.conv, group, offs_m)


@triton.jit
def bwd_filter_a_load(P, geo, state, batch, t, offs_k, BLOCK_K: tl.constexpr):
    """dy transposed, [k, pixel], the pixels' offsets from the table (no divisions)."""
    DY, TAB = P
    base, rows_ok, _ = state  # the table replaces the pixel dividers
    g = geo.gather
    j = t * BLOCK_K + offs_k
    j_ok = j < g.rows
    pix = tl.load(TAB + g.origin_at + j, mask=j_ok, other=0)
    mask = rows_ok[:, None] & j_ok[None, :]
    return tl.load(DY + base[:, None] + pix[None, :], mask=mask, other=0.0)


@triton.jit
def bwd_filter_b_setup(geo, batch, offs_n):
    """Batch entry = (group, tap); columns are channels."""
    conv = geo.conv
    taps = num_taps(geo.gather)
    group = batch // taps
    tap = batch - group * taps
    base = conv.offsets[0] + (group * conv.cg + offs_n) * conv.x_strides[1]
    return base + tap_delta(tap, geo.gather), offs_n < conv.cg, tap


@triton.jit
def bwd_filter_packed_b_setup(geo, group, offs_n):
    """Columns pack (tap, channel)."""
    conv = geo.conv
    g = geo.gather
    tap = offs_n // conv.cg
    c = offs_n - tap * conv.cg
    base = conv.offsets[0] + (group * conv.cg + c) * conv.x_strides[1] + tap_delta(tap, g)
    return base, offs_n < num_taps(g) * conv.cg, tap


@triton.jit
def bwd_filter_b_load(P, geo, state, batch, t, offs_k, BLOCK_K: tl.constexpr):
    """x under each column's tap for the pixels of step t: [pixel, column]."""
    X, TAB = P
    base, cols_ok, tap = state
    g = geo.gather
    j = t * BLOCK_K + offs_k
    j_ok = j < g.rows
    origin = tl.load(TAB + g.origin_at + j, mask=j_ok, other=0)
    # tap is one number (a batch entry per tap) or one per column (packed): broadcast both.
    taps = tap + tl.zeros_like(base)
    ok = tap_valid(TAB, g, taps[None, :], j[:, None], j_ok[:, None] & cols_ok[None, :])
    return tl.load(X + origin[:, None] + base[None, :], mask=ok, other=0.0)
