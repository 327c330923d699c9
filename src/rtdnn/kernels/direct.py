"""Direct convolution for few channels per group (depthwise and narrow grouped convolutions).

With C/groups <= 8 each output element needs at most 8 x taps multiply-adds: too few to
fill a tensor-core tile, and few enough that the bar is the bytes moved. These kernels use
float32 FMAs on [BLOCK_P, BLOCK_C] tiles of pixels x channels, channels innermost, so that a
channels-last tensor is read in contiguous vectors along the channels; the addressing is by
strides, so any layout works. Every problem is 3-D (see conv_addressing.ConvGeometry): 1-D and
2-D problems have leading spatial dims of size 1. True convolution reads the filter through a
flipped view (negative strides in the geometry), so the kernels never flip anything themselves.

    forward          y[n, k, o]  = sum_{j < CG, r} x[n, g(k)*CG + j, o*s - p + r*d] * w[k, j, r]
    backward-data    dx[n, c, i] = sum_{m < KG, r} dy[n, g(c)*KG + m, (i + p - r*d) / s]
                                                  * w[g(c)*KG + m, c % CG, r]
                     (only taps for which i + p - r*d is a multiple of s inside the output)
    backward-filter  dw[k, j, r] = sum_{n, o} dy[n, k, o] * x[n, g(k)*CG + j, o*s - p + r*d]

Backward-filter is a deterministic two-stage reduction: stage 1 programs own (a chunk of
pixels, a block of output channels, one filter row, for filters up to MAX_ROW_TAPS wide; else
every tap) and write float32 partial sums [chunks, K, CG, taps] to a workspace; stage 2 adds
the chunks in order and applies the epilogue.
"""

import triton
import triton.language as tl

from .brgemm import epilogue, identity
from .conv_addressing import in_range, pixel_dividers, split_pixel, split_pixel_by, split_tap

# -- shared with kernels/direct_dot.py: tiles, windows, the walk over filter rows -------------


@triton.jit
def tile_coords(pid, channels, BLOCK: tl.constexpr):
    """Program id -> (pixel block or chunk, block of BLOCK channels or groups); the channel
    blocks of one pixel block are neighbours, so they share the input rows in L2."""
    c_blocks = tl.cdiv(channels, BLOCK)
    return pid // c_blocks, pid % c_blocks


