"""DIRECT on tensor cores: few channels per group as block-diagonal tile products.

A depthwise or narrow grouped convolution gives each group a GEMM too thin for a tensor-core
tile (one output column for depthwise). These kernels put SG neighbouring groups side by side
in one tile of channel "lanes" and multiply, per filter tap, a [BLOCK_P, BLOCK_I] tile of
activations by a [BLOCK_I, BLOCK_O] block-diagonal tile of the filter: block g holds group g's
[CG, KG] weights of that tap, everything off the diagonal is zero. The zeros cost tensor-core
work (BLOCK_I / CG times the useful products), which the tensor cores have to spare on these
memory-bound layers, and save what limits the FMA kernels (kernels/direct.py): one convert,
address and FMA per tap and element. The activation tiles are read as in the FMA kernels
(contiguous lanes in channels-last, any strides), the taps are a batch-reduce over filter taps.

Forward and backward-data read the block-diagonal tiles from a copy packed once per call
(pack_block_diagonal_kernel), zeros included, in the order the products read them: a filter
row's tile is one contiguous, unmasked block, read with vector loads. Gathered from w itself
it took a masked 2-byte load and a shared-memory store per element, and the L1 unit was the
bottleneck of the whole kernel (ncu, H200: 93% busy at 13% of DRAM bandwidth).

Lanes of super-group s: input channel c = s * SG * CG + a for lane a < SG * CG, output channel
k = s * SG * KG + b for lane b < SG * KG; lane a and lane b meet on the diagonal when
a // CG == b // KG, where the filter element is w[k, a - (b // KG) * CG, tap].

    forward          y[p, b]   += x[p @ tap, a] . B_tap[a, b]
    backward-data    dx[p, a]  += dy[p @ tap, b] . B_tap[a, b]   (B transposed)
    backward-filter  B_tap[a, b] += sum_p x[p @ tap, a] * dy[p, b]  (diagonal blocks kept)

Forward also has a ring of output rows (direct_dot_rows_forward_kernel): programs own bands of
rows and load each input row once for every filter row it meets, where the flat tiles load it
once per filter row.

16-bit inputs only (products exact, float32 accumulation); UPCAST converts the tiles to float32
under Triton's interpreter, whose bfloat16 tl.dot is wrong.
"""

import triton
import triton.language as tl

from .brgemm import epilogue, identity
from .conv_addressing import in_range, pixel_dividers, split_pixel_by
from .direct import (
    band_coords,
    input_row,
    output_row,
    over_filter_rows,
    pixel_block,
    pixel_offset,
    tile_coords,
    window_corner,
)

#: Filter rows (KD x KH) up to which the ring holds every row's filter tile in registers.
MAX_HOISTED_ROWS = tl.constexpr(5)


