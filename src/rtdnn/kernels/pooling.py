"""Pooling kernels: max and average forward, gather-form backward, adaptive average.

Every problem is 3-D: 1-D and 2-D pooling get leading spatial dims of size 1 (stride 0), which
Triton folds away at compile time. A program owns a [BLOCK_R, BLOCK_I] tile of one tensor:

    CL variant (channels-last data):  rows = pixels (n, d, h, w),  inner axis = channels
    NC variant (NCHW-like data):      rows = (n, c, d, h),        inner axis = w

so the inner axis is the contiguous one and loads and stores are vectorized. Coordinates are
decoded once per row and broadcast over the inner axis; a program runs STEPS such tiles one
after the other along the inner axis (a statically unrolled loop), so each thread's per-row
work (integer divisions, window bounds) is shared by up to 4 of its row's vectors.

Forward reads each window tap with a masked load (padding is masked off: -inf for max, 0 for
average); overlapping windows re-read neighbours from L1/L2, not from DRAM.

Backward is a gather: each dx element visits the (at most ceil(K*d/s) per dim) windows that
contain it and adds their dy, so there are no atomics and the result is deterministic. For max
pooling the window's argmax (its tap number, first maximum in scan order, NaN winning as in
PyTorch) comes from a first pass of the forward kernel that stores only that tap number, one
byte per output, instead of reading y; dx then takes dy where the tap is itself.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import triton
import triton.language as tl

from ..core import cdiv
from .layout import next_pow2

MAX = tl.constexpr(0)
AVG_INCLUDE_PAD = tl.constexpr(1)
AVG_EXCLUDE_PAD = tl.constexpr(2)
MODES = {"max": 0, "avg_include_pad": 1, "avg_exclude_pad": 2}


class PoolGeometry(NamedTuple):
    n: int
    c: int
    in_size: tuple  # (D, H, W)
    out_size: tuple  # (OD, OH, OW)
    stride: tuple
    padding: tuple
    dilation: tuple
    x_strides: tuple  # (n, c, d, h, w): x (forward) or dx (backward)
    y_strides: tuple  # y (forward) or dy (backward)
    i_strides: tuple  # argmax taps
    rows: int  # size of the row axis of the tiled tensor
    inner: int  # size of the inner axis
    inner_tiles: int


@triton.jit
def _tile(
    pid, rows, inner, inner_tiles, step,
    BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, STEPS: tl.constexpr,
):  # fmt: skip
    """Rows and inner indices of step `step` of the program's STEPS consecutive inner blocks."""
    ti = pid % inner_tiles
    tr = pid // inner_tiles
    r = tr * BLOCK_R + tl.arange(0, BLOCK_R)
    i = (ti * STEPS + step) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = (r < rows)[:, None] & (i < inner)[None, :]
    return r, i, mask


@triton.jit
def _coords(r, i, C, D, H, W, CL: tl.constexpr):
    """(n, c, d, h, w) of tile element (r, i), each [BLOCK_R, 1] or [1, BLOCK_I]."""
    if CL:
        w = r % W
        t = r // W
        h = t % H
        t = t // H
        d = t % D
        n = t // D
        return n[:, None], i[None, :], d[:, None], h[:, None], w[:, None]
    else:
        h = r % H
        t = r // H
        d = t % D
        t = t // D
        c = t % C
        n = t // C
        return n[:, None], c[:, None], d[:, None], h[:, None], i[None, :]


