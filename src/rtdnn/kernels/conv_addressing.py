"""Operand addressing that turns the batch-reduce GEMM into a convolution.

Every convolution is handled as 3-D: 1-D and 2-D problems get leading spatial dims of size 1,
which Triton specializes away at compile time. Notation (per group of `groups`):

    x  (N, C, D, H, W)      input          xs_* its strides
    w  (K, C/g, RD, RH, RW) filter         ws_*
    y  (N, K, OD, OH, OW)   output         ys_*
    od = (id + pad - r * dil) / stride     the output pixel a filter tap r links to input id

The GEMM that each direction runs:

    forward          rows: output pixels (n, o)   cols: k in group   steps: (tap, chunk of c)
    backward-data    rows: input pixels (n, i)    cols: c in group   steps: (tap, chunk of k)
    backward-filter  rows: k in group             cols: c in group   steps: chunks of pixels,
                     one batch entry per (group, tap)

A negative stride in a geometry is fine: true convolution reads the filter through a flipped
view (base offset at the far end, strides negated) instead of copying it.
"""

from typing import NamedTuple

import triton
import triton.language as tl

from .fast_div import div_mod, divider


class ConvGeometry(NamedTuple):
    """Everything the addressing functions need, as a tuple of ints the kernel can take."""

    n: int
    cg: int  # input channels per group
    kg: int  # output channels per group
    in_size: tuple  # (D, H, W)
    out_size: tuple  # (OD, OH, OW)
    kernel: tuple  # (RD, RH, RW)
    stride: tuple
    padding: tuple
    dilation: tuple
    x_strides: tuple  # (n, c, d, h, w)
    w_strides: tuple  # (k, c, d, h, w)
    y_strides: tuple  # (n, k, d, h, w)
    offsets: tuple  # element offset of index 0 in x, w, y


# -- index helpers -------------------------------------------------------------------------


@triton.jit
def in_range(i, size):
    """0 <= i < size in one unsigned compare: a negative index wraps past any int32 size."""
    return i.to(tl.uint32) < size.to(tl.uint32)


@triton.jit
def split_pixel(m, size):
    """Flat pixel index m over (N, D, H, W) -> (n, d, h, w)."""
    sd, sh, sw = size
    w = m % sw
    t = m // sw
    h = t % sh
    t = t // sh
    d = t % sd
    n = t // sd
    return n, d, h, w


@triton.jit
def pixel_dividers(size):
    """Dividers (fast_div) for split_pixel_by over a (D, H, W) size: made once per program."""
    sd, sh, sw = size
    return divider(sd), divider(sh), divider(sw)


@triton.jit
def split_pixel_by(m, dividers):
    """split_pixel with the sizes' dividers: three multiply-highs instead of divisions, for the
    reduction loops that split a vector of pixel indices at every step."""
    by_d, by_h, by_w = dividers
    t, w = div_mod(m, by_w)
    t, h = div_mod(t, by_h)
    n, d = div_mod(t, by_d)
    return n, d, h, w


@triton.jit
def split_tap(tap, kernel):
    """Flat filter tap index -> (rd, rh, rw)."""
    kd, kh, kw = kernel
    rw = tap % kw
    t = tap // kw
    rh = t % kh
    rd = t // kh
    return rd, rh, rw


@triton.jit
def num_pixels(geo, size):
    sd, sh, sw = size
    return geo.n * sd * sh * sw


@triton.jit
def num_taps(geo):
    return tap_count(geo.kernel)


@triton.jit
def tap_count(kernel):
    kd, kh, kw = kernel
    return kd * kh * kw


@triton.jit
def tap_and_chunk(t, taps, offs_k, BLOCK_K: tl.constexpr):
    """Step t of a reduction over (chunk of channels, filter tap), taps innermost -> (tap, the
    chunk's channel indices). Taps innermost because the filter size is a compile-time
    constant (algos.geometry.static_taps), so the division is a multiply, where the number of
    channel chunks is known only at run time."""
    chunk = t // taps
    return t - chunk * taps, chunk * BLOCK_K + offs_k