@triton.jit
def band_coords(pid, channel_blocks, out_size, ROWS: tl.constexpr, BLOCK_W: tl.constexpr):
    """Program id -> (channel block, column block, image n, depth od, first output row o0,
    rows in the band) for programs that own a band of ROWS output rows of one image plane and
    BLOCK_W columns; the channel blocks of a band and column block are neighbours (they share
    its input rows in L2), then the band's column blocks."""
    od_n, oh_n, ow_n = out_size
    w_blocks = tl.cdiv(ow_n, BLOCK_W)
    pid_c = pid % channel_blocks
    pid_w = (pid // channel_blocks) % w_blocks
    band = pid // (channel_blocks * w_blocks)
    bands = tl.cdiv(oh_n, ROWS)
    o0 = (band % bands) * ROWS
    image = band // bands
    return pid_c, pid_w, image // od_n, image % od_n, o0, tl.minimum(ROWS, oh_n - o0)


@triton.jit
def pixel_block(pid_p, n_batch, size, BLOCK_P: tl.constexpr):
    """Block pid_p of BLOCK_P pixels, flat over (N, D, H, W) with (D, H, W) = size ->
    (n, d, h, w) [BLOCK_P] each, and which of them exist."""
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    n, d, h, w = split_pixel(offs_p, size)
    sd, sh, sw = size
    return n, d, h, w, offs_p < n_batch * sd * sh * sw


@triton.jit
def pixel_offset(base, n, d, h, w, strides):
    """base + the offset of pixel (n, d, h, w) through (n, c, d, h, w) strides (channel 0)."""
    s_n, s_c, s_d, s_h, s_w = strides
    return base + n * s_n + d * s_d + h * s_h + w * s_w


@triton.jit
def window_corner(od, oh, ow, stride, padding):
    """The input indices under tap 0 of output pixel (od, oh, ow)'s window (negative in the
    padding)."""
    sd, sh, sw = stride
    pd, ph, pw = padding
    return od * sd - pd, oh * sh - ph, ow * sw - pw


@triton.jit
def input_row(id0, ih0, rd, rh, dilation, in_size, p_ok):
    """Filter row (rd, rh) of the windows with corners (id0, ih0): the input indices (i_d, i_h)
    it reads, and where they lie inside the image (and p_ok)."""
    dd, dh, dw = dilation
    in_d, in_h, in_w = in_size
    i_d = id0 + rd * dd
    i_h = ih0 + rh * dh
    return i_d, i_h, p_ok & in_range(i_d, in_d) & in_range(i_h, in_h)


@triton.jit
def output_row(t_d0, t_h0, rd, rh, dilation, stride, out_size, p_ok):
    """Backward-data: filter row (rd, rh) at padded input indices (t_d0, t_h0) -> the output
    indices (o_d, o_h) it links to, and where they exist (and p_ok)."""
    dd, dh, dw = dilation
    sd, sh, sw = stride
    od_n, oh_n, ow_n = out_size
    t_d = t_d0 - rd * dd
    o_d = t_d // sd
    t_h = t_h0 - rh * dh
    o_h = t_h // sh
    row_ok = p_ok & (t_d >= 0) & (o_d * sd == t_d) & (o_d < od_n)
    return o_d, o_h, row_ok & (t_h >= 0) & (o_h * sh == t_h) & (o_h < oh_n)


@triton.jit
def over_filter_rows(
    acc, row_fn: tl.constexpr, args, consts: tl.constexpr, ROWS: tl.constexpr, UNROLL: tl.constexpr
):
    """acc after acc = row_fn(acc, t, args, consts) for each filter row t < ROWS. UNROLL (small
    filters) unrolls the rows, so that t and every tap offset are compile-time constants;
    otherwise the rows are a loop (a fully unrolled 7x7 keeps too many loads in flight and
    spills). args: a tuple of values read before the loop; consts: a tuple of constexprs (a
    tuple argument loses its constexpr leaves)."""
    if UNROLL:
        for t in tl.static_range(ROWS):
            acc = row_fn(acc, t, args, consts)
    else:
        for t in range(ROWS):
            acc = row_fn(acc, t, args, consts)
    return acc


# -- kernels -----------------------------------------------------------------------------------


@triton.jit
def input_channels(offs_k, j, CG: tl.constexpr, KG: tl.constexpr):
    """Input channel j of each output channel's group (kernels/depthwise.py uses it too).
    Depthwise (CG == KG == 1) is the identity, spelled out so that the compiler sees
    contiguous channels (vector loads)."""
    if CG == 1 and KG == 1:
        return offs_k
    else:
        return (offs_k // KG) * CG + j


@triton.jit
def _forward_row(acc, t, args, consts: tl.constexpr):
    """acc += the KW taps of filter row t = (rd, rh), every input channel of the group.
    Xc: pointers to x at each output pixel's window corner and the group's first input
    channel; Wk: to w[k, 0, 0, 0, 0]."""
    Xc, Wk, id0, ih0, iw0, p_ok, k_ok, in_size, dilation, x_strides, w_strides = args
    CG: tl.constexpr = consts[0]
    KH: tl.constexpr = consts[1]
    KW: tl.constexpr = consts[2]
    dd, dh, dw = dilation
    in_w = in_size[2]
    xs_n, xs_c, xs_d, xs_h, xs_w = x_strides
    ws_k, ws_c, ws_d, ws_h, ws_w = w_strides
    rd = t // KH
    rh = t % KH
    i_d, i_h, row_ok = input_row(id0, ih0, rd, rh, dilation, in_size, p_ok)
    for rw in tl.static_range(KW):
        i_w = iw0 + rw * dw
        mask = (row_ok & in_range(i_w, in_w))[:, None] & k_ok[None, :]
        # One offset per tap for the whole tile: the window moves, the pointers stay.
        x_tap = rd * dd * xs_d + rh * dh * xs_h + rw * dw * xs_w
        w_tap = rd * ws_d + rh * ws_h + rw * ws_w
        for j in tl.static_range(CG):
            xv = tl.load(Xc + (x_tap + j * xs_c), mask=mask, other=0.0)
            wv = tl.load(Wk + (w_tap + j * ws_c), mask=k_ok, other=0.0)
            acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    return acc


@triton.jit
def direct_forward_kernel(
    X,
    Wt,
    Y,
    BIAS,
    geo,
    K,
    alpha,
    beta,
    CG: tl.constexpr,
    KG: tl.constexpr,
    KD: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """y = act(alpha * conv(x, w) + bias + beta * y) on one tile of output pixels x channels.
    K: output channels (all groups)."""
    # Geometry fields are read into locals first (Triton 3.6 loses a NamedTuple leaf
    # specialized to 1 when it is read inside or after a loop).
    in_size, dilation = geo.in_size, geo.dilation
    x_strides, w_strides, y_strides = geo.x_strides, geo.w_strides, geo.y_strides
    x_off, w_off, y_off = geo.offsets

    pid_p, pid_c = tile_coords(tl.program_id(0), K, BLOCK_C)
    n, od, oh, ow, p_ok = pixel_block(pid_p, geo.n, geo.out_size, BLOCK_P)
    offs_k = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    k_ok = offs_k < K
    id0, ih0, iw0 = window_corner(od, oh, ow, geo.stride, geo.padding)
    corner = pixel_offset(x_off, n, id0, ih0, iw0, x_strides)
    Xc = X + corner[:, None] + (input_channels(offs_k, 0, CG, KG) * x_strides[1])[None, :]
    Wk = Wt + w_off + offs_k * w_strides[0]

    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    row_args = (Xc, Wk, id0, ih0, iw0, p_ok, k_ok, in_size, dilation, x_strides, w_strides)
    acc = over_filter_rows(acc, _forward_row, row_args, (CG, KH, KW), KD * KH, KD * KH * KW <= 9)

    y_pix = pixel_offset(y_off, n, od, oh, ow, y_strides)
    offs = y_pix[:, None] + (offs_k * y_strides[1])[None, :]
    mask = p_ok[:, None] & k_ok[None, :]
    epilogue(
        Y, offs, mask, acc, alpha, beta, BIAS, offs_k, k_ok, HAS_BIAS, BETA_NONZERO, ACTIVATION
    )


@triton.jit
def _backward_data_row(acc, t, args, consts: tl.constexpr):
    """acc += the KW taps of filter row t = (rd, rh) over the group's KG output channels.
    DYc: pointers to dy[n, first k of the group, 0]; Wc: to w[first k, c % CG, 0]; (t_d0,
    t_h0, t_w0): padded input indices."""
    DYc, Wc, t_d0, t_h0, t_w0, p_ok, c_ok, out_size, stride, dilation, y_strides, w_strides = args
    KG: tl.constexpr = consts[0]
    KH: tl.constexpr = consts[1]
    KW: tl.constexpr = consts[2]
    dw = dilation[2]
    sw = stride[2]
    ow_n = out_size[2]
    ys_n, ys_k, ys_d, ys_h, ys_w = y_strides
    ws_k, ws_c, ws_d, ws_h, ws_w = w_strides
    rd = t // KH
    rh = t % KH
    o_d, o_h, row_ok = output_row(t_d0, t_h0, rd, rh, dilation, stride, out_size, p_ok)
    for rw in tl.static_range(KW):
        t_w = t_w0 - rw * dw
        o_w = t_w // sw
        ok = row_ok & (t_w >= 0) & (o_w * sw == t_w) & (o_w < ow_n)
        mask = ok[:, None] & c_ok[None, :]
        pix = (o_d * ys_d + o_h * ys_h + o_w * ys_w)[:, None]
        w_tap = rd * ws_d + rh * ws_h + rw * ws_w
        if KG == 1:
            dyv = tl.load(DYc + pix, mask=mask, other=0.0)
            wv = tl.load(Wc + w_tap, mask=c_ok, other=0.0)
            acc += dyv.to(tl.float32) * wv.to(tl.float32)[None, :]
        else:
            for m in range(KG):
                dyv = tl.load(DYc + pix + m * ys_k, mask=mask, other=0.0)
                wv = tl.load(Wc + (w_tap + m * ws_k), mask=c_ok, other=0.0)
                acc += dyv.to(tl.float32) * wv.to(tl.float32)[None, :]
    return acc


@triton.jit
def direct_backward_data_kernel(
    DY,
    Wt,
    DX,
    geo,
    C,
    alpha,
    beta,
    CG: tl.constexpr,
    KG: tl.constexpr,
    KD: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """dx = alpha * (gradient w.r.t. x) + beta * dx on one tile of input pixels x channels.
    C: input channels (all groups). A tap reaches input pixel i when i + pad - r * dil is a
    multiple of the stride and lands inside the output; other taps are masked off."""
    in_size, out_size, stride, dilation = geo.in_size, geo.out_size, geo.stride, geo.dilation
    x_strides, w_strides, y_strides = geo.x_strides, geo.w_strides, geo.y_strides
    pd, ph, pw = geo.padding
    ws_k, ws_c, ws_d, ws_h, ws_w = w_strides
    x_off, w_off, y_off = geo.offsets

    pid_p, pid_c = tile_coords(tl.program_id(0), C, BLOCK_C)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    n, i_d, i_h, i_w, p_ok = pixel_block(pid_p, geo.n, in_size, BLOCK_P)
    # The group's first output channel, and the filter's column j = c mod CG.
    if CG == 1 and KG == 1:
        k0 = offs_c
        w_col = w_off + offs_c * ws_k
    else:
        k0 = (offs_c // CG) * KG
        w_col = w_off + (offs_c % CG) * ws_c + k0 * ws_k
    DYc = DY + (y_off + n * y_strides[0])[:, None] + (k0 * y_strides[1])[None, :]
    Wc = Wt + w_col

    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    row_args = (
        DYc, Wc, i_d + pd, i_h + ph, i_w + pw, p_ok, c_ok, out_size, stride, dilation, y_strides,
        w_strides,
    )  # fmt: skip
    acc = over_filter_rows(
        acc, _backward_data_row, row_args, (KG, KH, KW), KD * KH, KD * KH * KW <= 9
    )

    x_pix = pixel_offset(x_off, n, i_d, i_h, i_w, x_strides)
    offs = x_pix[:, None] + (offs_c * x_strides[1])[None, :]
    mask = p_ok[:, None] & c_ok[None, :]
    epilogue(DX, offs, mask, acc, alpha, beta, DX, offs_c, c_ok, False, BETA_NONZERO, identity)


@triton.jit
def direct_filter_partial_kernel(
    X,
    DY,
    WS,
    geo,
    K,
    pixels_per_chunk,
    CG: tl.constexpr,
    KG: tl.constexpr,
    KD: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    UNROLL: tl.constexpr,
):
    """Stage 1 of backward-filter: WS[chunk, k, j, tap] (float32) = the sum over this chunk's
    output pixels of dy[n, k, o] * x[n, g(k)*CG + j, o*s - p + tap*d]. K: output channels (all
    groups). The accumulator holds every (j, tap) row for BLOCK_C channels, so each output pixel
    is visited once, reading dy once and the input window from cache."""
    in_d, in_h, in_w = geo.in_size
    out_size, stride, padding = geo.out_size, geo.stride, geo.padding
    od_n, oh_n, ow_n = out_size
    dd, dh, dw = geo.dilation
    x_strides, y_strides = geo.x_strides, geo.y_strides
    xs_n, xs_c, xs_d, xs_h, xs_w = x_strides
    x_off, w_off, y_off = geo.offsets
    pixels = geo.n * od_n * oh_n * ow_n
    TAPS: tl.constexpr = KD * KH * KW

    chunk, pid_c = tile_coords(tl.program_id(0), K, BLOCK_C)
    offs_k = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    k_ok = offs_k < K
    # Rows r = j * TAPS + tap.
    r = tl.arange(0, BLOCK_R)
    r_ok = r < CG * TAPS
    j = r // TAPS
    tap = r % TAPS
    rw = tap % KW
    rh = (tap // KW) % KH
    rd = tap // (KW * KH)
    # Input offsets of each (row, channel) relative to the window's corner pixel.
    x_rc = ((offs_k // KG) * CG)[None, :] * xs_c + (
        j * xs_c + rd * dd * xs_d + rh * dh * xs_h + rw * dw * xs_w
    )[:, None]
    rk_ok = r_ok[:, None] & k_ok[None, :]
    dy_k = y_off + offs_k * y_strides[1]

    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    by_pixel = pixel_dividers(out_size)  # split_pixel_by's, made once for the loop
    start = chunk * pixels_per_chunk
    end = tl.minimum(start + pixels_per_chunk, pixels)
    for p0 in range(start, end, UNROLL):
        for u in tl.static_range(UNROLL):
            p = p0 + u
            p_ok = p < end
            n, od, oh, ow = split_pixel_by(p, by_pixel)
            dy_pix = pixel_offset(dy_k, n, od, oh, ow, y_strides)
            dyv = tl.load(DY + dy_pix, mask=k_ok & p_ok, other=0.0)
            id0, ih0, iw0 = window_corner(od, oh, ow, stride, padding)
            i_d = id0 + rd * dd
            i_h = ih0 + rh * dh
            i_w = iw0 + rw * dw
            inside = in_range(i_d, in_d) & in_range(i_h, in_h) & in_range(i_w, in_w)
            corner = pixel_offset(x_off, n, id0, ih0, iw0, x_strides)
            xv = tl.load(X + corner + x_rc, mask=rk_ok & inside[:, None] & p_ok, other=0.0)
            acc += xv.to(tl.float32) * dyv.to(tl.float32)[None, :]

    rows = CG * TAPS
    out = WS + (chunk * K + offs_k)[None, :].to(tl.int64) * rows + r[:, None]
    tl.store(out, acc, mask=rk_ok)


#: Taps along the innermost filter dim that direct_filter_rows_kernel keeps accumulators for.
MAX_ROW_TAPS = 8


@triton.jit
def _filter_tap(acc, Xc, dyv, iw0, rw: tl.constexpr, dw, in_w, xs_w, row_ok, k_ok):
    """acc += x (at filter column rw) * dy, elementwise over the tile."""
    i_w = iw0 + rw * dw
    mask = (row_ok & in_range(i_w, in_w))[:, None] & k_ok[None, :]
    xv = tl.load(Xc + (rw * dw * xs_w), mask=mask, other=0.0)
    return acc + xv.to(tl.float32) * dyv


@triton.jit
def direct_filter_rows_kernel(
    X,
    DY,
    WS,
    geo,
    K,
    pixels_per_chunk,
    CG: tl.constexpr,
    KG: tl.constexpr,
    KD: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Stage 1 of backward-filter for filters at most MAX_ROW_TAPS wide, the same partial sums
    as direct_filter_partial_kernel. A program owns (a chunk of output pixels, a block of
    output channels, one filter row (j, rd, rh)) and walks the chunk in [BLOCK_P, BLOCK_C]
    tiles: dy is read once per tile and multiplied with the KW input tiles of the row into KW
    float32 accumulators, which are summed over the pixels only at the end. The programs of
    one chunk and channel block are neighbours, so the dy and x tiles they share come from L2.
    """
    in_size, out_size, stride, padding = geo.in_size, geo.out_size, geo.stride, geo.padding
    od_n, oh_n, ow_n = out_size
    in_w = in_size[2]
    dilation = geo.dilation
    dw = dilation[2]
    x_strides, y_strides = geo.x_strides, geo.y_strides
    xs_w = x_strides[4]
    x_off, w_off, y_off = geo.offsets
    pixels = geo.n * od_n * oh_n * ow_n
    ROWS: tl.constexpr = CG * KD * KH
    TAPS: tl.constexpr = KD * KH * KW

    pid = tl.program_id(0)
    row = pid % ROWS
    chunk, pid_c = tile_coords(pid // ROWS, K, BLOCK_C)
    j = row // (KD * KH)
    rd = (row // KH) % KD
    rh = row % KH
    offs_k = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    k_ok = offs_k < K
    cx = input_channels(offs_k, j, CG, KG)
    x_chan = (cx * x_strides[1])[None, :]
    dy_chan = (y_off + offs_k * y_strides[1])[None, :]

    acc0 = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    acc4 = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    acc5 = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    acc6 = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    acc7 = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    by_pixel = pixel_dividers(out_size)  # split_pixel_by's, made once for the loop
    start = chunk * pixels_per_chunk
    end = tl.minimum(start + pixels_per_chunk, pixels)
    for p0 in range(start, end, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        p_ok = offs_p < end
        n, od, oh, ow = split_pixel_by(offs_p, by_pixel)
        dy_pix = pixel_offset(0, n, od, oh, ow, y_strides)[:, None]
        dyv = tl.load(DY + dy_pix + dy_chan, mask=p_ok[:, None] & k_ok[None, :], other=0.0)
        dyv = dyv.to(tl.float32)
        id0, ih0, iw0 = window_corner(od, oh, ow, stride, padding)
        i_d, i_h, row_ok = input_row(id0, ih0, rd, rh, dilation, in_size, p_ok)
        Xc = X + pixel_offset(x_off, n, i_d, i_h, iw0, x_strides)[:, None] + x_chan
        acc0 = _filter_tap(acc0, Xc, dyv, iw0, 0, dw, in_w, xs_w, row_ok, k_ok)
        if KW > 1:
            acc1 = _filter_tap(acc1, Xc, dyv, iw0, 1, dw, in_w, xs_w, row_ok, k_ok)
        if KW > 2:
            acc2 = _filter_tap(acc2, Xc, dyv, iw0, 2, dw, in_w, xs_w, row_ok, k_ok)
        if KW > 3:
            acc3 = _filter_tap(acc3, Xc, dyv, iw0, 3, dw, in_w, xs_w, row_ok, k_ok)
        if KW > 4:
            acc4 = _filter_tap(acc4, Xc, dyv, iw0, 4, dw, in_w, xs_w, row_ok, k_ok)
        if KW > 5:
            acc5 = _filter_tap(acc5, Xc, dyv, iw0, 5, dw, in_w, xs_w, row_ok, k_ok)
        if KW > 6:
            acc6 = _filter_tap(acc6, Xc, dyv, iw0, 6, dw, in_w, xs_w, row_ok, k_ok)
        if KW > 7:
            acc7 = _filter_tap(acc7, Xc, dyv, iw0, 7, dw, in_w, xs_w, row_ok, k_ok)

    # WS[chunk, k, j, tap] with tap = (rd * KH + rh) * KW + rw.
    out = WS + (chunk * K + offs_k).to(tl.int64) * (CG * TAPS) + j * TAPS + (rd * KH + rh) * KW
    tl.store(out, tl.sum(acc0, axis=0), mask=k_ok)
    if KW > 1:
        tl.store(out + 1, tl.sum(acc1, axis=0), mask=k_ok)
    if KW > 2:
        tl.store(out + 2, tl.sum(acc2, axis=0), mask=k_ok)
    if KW > 3:
        tl.store(out + 3, tl.sum(acc3, axis=0), mask=k_ok)
    if KW > 4:
        tl.store(out + 4, tl.sum(acc4, axis=0), mask=k_ok)
    if KW > 5:
        tl.store(out + 5, tl.sum(acc5, axis=0), mask=k_ok)
    if KW > 6:
        tl.store(out + 6, tl.sum(acc6, axis=0), mask=k_ok)
    if KW > 7:
        tl.store(out + 7, tl.sum(acc7, axis=0), mask=k_ok)


@triton.jit
def direct_filter_finish_kernel(
    WS,
    DW,
    geo,
    K,
    chunks,
    alpha,
    beta,
    CG: tl.constexpr,
    KD: tl.constexpr,
    KH: tl.constexpr,
    KW: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    BLOCK_CHUNKS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    TAP_MAJOR: tl.constexpr = False,
):
    """Stage 2 of backward-filter: dw[k, j, tap] = alpha * (the sum over chunks of
    WS[chunk, k, j, tap]) + beta * dw, written through dw's strides; with TAP_MAJOR the
    partial sums are WS[chunk, tap, k, j] (kernels/direct_dot.direct_dot_filter_taps_kernel).

    A program owns BLOCK_E consecutive (k, j, tap) elements and reads BLOCK_CHUNKS chunks of
    them per step, so that even a small filter (a few hundred elements) over hundreds of chunks
    keeps many loads in flight. Lane c of the chunk axis adds chunks c, c + BLOCK_CHUNKS, ...
    in order and the lanes are then added by tl.sum's fixed tree: the same sum on every run."""
    ws_k, ws_c, ws_d, ws_h, ws_w = geo.w_strides
    w_off = geo.offsets[1]
    TAPS: tl.constexpr = KD * KH * KW
    total = K * (CG * TAPS)
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < total
    lanes = tl.arange(0, BLOCK_CHUNKS)
    acc = tl.zeros((BLOCK_CHUNKS, BLOCK_E), dtype=tl.float32)
    for c0 in range(0, chunks, BLOCK_CHUNKS):
        c = c0 + lanes
        part = WS + (c.to(tl.int64) * total)[:, None] + e[None, :]
        acc += tl.load(part, mask=(c < chunks)[:, None] & e_ok[None, :], other=0.0)
    if TAP_MAJOR:
        tap = e // (K * CG)
        k = e // CG % K
        j = e % CG
    else:
        k = e // (CG * TAPS)
        j = e // TAPS % CG
        tap = e % TAPS
    rd, rh, rw = split_tap(tap, (KD, KH, KW))
    offs = w_off + k * ws_k + j * ws_c + rd * ws_d + rh * ws_h + rw * ws_w
    epilogue(
        DW, offs, e_ok, tl.sum(acc, axis=0), alpha, beta, DW, e, e_ok, False, BETA_NONZERO,
        identity,
    )  # fmt: skip
