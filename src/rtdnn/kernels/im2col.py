"""Explicit im2col and col2im for the GEMM convolution algorithm.

The column matrix of group g is col[g, m, tap, c]: row m is an output pixel (n, o), and the
entry is the input pixel that filter tap `tap` of output pixel m reads (zero in the padding).
im2col reuses the forward addressing of the implicit GEMM; col2im is its adjoint, a gather, so
each input pixel is summed by one program in a fixed order (deterministic, no atomics).
"""

import math
from typing import NamedTuple

import triton
import triton.language as tl

from .brgemm import epilogue, identity
from .conv_addressing import (
    ConvGeometry,
    fwd_a_load,
    fwd_a_setup,
    num_pixels,
    num_taps,
    split_pixel,
    tap_and_chunk,
)
from .strided import StridedGeometry, batch_base, strided_a_setup


@triton.jit
def im2col_kernel(X, COL, geo, col_geo, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Grid: (row tiles, taps * channel chunks, groups)."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    t = tl.program_id(1)
    group = tl.program_id(2)
    offs_k = tl.arange(0, BLOCK_K)
    state = fwd_a_setup(geo, group, offs_m)
    tile = fwd_a_load(X, geo, state, group, t, offs_k, BLOCK_K)
    tap, c = tap_and_chunk(t, num_taps(geo), offs_k, BLOCK_K)
    rows = batch_base(col_geo, group) + offs_m * col_geo.s_row + tap * col_geo.s_i
    mask = (offs_m < col_geo.rows)[:, None] & (c < geo.cg)[None, :]
    tl.store(COL + rows[:, None] + c[None, :] * col_geo.s_col, tile, mask=mask)


class ColGeometry(NamedTuple):
    """The column matrix as the forward GEMM's A: its strides, and the convolution whose
    (tap, channel chunk) split of a step it must share with the filter operand."""

    conv: ConvGeometry
    col: StridedGeometry


@triton.jit
def col_a_setup(geo, group, offs_m):
    return strided_a_setup(geo.col, group, offs_m)


@triton.jit
def col_a_load(COL, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    """col[group, rows, tap, c] for step t, split as the filter's load splits it
    (conv_addressing.fwd_b_load)."""
    rows, rows_ok = state
    tap, c = tap_and_chunk(t, num_taps(geo.conv), offs_k, BLOCK_K)
    col = geo.col
    ptrs = COL + tap * col.s_i + rows[:, None] + c[None, :] * col.s_col
    return tl.load(ptrs, mask=rows_ok[:, None] & (c < col.cols)[None, :], other=0.0)


class TapPhase(NamedTuple):
    """Which filter taps of one spatial dimension reach an input index: tap r links padded
    input index i to an output when r * dilation = i (mod stride). With g = gcd(dilation,
    stride), that needs g | i, and then r = (i / g) * inverse + j * step for j = 0, 1, ...
    (step = stride / g, inverse = (dilation / g)^-1 modulo step)."""

    step: int
    g: int
    inverse: int


def tap_phase(stride: int, dilation: int) -> TapPhase:
    g = math.gcd(stride, dilation)
    step = stride // g
    return TapPhase(step, g, pow(dilation // g, -1, step) if step > 1 else 0)


@triton.jit
def _linked_taps(i_padded, phase, stride, dilation, taps):
    """For each padded input index: the first tap linked to it and the output it links
    (both valid where `ok`), then the steps between linked taps and between their outputs
    and how many steps cover the filter (see TapPhase). Tap first + j * step links output
    o_first - j * o_step: no division inside the loops over taps."""
    step, g, inverse = phase
    ok = i_padded % g == 0
    first = (i_padded // g * inverse) % step
    # i_padded - first * dilation is a multiple of the stride where ok; where it is negative
    # every later tap's is too, and the output index below 0 marks them all invalid.
    o_first = (i_padded - first * dilation + stride) // stride - 1
    return first, o_first, ok, step, dilation // g, tl.cdiv(taps, step)


@triton.jit
def col2im_kernel(
    COL,
    DX,
    geo,
    col_geo,
    phases,
    alpha,
    beta,
    BETA_NONZERO: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dx[n, c, i] = alpha * sum over taps of col[(n, o), tap, c] for o linked to i, + beta*dx.

    Each input pixel visits only the taps that can reach it (`phases`, a TapPhase per
    dimension): at stride s that is about 1 / s of them per dimension, where a loop over every
    tap would mask the rest (an 11x11 stride-4 filter: 9 taps of 121).

    Grid: (input-pixel tiles, channel tiles, groups).
    """
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    group = tl.program_id(2)
    n, id, ih, iw = split_pixel(offs_m, geo.in_size)
    pd, ph, pw = geo.padding
    rows_ok = offs_m < num_pixels(geo, geo.in_size)
    sd, sh, sw = geo.stride
    dd, dh, dw = geo.dilation
    OD, OH, OW = geo.out_size
    base = batch_base(col_geo, group)
    # Every geometry field is read before the loop, dx's addresses included: Triton 3.6 fails
    # to compile a read of a NamedTuple argument inside or after a loop when one of its leaves
    # was specialized to 1.
    KD, KH, KW = geo.kernel
    phase_d, phase_h, phase_w = phases
    s_row, s_i, s_col = col_geo.s_row, col_geo.s_i, col_geo.s_col
    cols_ok = offs_n < geo.cg
    xs_n, xs_c, xs_d, xs_h, xs_w = geo.x_strides
    dx_rows = geo.offsets[0] + n * xs_n + id * xs_d + ih * xs_h + iw * xs_w
    chan = group * geo.cg + offs_n
    offs = dx_rows[:, None] + (chan * xs_c)[None, :]
    mask = rows_ok[:, None] & cols_ok[None, :]
    rd0, od0, ok_d0, step_d, ostep_d, steps_d = _linked_taps(id + pd, phase_d, sd, dd, KD)
    rh0, oh0, ok_h0, step_h, ostep_h, steps_h = _linked_taps(ih + ph, phase_h, sh, dh, KH)
    rw0, ow0, ok_w0, step_w, ostep_w, steps_w = _linked_taps(iw + pw, phase_w, sw, dw, KW)
    ok_d0 = ok_d0 & rows_ok
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for jd in range(steps_d):
        rd = rd0 + jd * step_d
        od = od0 - jd * ostep_d
        ok_d = ok_d0 & (rd < KD) & (od >= 0) & (od < OD)
        for jh in range(steps_h):
            rh = rh0 + jh * step_h
            oh = oh0 - jh * ostep_h
            ok_h = ok_d & ok_h0 & (rh < KH) & (oh >= 0) & (oh < OH)
            for jw in range(steps_w):
                rw = rw0 + jw * step_w
                ow = ow0 - jw * ostep_w
                ok = ok_h & ok_w0 & (rw < KW) & (ow >= 0) & (ow < OW)
                m_out = ((n * OD + od) * OH + oh) * OW + ow
                tap = (rd * KH + rh) * KW + rw
                rows = base + m_out * s_row + tap * s_i
                ptrs = COL + rows[:, None] + (offs_n * s_col)[None, :]
                acc += tl.load(ptrs, mask=ok[:, None] & cols_ok[None, :], other=0.0).to(tl.float32)
    epilogue(DX, offs, mask, acc, alpha, beta, DX, chan, cols_ok, False, BETA_NONZERO, identity)