@triton.jit
def _lanes(s, C, K, CG: tl.constexpr, KG: tl.constexpr, SG: tl.constexpr,
           BLOCK_I: tl.constexpr, BLOCK_O: tl.constexpr):  # fmt: skip
    """Super-group s -> input channels c [BLOCK_I], output channels k [BLOCK_O], their
    validity, and the block-diagonal mask [BLOCK_I, BLOCK_O] with each element's filter
    column j (valid where the mask is)."""
    a = tl.arange(0, BLOCK_I)
    b = tl.arange(0, BLOCK_O)
    c = s * (SG * CG) + a
    k = s * (SG * KG) + b
    a_ok = (a < SG * CG) & (c < C)
    b_ok = (b < SG * KG) & (k < K)
    diag = ((a // CG)[:, None] == (b // KG)[None, :]) & a_ok[:, None] & b_ok[None, :]
    j = a[:, None] - (b // KG * CG)[None, :]
    return c, k, a_ok, b_ok, diag, j


@triton.jit
def pack_block_diagonal_kernel(
    W, P, geo, C, K, total,
    CG: tl.constexpr, KG: tl.constexpr, SG: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    KWP: tl.constexpr, ROWS: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_O: tl.constexpr,
    TRANSPOSED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """P[s, t, rw, a, b] = the block-diagonal filter tile of super-group s at filter row t =
    (rd, rh) and column rw (see the module docstring), zero off the diagonal, past the filter
    (rw >= KW) and past the channels; P[s, t, rw, b, a] when TRANSPOSED (backward-data). w is
    read through geo's filter strides, so any view (a flipped one in convolution mode) packs."""
    ws_k, ws_c, ws_d, ws_h, ws_w = geo.w_strides
    TILE: tl.constexpr = KWP * BLOCK_I * BLOCK_O
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_p = offs < total
    st = offs // TILE
    e = offs % TILE
    s = st // ROWS
    t = st % ROWS
    rw = e // (BLOCK_I * BLOCK_O)
    if TRANSPOSED:
        b = e // BLOCK_I % BLOCK_O
        a = e % BLOCK_I
    else:
        a = e // BLOCK_O % BLOCK_I
        b = e % BLOCK_O
    c = s * (SG * CG) + a
    k = s * (SG * KG) + b
    ok = in_p & (a < SG * CG) & (b < SG * KG) & (c < C) & (k < K) & (rw < KW)
    ok &= a // CG == b // KG
    j = a - b // KG * CG
    w_at = k * ws_k + j * ws_c + t // KH * ws_d + t % KH * ws_h + rw * ws_w
    w = tl.load(W + geo.offsets[1] + w_at, mask=ok, other=0.0)
    tl.store(P + offs, w, mask=in_p)


@triton.jit
def _row_tile(Ps, t, ROWS_IN: tl.constexpr, COLS: tl.constexpr):
    """Filter row t's packed tile [ROWS_IN, COLS] of one super-group (Ps: its first tile)."""
    r = tl.arange(0, ROWS_IN)
    q = tl.arange(0, COLS)
    return tl.load(Ps + t * (ROWS_IN * COLS) + r[:, None] * COLS + q[None, :])


@triton.jit
def _forward_row(acc, t, args, consts: tl.constexpr):
    """acc += the taps of filter row t = (rd, rh) as one product: the row's KW input tiles side
    by side ([BLOCK_P, KWP * BLOCK_I], taps past KW zero) times their filter tiles stacked.
    Xc: x at each output pixel's window corner and each lane's input channel [BLOCK_P,
    BLOCK_I]; Ps: the super-group's packed filter tiles."""
    (Xc, Ps, id0, ih0, iw0, p_ok, a_ok, in_size, dilation, x_strides) = args  # fmt: skip
    KH: tl.constexpr = consts[0]
    KW: tl.constexpr = consts[1]
    KWP: tl.constexpr = consts[2]
    BLOCK_P: tl.constexpr = consts[3]
    BLOCK_I: tl.constexpr = consts[4]
    BLOCK_O: tl.constexpr = consts[5]
    UPCAST: tl.constexpr = consts[6]
    dd, dh, dw = dilation
    in_w = in_size[2]
    xs_n, xs_c, xs_d, xs_h, xs_w = x_strides
    rd = t // KH
    rh = t % KH
    i_d, i_h, row_ok = input_row(id0, ih0, rd, rh, dilation, in_size, p_ok)
    rw = tl.arange(0, KWP)
    i_w = iw0[:, None] + (rw * dw)[None, :]
    ok = row_ok[:, None] & in_range(i_w, in_w) & (rw < KW)[None, :]
    x_tap = rd * dd * xs_d + rh * dh * xs_h + rw * dw * xs_w
    xv = tl.load(
        Xc[:, None, :] + x_tap[None, :, None], mask=ok[:, :, None] & a_ok[None, None, :], other=0.0
    )
    wv = _row_tile(Ps, t, KWP * BLOCK_I, BLOCK_O)
    xv = tl.reshape(xv, (BLOCK_P, KWP * BLOCK_I))
    if UPCAST:
        xv = xv.to(tl.float32)
        wv = wv.to(tl.float32)
    return tl.dot(xv, wv, acc)


@triton.jit
def direct_dot_forward_kernel(
    X, Wt, Y, BIAS, geo, C, K, groups, alpha, beta,
    CG: tl.constexpr, KG: tl.constexpr, SG: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr,
    KW: tl.constexpr, KWP: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
    BETA_NONZERO: tl.constexpr, UPCAST: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_I: tl.constexpr, BLOCK_O: tl.constexpr,
):  # fmt: skip
    """y = act(alpha * conv(x, w) + bias + beta * y) on BLOCK_P output pixels x the output
    lanes of one super-group of SG groups; Wt: w's tiles from pack_block_diagonal_kernel."""
    # Geometry fields are read into locals first (Triton 3.6 loses a NamedTuple leaf
    # specialized to 1 when it is read inside or after a loop).
    in_size, dilation = geo.in_size, geo.dilation
    x_strides, y_strides = geo.x_strides, geo.y_strides
    x_off, _, y_off = geo.offsets

    pid_p, s = tile_coords(tl.program_id(0), groups, SG)
    c, k, a_ok, b_ok, _, _ = _lanes(s, C, K, CG, KG, SG, BLOCK_I, BLOCK_O)
    n, od, oh, ow, p_ok = pixel_block(pid_p, geo.n, geo.out_size, BLOCK_P)
    id0, ih0, iw0 = window_corner(od, oh, ow, geo.stride, geo.padding)
    corner = pixel_offset(x_off, n, id0, ih0, iw0, x_strides)
    Xc = X + corner[:, None] + (c * x_strides[1])[None, :]
    Ps = Wt + s * (KD * KH * KWP * BLOCK_I * BLOCK_O)

    acc = tl.zeros((BLOCK_P, BLOCK_O), dtype=tl.float32)
    row_args = (Xc, Ps, id0, ih0, iw0, p_ok, a_ok, in_size, dilation, x_strides)
    consts: tl.constexpr = (KH, KW, KWP, BLOCK_P, BLOCK_I, BLOCK_O, UPCAST)
    acc = over_filter_rows(acc, _forward_row, row_args, consts, KD * KH, KD * KH * KW <= 9)

    y_pix = pixel_offset(y_off, n, od, oh, ow, y_strides)
    offs = y_pix[:, None] + (k * y_strides[1])[None, :]
    mask = p_ok[:, None] & b_ok[None, :]
    epilogue(Y, offs, mask, acc, alpha, beta, BIAS, k, b_ok, HAS_BIAS, BETA_NONZERO, ACTIVATION)


@triton.jit
def _ring_products(accs, xv, tiles, Ps, rd: tl.constexpr, u: tl.constexpr, consts: tl.constexpr):
    """The ring after input row u of depth plane rd: slot j += the row's tile xv [BLOCK_W, KWP
    * BLOCK_I] times filter row u + (D - j) * S of plane rd, where that is a row of the filter.
    tiles: the filter rows' tiles when hoisted (HOIST), else read from Ps."""
    KH: tl.constexpr = consts[0]
    KWP: tl.constexpr = consts[1]
    BLOCK_I: tl.constexpr = consts[2]
    BLOCK_O: tl.constexpr = consts[3]
    S: tl.constexpr = consts[4]
    D: tl.constexpr = consts[5]
    HOIST: tl.constexpr = consts[6]
    UPCAST: tl.constexpr = consts[7]
    if UPCAST:
        xv = xv.to(tl.float32)
    out = ()
    for j in tl.static_range(D + 1):
        acc = accs[j]
        if u + (D - j) * S < KH:
            if HOIST:
                wv = tiles[rd * KH + u + (D - j) * S]
            else:
                wv = _row_tile(Ps, rd * KH + u + (D - j) * S, KWP * BLOCK_I, BLOCK_O)
            if UPCAST:
                wv = wv.to(tl.float32)
            acc = tl.dot(xv, wv, acc)
        out = out + (acc,)
    return out


@triton.jit
def direct_dot_rows_forward_kernel(
    X, Wt, Y, BIAS, geo, C, K, groups, alpha, beta,
    CG: tl.constexpr, KG: tl.constexpr, SG: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr,
    KW: tl.constexpr, KWP: tl.constexpr, S: tl.constexpr, ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr, BETA_NONZERO: tl.constexpr, UPCAST: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_O: tl.constexpr,
):  # fmt: skip
    """The forward of direct_dot_forward_kernel by rows: a program owns a band of ROWS output
    rows of one image (n, od), BLOCK_W columns and one super-group, and rolls a ring of output
    row accumulators down the band (stride S and dilation 1 along H, any along D and W), as
    kernels/depthwise.py's forward does with FMAs. Each input row's tile [BLOCK_W, KWP *
    BLOCK_I] is loaded once and multiplied by the filter rows of every output row whose
    window holds it (about KH / S), where the flat kernel loads it once per filter row: its
    loads, 32-byte pieces of a pixel per tap, kept the L1 unit 88% busy (ncu, ResNeXt-50's
    g128.56 layer, H200) at 12% of DRAM bandwidth."""
    in_d, in_h, in_w = geo.in_size
    od_n, oh_n, ow_n = geo.out_size
    sd, sh, sw = geo.stride
    pd, ph, pw = geo.padding
    dd, dh, dw = geo.dilation
    xs_n, xs_c, xs_d, xs_h, xs_w = geo.x_strides
    ys_n, ys_k, ys_d, ys_h, ys_w = geo.y_strides
    x_off, _, y_off = geo.offsets
    # Output row o needs input rows o * S - ph + rh: a finished row waits for D more steps.
    D: tl.constexpr = (KH + S - 1) // S - 1

    s_blocks = tl.cdiv(groups, SG)
    s, pid_w, n, od, o0, rows = band_coords(tl.program_id(0), s_blocks, geo.out_size, ROWS, BLOCK_W)

    c, k, a_ok, b_ok, _, _ = _lanes(s, C, K, CG, KG, SG, BLOCK_I, BLOCK_O)
    ow = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    w_ok = ow < ow_n
    rw = tl.arange(0, KWP)
    i_w = (ow * sw - pw)[:, None] + (rw * dw)[None, :]
    # Which (column, tap, lane) of an input row's tile exist: the same for every row.
    tile_ok = w_ok[:, None] & in_range(i_w, in_w) & (rw < KW)[None, :]
    tile_ok = tile_ok[:, :, None] & a_ok[None, None, :]
    Xtile = X + x_off + n * xs_n + (i_w * xs_w)[:, :, None] + (c * xs_c)[None, None, :]
    Ps = Wt + s * (KD * KH * KWP * BLOCK_I * BLOCK_O)
    y_cols = (y_off + n * ys_n + od * ys_d + ow * ys_w)[:, None] + (k * ys_k)[None, :]
    y_mask = w_ok[:, None] & b_ok[None, :]

    # The filter rows' tiles, loaded once per program where they are few: reloaded at every
    # step they were about half of the ring's L1 sectors (ncu, g128.56, H100).
    HOIST: tl.constexpr = KD * KH <= MAX_HOISTED_ROWS
    tiles = ()
    if HOIST:
        for r in tl.static_range(KD * KH):
            tiles = tiles + (_row_tile(Ps, r, KWP * BLOCK_I, BLOCK_O),)

    # Step t reads input rows i0 + u (u < S), i0 = (o0 + t) * S - ph. Ring slot j holds
    # output row o0 + t - D + j, which meets input row u as filter row u + (D - j) * S; after
    # the step slot 0 has met all its filter rows. Slots of rows before the band take
    # products that are never stored.
    accs = (tl.zeros((BLOCK_W, BLOCK_O), dtype=tl.float32),) * (D + 1)
    consts: tl.constexpr = (KH, KWP, BLOCK_I, BLOCK_O, S, D, HOIST, UPCAST)
    for t in range(rows + D):
        i0 = (o0 + t) * S - ph
        for rd in tl.static_range(KD):
            i_d = od * sd - pd + rd * dd
            for u in tl.static_range(S):
                # Rows of zero padding above and below the image are skipped.
                if in_range(i_d, in_d) & in_range(i0 + u, in_h):
                    xv = tl.load(Xtile + (i_d * xs_d + (i0 + u) * xs_h), mask=tile_ok, other=0.0)
                    xv = tl.reshape(xv, (BLOCK_W, KWP * BLOCK_I))
                    accs = _ring_products(accs, xv, tiles, Ps, rd, u, consts)
        if t >= D:
            epilogue(
                Y, y_cols + (o0 + t - D) * ys_h, y_mask, accs[0], alpha, beta, BIAS, k, b_ok,
                HAS_BIAS, BETA_NONZERO, ACTIVATION,
            )  # fmt: skip
        accs = accs[1:] + (tl.zeros((BLOCK_W, BLOCK_O), dtype=tl.float32),)


@triton.jit
def _backward_data_row(acc, t, args, consts: tl.constexpr):
    """acc += the taps of filter row t = (rd, rh) as one product ([BLOCK_P, KWP * BLOCK_O] dy
    tiles side by side times the transposed filter tiles stacked). DYn: dy at each pixel's
    image and each output lane's channel; Ps: the super-group's packed transposed tiles;
    (t_d0, t_h0, t_w0): padded input indices; (phase_d, phase_h): with PHASED, the padded
    input index modulo the stride shared by every pixel of the block, so that a row no pixel
    can reach is skipped."""
    (DYn, Ps, t_d0, t_h0, t_w0, p_ok, b_ok, out_size, stride, dilation, y_strides, phase_d,
     phase_h) = args  # fmt: skip
    KH: tl.constexpr = consts[0]
    KW: tl.constexpr = consts[1]
    KWP: tl.constexpr = consts[2]
    BLOCK_P: tl.constexpr = consts[3]
    BLOCK_I: tl.constexpr = consts[4]
    BLOCK_O: tl.constexpr = consts[5]
    UPCAST: tl.constexpr = consts[6]
    PHASED: tl.constexpr = consts[7]
    dd, dh, dw = dilation
    sd, sh, sw = stride
    ow_n = out_size[2]
    ys_n, ys_k, ys_d, ys_h, ys_w = y_strides
    rd = t // KH
    rh = t % KH
    live = True
    if PHASED:
        live = ((phase_d - rd * dd) % sd == 0) & ((phase_h - rh * dh) % sh == 0)
    if live:
        o_d, o_h, row_ok = output_row(t_d0, t_h0, rd, rh, dilation, stride, out_size, p_ok)
        rw = tl.arange(0, KWP)
        t_w = t_w0[:, None] - (rw * dw)[None, :]
        o_w = t_w // sw
        ok = row_ok[:, None] & (t_w >= 0) & (o_w * sw == t_w) & (o_w < ow_n)
        ok = ok & (rw < KW)[None, :]
        pix = (o_d * ys_d + o_h * ys_h)[:, None] + o_w * ys_w
        dyv = tl.load(
            DYn[:, None, :] + pix[:, :, None],
            mask=ok[:, :, None] & b_ok[None, None, :],
            other=0.0,
        )
        wv = _row_tile(Ps, t, KWP * BLOCK_O, BLOCK_I)
        dyv = tl.reshape(dyv, (BLOCK_P, KWP * BLOCK_O))
        if UPCAST:
            dyv = dyv.to(tl.float32)
            wv = wv.to(tl.float32)
        acc = tl.dot(dyv, wv, acc)
    return acc


@triton.jit
def direct_dot_backward_data_kernel(
    DY, Wt, DX, geo, C, K, groups, alpha, beta,
    CG: tl.constexpr, KG: tl.constexpr, SG: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr,
    KW: tl.constexpr, KWP: tl.constexpr, BETA_NONZERO: tl.constexpr, UPCAST: tl.constexpr,
    PHASED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_O: tl.constexpr,
):  # fmt: skip
    """dx = alpha * (gradient w.r.t. x) + beta * dx on BLOCK_P input pixels x the input lanes
    of one super-group; Wt: w's transposed tiles from pack_block_diagonal_kernel. A tap reaches
    input pixel i when i + pad - r * dil is a multiple of the stride and lands inside the
    output; other taps load zeros.

    PHASED (a stride above 1): the input pixels are walked by stride phase, each block holding
    pixels of one residue modulo the stride (sd * sh * sw phases of cdiv(size, stride) pixels
    each, the ones past the image masked), so that every pixel of a block reaches the same
    filter rows, and a program skips the rows none of them reaches: at stride 2 about half of
    a 3x3 filter's rows, where an unphased block multiplies zeros."""
    in_size, out_size, stride, dilation = geo.in_size, geo.out_size, geo.stride, geo.dilation
    x_strides, y_strides = geo.x_strides, geo.y_strides
    pd, ph, pw = geo.padding
    x_off, _, y_off = geo.offsets

    pid_p, s = tile_coords(tl.program_id(0), groups, SG)
    c, k, a_ok, b_ok, _, _ = _lanes(s, C, K, CG, KG, SG, BLOCK_I, BLOCK_O)
    if PHASED:
        sd, sh, sw = stride
        in_d, in_h, in_w = in_size
        sub = (tl.cdiv(in_d, sd), tl.cdiv(in_h, sh), tl.cdiv(in_w, sw))
        per_phase = tl.cdiv(geo.n * sub[0] * sub[1] * sub[2], BLOCK_P)
        phase = pid_p // per_phase
        a_d = phase // (sh * sw)
        a_h = (phase // sw) % sh
        a_w = phase % sw
        n, q_d, q_h, q_w, p_ok = pixel_block(pid_p % per_phase, geo.n, sub, BLOCK_P)
        i_d = q_d * sd + a_d
        i_h = q_h * sh + a_h
        i_w = q_w * sw + a_w
        p_ok = p_ok & (i_d < in_d) & (i_h < in_h) & (i_w < in_w)
        phase_d = a_d + pd
        phase_h = a_h + ph
    else:
        n, i_d, i_h, i_w, p_ok = pixel_block(pid_p, geo.n, in_size, BLOCK_P)
        phase_d = 0
        phase_h = 0
    DYn = DY + (y_off + n * y_strides[0])[:, None] + (k * y_strides[1])[None, :]
    Ps = Wt + s * (KD * KH * KWP * BLOCK_O * BLOCK_I)

    acc = tl.zeros((BLOCK_P, BLOCK_I), dtype=tl.float32)
    row_args = (
        DYn, Ps, i_d + pd, i_h + ph, i_w + pw, p_ok, b_ok, out_size, stride, dilation, y_strides,
        phase_d, phase_h,
    )  # fmt: skip
    consts: tl.constexpr = (KH, KW, KWP, BLOCK_P, BLOCK_I, BLOCK_O, UPCAST, PHASED)
    acc = over_filter_rows(acc, _backward_data_row, row_args, consts, KD * KH, KD * KH * KW <= 9)

    x_pix = pixel_offset(x_off, n, i_d, i_h, i_w, x_strides)
    offs = x_pix[:, None] + (c * x_strides[1])[None, :]
    mask = p_ok[:, None] & a_ok[None, :]
    epilogue(DX, offs, mask, acc, alpha, beta, DX, c, a_ok, False, BETA_NONZERO, identity)


@triton.jit
def direct_dot_filter_rows_kernel(
    X, DY, WS, geo, C, K, groups, pixels_per_chunk,
    CG: tl.constexpr, KG: tl.constexpr, SG: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr,
    KW: tl.constexpr, KWP: tl.constexpr, UPCAST: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_I: tl.constexpr, BLOCK_O: tl.constexpr,
):  # fmt: skip
    """Stage 1 of backward-filter: WS[chunk, k, j, tap] (float32) = the sum over this chunk's
    output pixels of dy[n, k, o] * x[n, g(k)*CG + j, o*s - p + tap*d], the same partial sums
    as kernels/direct.py's, so its finish kernel adds them up. A program owns (a chunk, a
    super-group, one filter row (rd, rh)) and walks the chunk in BLOCK_P pixel tiles: per tile
    one product of the row's input tiles side by side ([BLOCK_P, KWP * BLOCK_I], transposed)
    with the dy tile, into a [KWP * BLOCK_I, BLOCK_O] accumulator whose diagonal blocks are
    the row's filter taps."""
    in_size, out_size, stride, padding = geo.in_size, geo.out_size, geo.stride, geo.padding
    od_n, oh_n, ow_n = out_size
    in_w = in_size[2]
    dilation = geo.dilation
    dw = dilation[2]
    x_strides, y_strides = geo.x_strides, geo.y_strides
    xs_n, xs_c, xs_d, xs_h, xs_w = x_strides
    x_off, w_off, y_off = geo.offsets
    pixels = geo.n * od_n * oh_n * ow_n
    ROWS: tl.constexpr = KD * KH
    TAPS: tl.constexpr = KD * KH * KW

    pid = tl.program_id(0)
    row = pid % ROWS
    chunk, s = tile_coords(pid // ROWS, groups, SG)
    rd = row // KH
    rh = row % KH
    c, k, a_ok, b_ok, diag, j = _lanes(s, C, K, CG, KG, SG, BLOCK_I, BLOCK_O)
    rw = tl.arange(0, KWP)
    x_lane = (rw * dw * xs_w)[:, None] + (c * xs_c)[None, :]
    lane_ok = (rw < KW)[:, None] & a_ok[None, :]
    dy_chan = (y_off + k * y_strides[1])[None, :]

    acc = tl.zeros((KWP * BLOCK_I, BLOCK_O), dtype=tl.float32)
    by_pixel = pixel_dividers(out_size)  # split_pixel_by's, made once for the loop
    start = chunk * pixels_per_chunk
    end = tl.minimum(start + pixels_per_chunk, pixels)
    for p0 in range(start, end, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        p_ok = offs_p < end
        n, od, oh, ow = split_pixel_by(offs_p, by_pixel)
        dy_pix = pixel_offset(0, n, od, oh, ow, y_strides)[:, None]
        dyv = tl.load(DY + dy_pix + dy_chan, mask=p_ok[:, None] & b_ok[None, :], other=0.0)
        id0, ih0, iw0 = window_corner(od, oh, ow, stride, padding)
        i_d, i_h, row_ok = input_row(id0, ih0, rd, rh, dilation, in_size, p_ok)
        i_w = iw0[:, None] + (rw * dw)[None, :]
        ok = row_ok[:, None] & in_range(i_w, in_w)
        corner = pixel_offset(x_off, n, i_d, i_h, iw0, x_strides)
        xv = tl.load(
            X + corner[:, None, None] + x_lane[None, :, :],
            mask=ok[:, :, None] & lane_ok[None, :, :],
            other=0.0,
        )
        xv = tl.reshape(xv, (BLOCK_P, KWP * BLOCK_I))
        if UPCAST:
            xv = xv.to(tl.float32)
            dyv = dyv.to(tl.float32)
        acc = tl.dot(tl.trans(xv), dyv, acc)

    # WS[chunk, k, j, tap] with tap = (rd * KH + rh) * KW + rw; only the diagonal blocks.
    out = (chunk * K + k)[None, :].to(tl.int64) * (CG * TAPS) + j * TAPS + (rd * KH + rh) * KW
    acc = tl.reshape(acc, (KWP, BLOCK_I, BLOCK_O))
    mask = diag[None, :, :] & (rw < KW)[:, None, None]
    tl.store(WS + out[None, :, :] + rw[:, None, None], acc, mask=mask)


@triton.jit
def direct_dot_filter_taps_kernel(
    X, DY, WS, geo, C, K, groups, pixels_per_chunk,
    CG: tl.constexpr, KG: tl.constexpr, SG: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr,
    KW: tl.constexpr, UPCAST: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_I: tl.constexpr,
    BLOCK_O: tl.constexpr,
):  # fmt: skip
    """Stage 1 of backward-filter with one accumulator per filter tap, for wider groups: the
    partial sums of direct_dot_filter_rows_kernel, tap-major (WS[chunk, tap, k, j], float32).
    A program owns (a chunk, a super-group, one filter row (rd, rh)) and walks the chunk in
    BLOCK_P pixel tiles: per tile it loads dy once and, for each of the row's KW taps, the
    input tile under that tap ([BLOCK_P, BLOCK_I], a plain 2-D tile that the pipeliner
    streams), and adds x_tap^T dy into the tap's [BLOCK_I, BLOCK_O] accumulator. The
    implicit GEMM reads dy once per tap; this reads it once per filter row: these layers'
    operands live in L2, whose bandwidth sets their time."""
    in_size, out_size, stride, padding = geo.in_size, geo.out_size, geo.stride, geo.padding
    od_n, oh_n, ow_n = out_size
    in_w = in_size[2]
    dilation = geo.dilation
    dw = dilation[2]
    x_strides, y_strides = geo.x_strides, geo.y_strides
    x_off, w_off, y_off = geo.offsets
    pixels = geo.n * od_n * oh_n * ow_n
    ROWS: tl.constexpr = KD * KH
    TAPS: tl.constexpr = KD * KH * KW

    pid = tl.program_id(0)
    row = pid % ROWS
    chunk, s = tile_coords(pid // ROWS, groups, SG)
    c, k, a_ok, b_ok, diag, j = _lanes(s, C, K, CG, KG, SG, BLOCK_I, BLOCK_O)
    x_lane = (c * x_strides[1])[None, :]
    dy_chan = (y_off + k * y_strides[1])[None, :]

    accs = (tl.zeros((BLOCK_I, BLOCK_O), dtype=tl.float32),) * KW
    by_pixel = pixel_dividers(out_size)
    start = chunk * pixels_per_chunk
    end = tl.minimum(start + pixels_per_chunk, pixels)
    for p0 in range(start, end, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        p_ok = offs_p < end
        n, od, oh, ow = split_pixel_by(offs_p, by_pixel)
        dy_pix = pixel_offset(0, n, od, oh, ow, y_strides)[:, None]
        dyv = tl.load(DY + dy_pix + dy_chan, mask=p_ok[:, None] & b_ok[None, :], other=0.0)
        if UPCAST:
            dyv = dyv.to(tl.float32)
        id0, ih0, iw0 = window_corner(od, oh, ow, stride, padding)
        i_d, i_h, row_ok = input_row(id0, ih0, row // KH, row % KH, dilation, in_size, p_ok)
        x_row = pixel_offset(x_off, n, i_d, i_h, 0, x_strides)
        out = ()
        for rw in tl.static_range(KW):
            i_w = iw0 + rw * dw
            ok = row_ok & in_range(i_w, in_w)
            x_pix = (x_row + i_w * x_strides[4])[:, None]
            xv = tl.load(X + x_pix + x_lane, mask=ok[:, None] & a_ok[None, :], other=0.0)
            if UPCAST:
                xv = xv.to(tl.float32)
            out = out + (tl.dot(tl.trans(xv), dyv, accs[rw]),)
        accs = out

    # WS[chunk, tap, k, j] with tap = row * KW + rw, only the diagonal blocks: a super-group's
    # blocks are one contiguous piece per tap (the finish reads them TAP_MAJOR). Scattered
    # [chunk, k, j, tap] stores took as long as the products.
    tap0 = (chunk * TAPS + row * KW).to(tl.int64)
    block = k[None, :] * CG + j
    for rw in tl.static_range(KW):
        tl.store(WS + (tap0 + rw) * (K * CG) + block, accs[rw], mask=diag)


# -- super-groups as dense groups: the block-diagonal filter for the implicit GEMM -------------
# The "gemm" tiles of DIRECT run a grouped convolution of CG channels per group as one of WIDTH
# channels per group (PER = WIDTH / CG groups side by side), through the implicit GEMM, whose
# pipelined tiles read their operands better than the tensor-core tiles above. Its filter is
# w made block-diagonal: wide[k, tap, a] = w[k, a - (g % PER) * CG, tap] for the lanes a of
# output channel k's group g, zero elsewhere, stored channels-last with dense taps.


@triton.jit
def _wide_element(offs, total, CG: tl.constexpr, KG: tl.constexpr, WIDTH: tl.constexpr,
                  TAPS: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr):  # fmt: skip
    """Element offs of wide [K, TAPS, WIDTH] -> (k, j, td, th, tw, inside): its output
    channel, input channel within the group, tap, and whether it lies on the diagonal."""
    a = offs % WIDTH
    t = offs // WIDTH % TAPS
    k = offs // (WIDTH * TAPS)
    j = a - (k // KG) % (WIDTH // CG) * CG
    inside = (offs < total) & (j >= 0) & (j < CG)
    return k, j, t // (KH * KW), t // KW % KH, t % KW, inside


@triton.jit
def widen_filter_kernel(
    W, WIDE, w_strides, w_offset, total,
    CG: tl.constexpr, KG: tl.constexpr, WIDTH: tl.constexpr, TAPS: tl.constexpr,
    KH: tl.constexpr, KW: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """WIDE = w made block-diagonal (see above), zeros included; w read through its strides
    (k, c, d, h, w) as stored, any view."""
    ws_k, ws_c, ws_d, ws_h, ws_w = w_strides
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    k, j, td, th, tw, inside = _wide_element(offs, total, CG, KG, WIDTH, TAPS, KH, KW)
    at = w_offset + k * ws_k + j * ws_c + td * ws_d + th * ws_h + tw * ws_w
    w = tl.load(W + at, mask=inside, other=0.0)
    tl.store(WIDE + offs, w, mask=offs < total)


@triton.jit
def narrow_filter_kernel(
    WIDE, DW, w_strides, w_offset, total, alpha, beta,
    CG: tl.constexpr, KG: tl.constexpr, WIDTH: tl.constexpr, TAPS: tl.constexpr,
    KH: tl.constexpr, KW: tl.constexpr, BETA_NONZERO: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """dw = alpha * (the diagonal blocks of WIDE, a block-diagonal filter's gradient) + beta *
    dw, through dw's strides; WIDE is float32. Walks WIDE's elements and keeps those on the
    diagonal, so that each dw element is written once."""
    ws_k, ws_c, ws_d, ws_h, ws_w = w_strides
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    k, j, td, th, tw, inside = _wide_element(offs, total, CG, KG, WIDTH, TAPS, KH, KW)
    at = w_offset + k * ws_k + j * ws_c + td * ws_d + th * ws_h + tw * ws_w
    out = alpha * tl.load(WIDE + offs, mask=inside, other=0.0)
    if BETA_NONZERO:
        out += beta * tl.load(DW + at, mask=inside, other=0.0).to(tl.float32)
    tl.store(DW + at, out.to(DW.dtype.element_ty), mask=inside)