@triton.jit
def input_offset(id, ih, iw, in_size, strides):
    """Offset of input pixel (id, ih, iw) and whether it lies inside the image (not padding)."""
    D, H, W = in_size
    xs_n, xs_c, xs_d, xs_h, xs_w = strides
    inside = in_range(id, D) & in_range(ih, H) & in_range(iw, W)
    return id * xs_d + ih * xs_h + iw * xs_w, inside


@triton.jit
def window_offset(rows, cols, in_size, strides):
    """For a [rows, cols] tile whose input pixel is a row part plus a column part in each
    dim (rows, cols: (d, h, w) tuples of vectors), the pixel's offset and whether it lies
    inside the image. The offset is summed per part, so the tile costs one add per element;
    the bounds are one unsigned compare per dim (a negative index wraps past the size)."""
    D, H, W = in_size
    xs_n, xs_c, xs_d, xs_h, xs_w = strides
    rd, rh, rw = rows
    cd, ch, cw = cols
    row_offset = rd * xs_d + rh * xs_h + rw * xs_w
    col_offset = cd * xs_d + ch * xs_h + cw * xs_w
    offset = row_offset[:, None] + col_offset[None, :]
    inside = in_range(rd[:, None] + cd[None, :], D)
    inside &= in_range(rh[:, None] + ch[None, :], H)
    inside &= in_range(rw[:, None] + cw[None, :], W)
    return offset, inside


@triton.jit
def tap_offset(tap, geo):
    rd, rh, rw = split_tap(tap, geo.kernel)
    ws_k, ws_c, ws_d, ws_h, ws_w = geo.w_strides
    return rd * ws_d + rh * ws_h + rw * ws_w


# -- forward -------------------------------------------------------------------------------


@triton.jit
def fwd_a_setup(geo, group, offs_m):
    n, od, oh, ow = split_pixel(offs_m, geo.out_size)
    sd, sh, sw = geo.stride
    pd, ph, pw = geo.padding
    xs_n, xs_c, xs_d, xs_h, xs_w = geo.x_strides
    base = geo.offsets[0] + n * xs_n + group * geo.cg * xs_c
    rows_ok = offs_m < num_pixels(geo, geo.out_size)
    return base, od * sd - pd, oh * sh - ph, ow * sw - pw, rows_ok