@triton.jit
def pool_fwd_kernel(
    X, Y, IDX, geo, alpha, beta,
    MODE: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    CL: tl.constexpr, STORE_Y: tl.constexpr, STORE_IDX: tl.constexpr,
    BETA_NONZERO: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, STEPS: tl.constexpr,
):  # fmt: skip
    """Tiles over y. STORE_Y: y = alpha * pool(x) + beta * y. STORE_IDX: the argmax tap."""
    D, H, W = geo.in_size
    OD, OH, OW = geo.out_size
    sd, sh, sw = geo.stride
    pd, ph, pw = geo.padding
    dd, dh, dw = geo.dilation
    xs_n, xs_c, xs_d, xs_h, xs_w = geo.x_strides
    ys_n, ys_c, ys_d, ys_h, ys_w = geo.y_strides
    is_n, is_c, is_d, is_h, is_w = geo.i_strides
    for step in tl.static_range(STEPS):
        r, i, mask = _tile(
            tl.program_id(0), geo.rows, geo.inner, geo.inner_tiles, step, BLOCK_R, BLOCK_I, STEPS
        )
        n, c, od, oh, ow = _coords(r, i, geo.c, OD, OH, OW, CL)
        base = n * xs_n + c * xs_c
        d0 = od * sd - pd
        h0 = oh * sh - ph
        w0 = ow * sw - pw
        if MODE == MAX:
            acc = tl.full((BLOCK_R, BLOCK_I), float("-inf"), tl.float32)
            best = tl.full((BLOCK_R, BLOCK_I), -1, tl.int32)
            # The first tap inside the input: it is the argmax when every tap inside is -inf. It
            # has the shape of `inside` (one value per row in the CL variant), not of the tile.
            first = tl.zeros_like(d0 + h0 + w0) - 1
        else:
            acc = tl.zeros((BLOCK_R, BLOCK_I), tl.float32)
            count = tl.zeros((BLOCK_R, BLOCK_I), tl.int32)
        for kd in tl.static_range(KD):
            id = d0 + kd * dd
            in_d = (id >= 0) & (id < D)
            pad_d = id < D + pd
            for kh in tl.static_range(KH):
                ih = h0 + kh * dh
                in_h = (ih >= 0) & (ih < H)
                pad_h = ih < H + ph
                for kw in tl.static_range(KW):
                    iw = w0 + kw * dw
                    inside = in_d & in_h & (iw >= 0) & (iw < W)
                    ptrs = X + base + id * xs_d + ih * xs_h + iw * xs_w
                    if MODE == MAX:
                        # Taps outside the input read -inf, which never wins below.
                        v = tl.load(ptrs, mask=inside & mask, other=float("-inf")).to(tl.float32)
                        if STORE_IDX:
                            # First maximum in scan order; NaN always wins (PyTorch's rule).
                            upd = (v > acc) | (v != v)
                            acc = tl.where(upd, v, acc)
                            best = tl.where(upd, (kd * KH + kh) * KW + kw, best)
                            first = tl.where(inside & (first < 0), (kd * KH + kh) * KW + kw, first)
                        else:
                            # The value alone does not depend on which tap wins a tie.
                            acc = tl.maximum(acc, v, propagate_nan=tl.PropagateNan.ALL)
                    else:
                        acc += tl.load(ptrs, mask=inside & mask, other=0.0).to(tl.float32)
                        if MODE == AVG_EXCLUDE_PAD:
                            count += inside.to(tl.int32)
                        else:
                            count += (pad_d & pad_h & (iw < W + pw)).to(tl.int32)
        y_offs = n * ys_n + c * ys_c + od * ys_d + oh * ys_h + ow * ys_w
        if STORE_Y:
            if MODE == MAX:
                res = alpha * acc
            else:
                res = alpha * acc / tl.maximum(count, 1).to(tl.float32)
            if BETA_NONZERO:
                res += beta * tl.load(Y + y_offs, mask=mask).to(tl.float32)
            tl.store(Y + y_offs, res.to(Y.dtype.element_ty), mask=mask)
        if STORE_IDX:
            best = tl.where(best < 0, first, best)
            i_offs = n * is_n + c * is_c + od * is_d + oh * is_h + ow * is_w
            tl.store(IDX + i_offs, best.to(IDX.dtype.element_ty), mask=mask)