@triton.jit
def fwd_a_load(X, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    """Implicit im2col: the input pixels under filter tap `tap`, channels c."""
    base, id0, ih0, iw0, rows_ok = state
    tap, c = tap_and_chunk(t, num_taps(geo), offs_k, BLOCK_K)
    rd, rh, rw = split_tap(tap, geo.kernel)
    dd, dh, dw = geo.dilation
    pix, inside = input_offset(
        id0 + rd * dd, ih0 + rh * dh, iw0 + rw * dw, geo.in_size, geo.x_strides
    )
    ptrs = X + (base + pix)[:, None] + c[None, :] * geo.x_strides[1]
    mask = (rows_ok & inside)[:, None] & (c < geo.cg)[None, :]
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def fwd_b_setup(geo, group, offs_n):
    base = geo.offsets[1] + (group * geo.kg + offs_n) * geo.w_strides[0]
    return base, offs_n < geo.kg


@triton.jit
def fwd_b_load(Wt, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    """Filter slice w[k, c, tap] as a [c, k] tile."""
    base, cols_ok = state
    tap, c = tap_and_chunk(t, num_taps(geo), offs_k, BLOCK_K)
    ptrs = Wt + tap_offset(tap, geo) + base[None, :] + c[:, None] * geo.w_strides[1]
    return tl.load(ptrs, mask=(c < geo.cg)[:, None] & cols_ok[None, :], other=0.0)


@triton.jit
def fwd_c_addr(geo, group, offs_m, offs_n):
    n, od, oh, ow = split_pixel(offs_m, geo.out_size)
    ys_n, ys_k, ys_d, ys_h, ys_w = geo.y_strides
    rows = geo.offsets[2] + n * ys_n + od * ys_d + oh * ys_h + ow * ys_w
    chan = group * geo.kg + offs_n
    mask = (offs_m < num_pixels(geo, geo.out_size))[:, None] & (offs_n < geo.kg)[None, :]
    return rows[:, None] + (chan * ys_k)[None, :], mask, chan


# -- backward-data: one launch per stride phase ----------------------------------------------
#
# With stride s, input pixel i receives gradient only through taps r with (i + pad - r*dil)
# divisible by s. Pixels are split by phase q = (i + pad) mod s; each phase is its own GEMM over
# the pixels of that phase and only the taps that reach them, so no work is spent on taps that
# contribute nothing (a 3x3 stride-2 layer does 9/4 taps per pixel on average, not 9).


class PhaseGeometry(NamedTuple):
    """Per spatial dim: first input index of the phase, how many, first tap, tap step, taps."""

    first: tuple
    count: tuple
    tap0: tuple
    tap_step: tuple
    taps: tuple


class DataGeometry(NamedTuple):
    conv: ConvGeometry
    phase: PhaseGeometry


@triton.jit
def bwd_data_a_setup(geo, group, offs_m):
    conv = geo.conv
    n, a, b, c = split_pixel(offs_m, geo.phase.count)
    fd, fh, fw = geo.phase.first
    sd, sh, sw = conv.stride
    pd, ph, pw = conv.padding
    base = conv.offsets[2] + n * conv.y_strides[0] + group * conv.kg * conv.y_strides[1]
    rows_ok = offs_m < num_pixels(conv, geo.phase.count)
    return base, fd + sd * a + pd, fh + sh * b + ph, fw + sw * c + pw, rows_ok


@triton.jit
def phase_tap(tap, phase):
    """The j-th tap of this phase -> (rd, rh, rw)."""
    jd, jh, jw = split_tap(tap, phase.taps)
    r0d, r0h, r0w = phase.tap0
    qd, qh, qw = phase.tap_step
    return r0d + jd * qd, r0h + jh * qh, r0w + jw * qw


@triton.jit
def bwd_data_a_load(DY, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    """dy at the output pixels that input pixel i reaches through this phase's tap."""
    conv = geo.conv
    base, idp, ihp, iwp, rows_ok = state
    tap, k = tap_and_chunk(t, tap_count(geo.phase.taps), offs_k, BLOCK_K)
    rd, rh, rw = phase_tap(tap, geo.phase)
    sd, sh, sw = conv.stride
    dd, dh, dw = conv.dilation
    OD, OH, OW = conv.out_size
    # Exact divisions: the phase guarantees divisibility, so truncation is harmless.
    od = (idp - rd * dd) // sd
    oh = (ihp - rh * dh) // sh
    ow = (iwp - rw * dw) // sw
    ok = in_range(od, OD) & in_range(oh, OH) & in_range(ow, OW)
    ys_n, ys_k, ys_d, ys_h, ys_w = conv.y_strides
    pix = od * ys_d + oh * ys_h + ow * ys_w
    ptrs = DY + (base + pix)[:, None] + k[None, :] * ys_k
    mask = (rows_ok & ok)[:, None] & (k < conv.kg)[None, :]
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def bwd_data_b_setup(geo, group, offs_n):
    conv = geo.conv
    base = conv.offsets[1] + group * conv.kg * conv.w_strides[0] + offs_n * conv.w_strides[1]
    return base, offs_n < conv.cg


@triton.jit
def bwd_data_b_load(Wt, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    """Filter slice w[k, c, tap] as a [k, c] tile."""
    conv = geo.conv
    base, cols_ok = state
    tap, k = tap_and_chunk(t, tap_count(geo.phase.taps), offs_k, BLOCK_K)
    rd, rh, rw = phase_tap(tap, geo.phase)
    ws_k, ws_c, ws_d, ws_h, ws_w = conv.w_strides
    ptrs = Wt + (rd * ws_d + rh * ws_h + rw * ws_w) + base[None, :] + k[:, None] * ws_k
    return tl.load(ptrs, mask=(k < conv.kg)[:, None] & cols_ok[None, :], other=0.0)


@triton.jit
def bwd_data_c_addr(geo, group, offs_m, offs_n):
    conv = geo.conv
    n, a, b, c = split_pixel(offs_m, geo.phase.count)
    fd, fh, fw = geo.phase.first
    sd, sh, sw = conv.stride
    xs_n, xs_c, xs_d, xs_h, xs_w = conv.x_strides
    pix = (fd + sd * a) * xs_d + (fh + sh * b) * xs_h + (fw + sw * c) * xs_w
    rows = conv.offsets[0] + n * xs_n + pix
    chan = group * conv.cg + offs_n
    mask = (offs_m < num_pixels(conv, geo.phase.count))[:, None] & (offs_n < conv.cg)[None, :]
    return rows[:, None] + (chan * xs_c)[None, :], mask, chan


# -- backward-filter: batch entry b = group * taps + tap -----------------------------------


@triton.jit
def bwd_filter_a_setup(geo, batch, offs_m):
    group = batch // num_taps(geo)
    base = geo.offsets[2] + (group * geo.kg + offs_m) * geo.y_strides[1]
    return base, offs_m < geo.kg, pixel_dividers(geo.out_size)


@triton.jit
def bwd_filter_a_load(DY, geo, state, batch, t, offs_k, BLOCK_K: tl.constexpr):
    """dy transposed: a [k, pixel] tile over output pixels t*BK ... t*BK + BK."""
    base, rows_ok, dividers = state
    j = t * BLOCK_K + offs_k
    n, od, oh, ow = split_pixel_by(j, dividers)
    ys_n, ys_k, ys_d, ys_h, ys_w = geo.y_strides
    pix = n * ys_n + od * ys_d + oh * ys_h + ow * ys_w
    mask = rows_ok[:, None] & (j < num_pixels(geo, geo.out_size))[None, :]
    return tl.load(DY + base[:, None] + pix[None, :], mask=mask, other=0.0)


@triton.jit
def bwd_filter_b_setup(geo, batch, offs_n):
    taps = num_taps(geo)
    group = batch // taps
    rd, rh, rw = split_tap(batch - group * taps, geo.kernel)
    dd, dh, dw = geo.dilation
    pd, ph, pw = geo.padding
    base = geo.offsets[0] + (group * geo.cg + offs_n) * geo.x_strides[1]
    shifts = rd * dd - pd, rh * dh - ph, rw * dw - pw
    return base, offs_n < geo.cg, shifts, pixel_dividers(geo.out_size)


@triton.jit
def bwd_filter_b_load(X, geo, state, batch, t, offs_k, BLOCK_K: tl.constexpr):
    """Input pixels under this tap for output pixels t*BK ...: a [pixel, c] tile."""
    base, cols_ok, shifts, dividers = state
    shift_d, shift_h, shift_w = shifts
    j = t * BLOCK_K + offs_k
    n, od, oh, ow = split_pixel_by(j, dividers)
    sd, sh, sw = geo.stride
    pix, inside = input_offset(
        od * sd + shift_d, oh * sh + shift_h, ow * sw + shift_w, geo.in_size, geo.x_strides
    )
    rows_ok = inside & (j < num_pixels(geo, geo.out_size))
    ptrs = X + (n * geo.x_strides[0] + pix)[:, None] + base[None, :]
    return tl.load(ptrs, mask=rows_ok[:, None] & cols_ok[None, :], other=0.0)


@triton.jit
def bwd_filter_c_addr(geo, batch, offs_m, offs_n):
    taps = num_taps(geo)
    group = batch // taps
    ws_k, ws_c, ws_d, ws_h, ws_w = geo.w_strides
    rows = geo.offsets[1] + (group * geo.kg + offs_m) * ws_k + tap_offset(batch - group * taps, geo)
    mask = (offs_m < geo.kg)[:, None] & (offs_n < geo.cg)[None, :]
    return rows[:, None] + (offs_n * ws_c)[None, :], mask, offs_n


# -- explicit-GEMM backward-data: dcol[g, (n, o), (tap, c)] = dy[n, g, :, o] @ w[g, :, c, tap] --


@triton.jit
def dy_rows_a_setup(geo, group, offs_m):
    n, od, oh, ow = split_pixel(offs_m, geo.out_size)
    ys_n, ys_k, ys_d, ys_h, ys_w = geo.y_strides
    base = geo.offsets[2] + n * ys_n + od * ys_d + oh * ys_h + ow * ys_w + group * geo.kg * ys_k
    return base, offs_m < num_pixels(geo, geo.out_size)


@triton.jit
def dy_rows_a_load(DY, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    base, rows_ok = state
    k = t * BLOCK_K + offs_k
    ptrs = DY + base[:, None] + k[None, :] * geo.y_strides[1]
    return tl.load(ptrs, mask=rows_ok[:, None] & (k < geo.kg)[None, :], other=0.0)


@triton.jit
def filter_cols_b_setup(geo, group, offs_n):
    tap = offs_n // geo.cg
    c = offs_n - tap * geo.cg
    base = geo.offsets[1] + group * geo.kg * geo.w_strides[0] + c * geo.w_strides[1]
    return base + tap_offset(tap, geo), offs_n < num_taps(geo) * geo.cg


@triton.jit
def filter_cols_b_load(Wt, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    base, cols_ok = state
    k = t * BLOCK_K + offs_k
    ptrs = Wt + base[None, :] + k[:, None] * geo.w_strides[0]
    return tl.load(ptrs, mask=(k < geo.kg)[:, None] & cols_ok[None, :], other=0.0)


# -- few channels per group: filter taps and channels packed into one reduction dim -----------
#
# With C/g = 3 (an RGB stem) a reduction chunk of one tap holds 3 useful channels out of 16 or
# more. Packing (tap, c) into one index kappa = tap * C/g + c fills every chunk instead; the
# price is 2-D index arithmetic per element, which is small next to the wasted work it saves.


@triton.jit
def split_packed(kappa, geo):
    """kappa = tap * cg + c -> (rd, rh, rw, c)."""
    tap = kappa // geo.cg
    rd, rh, rw = split_tap(tap, geo.kernel)
    return rd, rh, rw, kappa - tap * geo.cg


@triton.jit
def fwd_packed_a_load(X, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    base, id0, ih0, iw0, rows_ok = state
    kappa = t * BLOCK_K + offs_k
    rd, rh, rw, c = split_packed(kappa, geo)
    dd, dh, dw = geo.dilation
    pix, inside = window_offset(
        (id0, ih0, iw0), (rd * dd, rh * dh, rw * dw), geo.in_size, geo.x_strides
    )
    ptrs = X + base[:, None] + pix + (c * geo.x_strides[1])[None, :]
    mask = rows_ok[:, None] & inside & (kappa < num_taps(geo) * geo.cg)[None, :]
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def fwd_packed_b_load(Wt, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    base, cols_ok = state
    kappa = t * BLOCK_K + offs_k
    rd, rh, rw, c = split_packed(kappa, geo)
    ws_k, ws_c, ws_d, ws_h, ws_w = geo.w_strides
    rows = c * ws_c + rd * ws_d + rh * ws_h + rw * ws_w
    mask = (kappa < num_taps(geo) * geo.cg)[:, None] & cols_ok[None, :]
    return tl.load(Wt + rows[:, None] + base[None, :], mask=mask, other=0.0)


# Forward by filter rows. Along one filter row (rd, rh) the pairs (rw, c) of a channels-last
# input lie at one fixed offset each from the row's first input pixel (21 consecutive elements
# for a 7x7 filter over 3 channels), so a step that reads one row's pairs adds a per-row and a
# per-pair offset: no 2-D index arithmetic but the one horizontal bound. The price is padding
# each row's pairs to the chunk (21 of 32), which the tensor cores can spare here.


@triton.jit
def split_row_step(t, geo, offs_k, BLOCK_K: tl.constexpr):
    """Step t of a reduction over (filter row, chunk of the row's (rw, c) pairs), chunks
    innermost -> (rd, rh, rw, c, whether the pair exists)."""
    kd, kh, kw = geo.kernel
    run = kw * geo.cg
    chunks = (run + BLOCK_K - 1) // BLOCK_K
    row = t // chunks
    u = (t - row * chunks) * BLOCK_K + offs_k
    rw = u // geo.cg
    rd = row // kh
    return rd, row - rd * kh, rw, u - rw * geo.cg, u < run


@triton.jit
def fwd_rows_a_load(X, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    """Implicit im2col by filter rows: the input under filter row (rd, rh), pairs (rw, c)."""
    base, id0, ih0, iw0, rows_ok = state
    rd, rh, rw, c, run_ok = split_row_step(t, geo, offs_k, BLOCK_K)
    D, H, W = geo.in_size
    dd, dh, dw = geo.dilation
    xs_n, xs_c, xs_d, xs_h, xs_w = geo.x_strides
    in_d = id0 + rd * dd
    in_h = ih0 + rh * dh
    row = base + in_d * xs_d + in_h * xs_h + iw0 * xs_w
    row_ok = rows_ok & in_range(in_d, D) & in_range(in_h, H)
    shift = rw * dw
    pair = shift * xs_w + c * xs_c
    mask = row_ok[:, None] & in_range(iw0[:, None] + shift[None, :], W) & run_ok[None, :]
    return tl.load(X + row[:, None] + pair[None, :], mask=mask, other=0.0)


@triton.jit
def fwd_rows_b_load(Wt, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    """Filter slice w[k, c, rd, rh, rw] as a [(rw, c), k] tile."""
    base, cols_ok = state
    rd, rh, rw, c, run_ok = split_row_step(t, geo, offs_k, BLOCK_K)
    ws_k, ws_c, ws_d, ws_h, ws_w = geo.w_strides
    rows = rd * ws_d + rh * ws_h + rw * ws_w + c * ws_c
    mask = run_ok[:, None] & cols_ok[None, :]
    return tl.load(Wt + rows[:, None] + base[None, :], mask=mask, other=0.0)


# Backward-filter by filter rows: the weight gradient's columns are (filter row, pair (rw, c)),
# each filter row's pairs padded to `pairs` columns, a power of two, and a column tile is one
# filter row's pairs. A step's input pixels then shift by one row offset per pixel (1-D work)
# and one pair offset per column; only the horizontal bound is checked per element.


class FilterRowsGeometry(NamedTuple):
    conv: ConvGeometry
    pairs: int  # columns per filter row (a tl.constexpr): its (rw, c) pairs, padded


@triton.jit
def split_row_column(n, geo):
    """Column n of the weight gradient by filter rows -> (rd, rh, rw, c, whether it exists)."""
    conv = geo.conv
    kd, kh, kw = conv.kernel
    row = n // geo.pairs
    u = n - row * geo.pairs
    rw = u // conv.cg
    rd = row // kh
    return rd, row - rd * kh, rw, u - rw * conv.cg, (u < kw * conv.cg) & (row < kd * kh)


@triton.jit
def bwd_filter_rows_b_setup(geo, group, offs_n):
    """The column tile is one filter row's pairs (BLOCK_N == geo.pairs): its row's shifts are
    scalars, its pairs' offsets a vector."""
    conv = geo.conv
    rd, rh, rw, c, cols_ok = split_row_column(offs_n, geo)
    dd, dh, dw = conv.dilation
    pd, ph, pw = conv.padding
    xs_n, xs_c, xs_d, xs_h, xs_w = conv.x_strides
    shift_w = rw * dw - pw
    pair = conv.offsets[0] + (group * conv.cg + c) * xs_c + shift_w * xs_w
    shift_d = tl.min(rd, axis=0) * dd - pd
    shift_h = tl.min(rh, axis=0) * dh - ph
    return pair, cols_ok, shift_w, shift_d, shift_h, pixel_dividers(conv.out_size)


@triton.jit
def bwd_filter_rows_b_load(X, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    """Input pixels under one filter row for output pixels t*BK ...: [pixel, (rw, c)]."""
    conv = geo.conv
    pair, cols_ok, shift_w, shift_d, shift_h, dividers = state
    j = t * BLOCK_K + offs_k
    n, od, oh, ow = split_pixel_by(j, dividers)
    sd, sh, sw = conv.stride
    D, H, W = conv.in_size
    xs_n, xs_c, xs_d, xs_h, xs_w = conv.x_strides
    in_d = od * sd + shift_d
    in_h = oh * sh + shift_h
    in_w = ow * sw
    row = n * xs_n + in_d * xs_d + in_h * xs_h + in_w * xs_w
    row_ok = (j < num_pixels(conv, conv.out_size)) & in_range(in_d, D) & in_range(in_h, H)
    mask = row_ok[:, None] & in_range(in_w[:, None] + shift_w[None, :], W) & cols_ok[None, :]
    return tl.load(X + row[:, None] + pair[None, :], mask=mask, other=0.0)


@triton.jit
def bwd_filter_rows_c_addr(geo, group, offs_m, offs_n):
    conv = geo.conv
    rd, rh, rw, c, cols_ok = split_row_column(offs_n, geo)
    ws_k, ws_c, ws_d, ws_h, ws_w = conv.w_strides
    rows = conv.offsets[1] + (group * conv.kg + offs_m) * ws_k
    cols = c * ws_c + rd * ws_d + rh * ws_h + rw * ws_w
    mask = (offs_m < conv.kg)[:, None] & cols_ok[None, :]
    return rows[:, None] + cols[None, :], mask, offs_n


@triton.jit
def bwd_filter_packed_a_setup(geo, group, offs_m):
    base = geo.offsets[2] + (group * geo.kg + offs_m) * geo.y_strides[1]
    return base, offs_m < geo.kg, pixel_dividers(geo.out_size)


@triton.jit
def bwd_filter_packed_b_setup(geo, group, offs_n):
    rd, rh, rw, c = split_packed(offs_n, geo)
    dd, dh, dw = geo.dilation
    pd, ph, pw = geo.padding
    base = geo.offsets[0] + (group * geo.cg + c) * geo.x_strides[1]
    cols_ok = offs_n < num_taps(geo) * geo.cg
    shifts = rd * dd - pd, rh * dh - ph, rw * dw - pw
    return base, cols_ok, shifts, pixel_dividers(geo.out_size)


@triton.jit
def bwd_filter_packed_b_load(X, geo, state, group, t, offs_k, BLOCK_K: tl.constexpr):
    """Input pixels for output pixels t*BK ... under each column's own tap: [pixel, (tap, c)]."""
    base, cols_ok, shifts, dividers = state
    shift_d, shift_h, shift_w = shifts
    j = t * BLOCK_K + offs_k
    n, od, oh, ow = split_pixel_by(j, dividers)
    sd, sh, sw = geo.stride
    pix, inside = window_offset(
        (od * sd, oh * sh, ow * sw), (shift_d, shift_h, shift_w), geo.in_size, geo.x_strides
    )
    rows_ok = j < num_pixels(geo, geo.out_size)
    ptrs = X + (n * geo.x_strides[0])[:, None] + pix + base[None, :]
    return tl.load(ptrs, mask=rows_ok[:, None] & inside & cols_ok[None, :], other=0.0)


@triton.jit
def bwd_filter_packed_c_addr(geo, group, offs_m, offs_n):
    rd, rh, rw, c = split_packed(offs_n, geo)
    ws_k, ws_c, ws_d, ws_h, ws_w = geo.w_strides
    rows = geo.offsets[1] + (group * geo.kg + offs_m) * ws_k
    cols = c * ws_c + rd * ws_d + rh * ws_h + rw * ws_w
    mask = (offs_m < geo.kg)[:, None] & (offs_n < num_taps(geo) * geo.cg)[None, :]
    return rows[:, None] + cols[None, :], mask, offs_n