@triton.jit
def _windows(q, s, size):
    """The last window (output index) whose start is <= padded input index q, clipped."""
    return tl.minimum(q // s, size - 1)


@triton.jit
def _taps_within(start, k, dil, limit):
    """How many taps start + j*dil (0 <= j < k) are in [0, limit); start <= limit - 1."""
    lo = (tl.maximum(-start, 0) + dil - 1) // dil
    hi = tl.minimum((tl.maximum(limit - start, 0) + dil - 1) // dil, k)
    return tl.maximum(hi - lo, 0)


@triton.jit
def pool_bwd_kernel(
    DY, IDX, DX, geo, alpha, beta,
    MODE: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    MD: tl.constexpr, MH: tl.constexpr, MW: tl.constexpr, CL: tl.constexpr,
    BETA_NONZERO: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, STEPS: tl.constexpr,
):  # fmt: skip
    """Tiles over dx. M*: most windows that contain one input index, per dim."""
    D, H, W = geo.in_size
    OD, OH, OW = geo.out_size
    sd, sh, sw = geo.stride
    pd, ph, pw = geo.padding
    dd, dh, dw = geo.dilation
    xs_n, xs_c, xs_d, xs_h, xs_w = geo.x_strides
    ys_n, ys_c, ys_d, ys_h, ys_w = geo.y_strides
    is_n, is_c, is_d, is_h, is_w = geo.i_strides
    for step in tl.static_range(STEPS):
        r, i, mask = _tile(
            tl.program_id(0), geo.rows, geo.inner, geo.inner_tiles, step, BLOCK_R, BLOCK_I, STEPS
        )
        n, c, id, ih, iw = _coords(r, i, geo.c, D, H, W, CL)
        qd = id + pd
        qh = ih + ph
        qw = iw + pw
        last_d = _windows(qd, sd, OD)
        last_h = _windows(qh, sh, OH)
        last_w = _windows(qw, sw, OW)
        y_base = n * ys_n + c * ys_c
        i_base = n * is_n + c * is_c
        acc = tl.zeros((BLOCK_R, BLOCK_I), tl.float32)
        for td in tl.static_range(MD):
            od = last_d - td
            rd = qd - od * sd  # >= 0: od <= qd // sd
            jd = rd // dd
            ok_d = (od >= 0) & (rd - jd * dd == 0) & (jd < KD)
            for th in tl.static_range(MH):
                oh = last_h - th
                rh = qh - oh * sh
                jh = rh // dh
                ok_h = (oh >= 0) & (rh - jh * dh == 0) & (jh < KH)
                for tw in tl.static_range(MW):
                    ow = last_w - tw
                    rw = qw - ow * sw
                    jw = rw // dw
                    ok = ok_d & ok_h & (ow >= 0) & (rw - jw * dw == 0) & (jw < KW) & mask
                    y_offs = y_base + od * ys_d + oh * ys_h + ow * ys_w
                    if MODE == MAX:
                        tap = tl.load(
                            IDX + i_base + od * is_d + oh * is_h + ow * is_w, mask=ok, other=-1
                        )
                        hit = tap.to(tl.int32) == (jd * KH + jh) * KW + jw
                        # Load under `ok` (uniform along the inner axis, so vectorized) and select.
                        g = tl.load(DY + y_offs, mask=ok, other=0.0).to(tl.float32)
                        acc += tl.where(hit, g, 0.0)
                    else:
                        if MODE == AVG_EXCLUDE_PAD:
                            cnt = _taps_within(od * sd - pd, KD, dd, D)
                            cnt *= _taps_within(oh * sh - ph, KH, dh, H)
                            cnt *= _taps_within(ow * sw - pw, KW, dw, W)
                        else:  # taps inside the padded input [-p, S + p): shift it to 0
                            cnt = _taps_within(od * sd, KD, dd, D + 2 * pd)
                            cnt *= _taps_within(oh * sh, KH, dh, H + 2 * ph)
                            cnt *= _taps_within(ow * sw, KW, dw, W + 2 * pw)
                        # The divisor has the shape of the window index (one per row in the CL
                        # variant): invert it there and multiply per element.
                        inv = 1.0 / tl.maximum(cnt, 1).to(tl.float32)
                        acc += tl.load(DY + y_offs, mask=ok, other=0.0).to(tl.float32) * inv
        x_offs = n * xs_n + c * xs_c + id * xs_d + ih * xs_h + iw * xs_w
        res = alpha * acc
        if BETA_NONZERO:
            res += beta * tl.load(DX + x_offs, mask=mask).to(tl.float32)
        tl.store(DX + x_offs, res.to(DX.dtype.element_ty), mask=mask)


# -- adaptive average pooling: window of output o is [o*I // O, ceil((o+1)*I / O)) -------------


@triton.jit
def _adaptive_window(o, size_in, size_out):
    start = (o * size_in) // size_out
    end = ((o + 1) * size_in + size_out - 1) // size_out
    return start, end


@triton.jit
def adaptive_fwd_kernel(
    X, Y, geo, alpha, beta,
    KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, CL: tl.constexpr,
    BETA_NONZERO: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, STEPS: tl.constexpr,
):  # fmt: skip
    """K*: the largest window per dim (loop bounds; shorter windows are masked)."""
    D, H, W = geo.in_size
    OD, OH, OW = geo.out_size
    xs_n, xs_c, xs_d, xs_h, xs_w = geo.x_strides
    ys_n, ys_c, ys_d, ys_h, ys_w = geo.y_strides
    for step in tl.static_range(STEPS):
        r, i, mask = _tile(
            tl.program_id(0), geo.rows, geo.inner, geo.inner_tiles, step, BLOCK_R, BLOCK_I, STEPS
        )
        n, c, od, oh, ow = _coords(r, i, geo.c, OD, OH, OW, CL)
        d0, d1 = _adaptive_window(od, D, OD)
        h0, h1 = _adaptive_window(oh, H, OH)
        w0, w1 = _adaptive_window(ow, W, OW)
        base = n * xs_n + c * xs_c
        acc = tl.zeros((BLOCK_R, BLOCK_I), tl.float32)
        for kd in range(KD):
            id = d0 + kd
            for kh in range(KH):
                ih = h0 + kh
                for kw in range(KW):
                    iw = w0 + kw
                    inside = (id < d1) & (ih < h1) & (iw < w1) & mask
                    ptrs = X + base + id * xs_d + ih * xs_h + iw * xs_w
                    acc += tl.load(ptrs, mask=inside, other=0.0).to(tl.float32)
        count = ((d1 - d0) * (h1 - h0) * (w1 - w0)).to(tl.float32)
        res = alpha * acc / count
        y_offs = n * ys_n + c * ys_c + od * ys_d + oh * ys_h + ow * ys_w
        if BETA_NONZERO:
            res += beta * tl.load(Y + y_offs, mask=mask).to(tl.float32)
        tl.store(Y + y_offs, res.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def adaptive_bwd_kernel(
    DY, DX, geo, alpha, beta,
    MD: tl.constexpr, MH: tl.constexpr, MW: tl.constexpr, CL: tl.constexpr,
    BETA_NONZERO: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, STEPS: tl.constexpr,
):  # fmt: skip
    """Input index i lies in the windows of outputs i*O // I ... ceil((i+1)*O / I) - 1."""
    D, H, W = geo.in_size
    OD, OH, OW = geo.out_size
    xs_n, xs_c, xs_d, xs_h, xs_w = geo.x_strides
    ys_n, ys_c, ys_d, ys_h, ys_w = geo.y_strides
    for step in tl.static_range(STEPS):
        r, i, mask = _tile(
            tl.program_id(0), geo.rows, geo.inner, geo.inner_tiles, step, BLOCK_R, BLOCK_I, STEPS
        )
        n, c, id, ih, iw = _coords(r, i, geo.c, D, H, W, CL)
        od_lo, od_end = _adaptive_window(id, OD, D)
        oh_lo, oh_end = _adaptive_window(ih, OH, H)
        ow_lo, ow_end = _adaptive_window(iw, OW, W)
        y_base = n * ys_n + c * ys_c
        acc = tl.zeros((BLOCK_R, BLOCK_I), tl.float32)
        for td in range(MD):
            od = od_lo + td
            sd0, sd1 = _adaptive_window(od, D, OD)
            for th in range(MH):
                oh = oh_lo + th
                sh0, sh1 = _adaptive_window(oh, H, OH)
                for tw in range(MW):
                    ow = ow_lo + tw
                    sw0, sw1 = _adaptive_window(ow, W, OW)
                    ok = (od < od_end) & (oh < oh_end) & (ow < ow_end) & mask
                    cnt = tl.maximum((sd1 - sd0) * (sh1 - sh0) * (sw1 - sw0), 1).to(tl.float32)
                    y_offs = y_base + od * ys_d + oh * ys_h + ow * ys_w
                    acc += tl.load(DY + y_offs, mask=ok, other=0.0).to(tl.float32) / cnt
        x_offs = n * xs_n + c * xs_c + id * xs_d + ih * xs_h + iw * xs_w
        res = alpha * acc
        if BETA_NONZERO:
            res += beta * tl.load(DX + x_offs, mask=mask).to(tl.float32)
        tl.store(DX + x_offs, res.to(DX.dtype.element_ty), mask=mask)


# -- planning (host side) --------------------------------------------------------------------


class PoolTiles(NamedTuple):
    grid: tuple
    rows: int
    inner: int
    inner_tiles: int  # programs along the inner axis
    block_r: int
    block_i: int  # inner elements per step
    steps: int  # inner steps per program
    num_warps: int


@functools.lru_cache(maxsize=4096)
def pool_tiles(n: int, c: int, size: tuple, cl: bool, elem_bytes: int) -> PoolTiles:
    """Tiles over a tensor (n, c, *size) in the CL or NC variant.

    A program owns block_r rows and `steps` consecutive blocks of block_i inner elements, one
    after the other: each thread keeps its rows' coordinates and window bounds (integer
    divisions) for all steps, so that work is spread over up to 4 vectors of a row instead of
    one. Each step is a [block_r, block_i] tile of 8 elements per thread (16-byte vectors).
    """
    d, h, w = size
    if cl:
        rows, inner = n * d * h * w, c
    else:
        rows, inner = n * c * d * h, w
    tile = 4 * 32 * max(1, 16 // elem_bytes)  # elements per step
    block_i = min(next_pow2(inner), 64)
    steps = min(4, cdiv(inner, block_i))
    block_r = max(1, min(next_pow2(rows), tile // block_i))
    inner_tiles = cdiv(inner, block_i * steps)
    grid = (cdiv(rows, block_r) * inner_tiles,)
    warps = max(1, min(8, block_r * block_i // (8 * 32)))
    return PoolTiles(grid, rows, inner, inner_tiles, block_r, block_i, steps, warps)


def windows_per_input(k: int, s: int, d: int, out: int) -> int:
    """Most windows (per dim) that contain one input index: offsets within a window span
    (k - 1) * d, and window starts are s apart."""
    return max(1, min(out, (k - 1) * d // s + 1))


def adaptive_max_window(size_in: int, size_out: int) -> int:
    return max(
        -(-(o + 1) * size_in // size_out) - (o * size_in) // size_out for o in range(size_out)
    )
