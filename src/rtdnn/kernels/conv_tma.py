"""Convolution at stride 1 with operands read by the Hopper tensor memory accelerator (TMA):
forward and backward-data.

The batch-reduce GEMM of conv_addressing (rows: pixels written, columns: channels written in a
group, steps: (filter tap, chunk of reduced channels), one batch entry per group), with its
operands loaded through tensor descriptors instead of per-element pointers:

    A  a box [BOX_N, 1, BOX_H, BOX_W, BLOCK_K] of the tensor read (x in forward, dy in
       backward-data), viewed as (N, D, H, W, C) channels-last: at stride 1 the pixels that
       filter tap r links to a rectangle of written pixels are themselves a rectangle, shifted
       by -padding + r * dilation (forward) or +padding - r * dilation (backward-data).
       Coordinates outside the image read as zeros, filled in by the hardware: no masks and no
       index arithmetic per element.
    B  a box of w, viewed as (K, taps * C/g): a dense channels-last filter holds each output
       channel's taps and input channels contiguously. Forward reads [BLOCK_N, BLOCK_K] (output
       channels x input channels) and transposes it; backward-data reads [BLOCK_K, BLOCK_N]
       (output channels, now reduced, x input channels) as it is.

A row tile is therefore a rectangle of written pixels, BOX_N images x BOX_H rows x BOX_W
columns (BLOCK_M = their product), not a run of consecutive pixels; rows that fall outside the
output are masked at the store. The box shape is compile-time, so it travels as constexpr
fields of the geometry, which is passed to the kernel on its own: Triton 3.6 keeps a tuple's
constexpr fields only where the tuple flows straight from the kernel's arguments (not through
a local variable or a tuple of tuples), which is why this is a kernel of its own rather than
addressing functions of brgemm_kernel.

Requirements (checked by the algorithm, algos/implicit_gemm.py): stride 1, the tensor read
and w channels-last with 16-byte aligned bases and strides, the reduced channels per group a
multiple of BLOCK_K (a box never crosses a tap or a group). The descriptors are built by each
program into a small global scratch buffer that the launch allocates (kernels.launch).
"""

from typing import NamedTuple

import triton
import triton.language as tl

from ..core import cdiv
from .arrival import last_to_arrive
from .brgemm import epilogue, identity, tile_coords


class TmaGeometry(NamedTuple):
    """Sizes and strides of a TMA convolution, 3-D (1-D and 2-D problems have leading dims of
    size 1). "src" is the tensor read as A (x in forward, dy in backward-data), "dst" the one
    written. The box_* and block_n fields are tl.constexpr."""

    box_n: object  # images per row tile
    box_h: object  # output rows per row tile
    box_w: object  # output columns per row tile
    block_n: object  # output channels per column tile
    n: int
    red: int  # reduced channels per group: C/g in forward, K/g in backward-data
    cols: int  # written channels per group: K/g in forward, C/g in backward-data
    src_size: tuple  # (D, H, W) of src
    dst_size: tuple  # (D, H, W) of dst
    kernel: tuple  # (RD, RH, RW)
    shift: tuple  # src index = dst index + shift + tap * step, per spatial dim
    step: tuple
    src_strides: tuple  # (n, d, h, w); the channel stride is 1
    src_channels: int  # src's channels, all groups
    w_row: int  # filter row stride (at least taps * C/g)
    w_rows: int  # filter rows: output channels K, all groups
    dst_strides: tuple  # (n, c, d, h, w)
    dst_offset: int


@triton.jit
def _split(index, sizes):
    """Flat index over (a, b, c, d) of `sizes` -> (a, b, c, d), the last fastest."""
    _, sb, sc, sd = sizes
    d = index % sd
    t = index // sd
    c = t % sc
    t = t // sc
    b = t % sb
    return t // sb, b, c, d


@triton.jit
def _image_box(
    ptr, n, size, strides, channels, BOX_N: tl.constexpr, BOX_H: tl.constexpr,
    BOX_W: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """A descriptor of the channels-last image tensor at ptr, viewed as (N, D, H, W, C) with
    (n, d, h, w) strides and channel stride 1, read in [BOX_N, 1, BOX_H, BOX_W, BLOCK_C] boxes."""
    D, H, W = size
    s_n, s_d, s_h, s_w = strides
    return tl.make_tensor_descriptor(
        ptr, shape=[n, D, H, W, channels], strides=[s_n, s_d, s_h, s_w, 1],
        block_shape=[BOX_N, 1, BOX_H, BOX_W, BLOCK_C],
    )  # fmt: skip


@triton.jit
def _rectangle(index, n, size, BOX_N: tl.constexpr, BOX_H: tl.constexpr, BOX_W: tl.constexpr):
    """Rectangle `index` of BOX_N x BOX_H x BOX_W pixels over (N, D, H, W) with (D, H, W) =
    size: its first (n, d, h, w), and how many rectangles there are."""
    D, H, W = size
    sizes = (tl.cdiv(n, BOX_N), D, tl.cdiv(H, BOX_H), tl.cdiv(W, BOX_W))
    rn, d, rh, rw = _split(index, sizes)
    return rn * BOX_N, d, rh * BOX_H, rw * BOX_W, sizes[0] * D * sizes[2] * sizes[3]


@triton.jit
def tma_conv_kernel(
    SRC, Wt, DST, BIAS, geo, M, STEPS, alpha, beta,
    BACKWARD_DATA: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
    BETA_NONZERO: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Forward:       y[n, k, o]  = act(alpha * sum_{tap, c} x[n, c, o - pad + tap * dil]
                                    * w[k, c, tap] + bias[k] + beta * y[n, k, o])
    backward-data: dx[n, c, i] = alpha * sum_{tap, k} dy[n, k, i + pad - tap * dil]
                                    * w[k, c, tap] + beta * dx[n, c, i]
    (stride 1; both are dst[., j, o] = sum src[., r, o + shift + tap * step] * filter slice).
    Grid: (row tiles x column tiles, groups)."""
    BOX_N: tl.constexpr = geo.box_n
    BOX_H: tl.constexpr = geo.box_h
    BOX_W: tl.constexpr = geo.box_w
    BLOCK_N: tl.constexpr = geo.block_n
    BLOCK_M: tl.constexpr = BOX_N * BOX_H * BOX_W
    # Every geometry field is read here, before the loop (see conv_addressing's note on
    # Triton 3.6 and NamedTuple leaves specialized to 1).
    red, cols, n_images = geo.red, geo.cols, geo.n
    dst_size = geo.dst_size
    OD, OH, OW = dst_size
    KD, KH, KW = geo.kernel
    sd, sh, sw = geo.shift
    td, th, tw = geo.step
    ys_n, ys_c, ys_d, ys_h, ys_w = geo.dst_strides
    dst_offset = geo.dst_offset
    src = _image_box(
        SRC, n_images, geo.src_size, geo.src_strides, geo.src_channels, BOX_N, BOX_H, BOX_W,
        BLOCK_K,
    )  # fmt: skip
    if BACKWARD_DATA:  # rows of w are the reduced channels k: a [BLOCK_K, BLOCK_N] box
        w = tl.make_tensor_descriptor(
            Wt, shape=[geo.w_rows, geo.w_row], strides=[geo.w_row, 1],
            block_shape=[BLOCK_K, BLOCK_N],
        )  # fmt: skip
    else:  # rows of w are the output channels: a [BLOCK_N, BLOCK_K] box, transposed
        w = tl.make_tensor_descriptor(
            Wt, shape=[geo.w_rows, geo.w_row], strides=[geo.w_row, 1],
            block_shape=[BLOCK_N, BLOCK_K],
        )  # fmt: skip

    pid_m, pid_n = tile_coords(tl.program_id(0), M, cols, BLOCK_M, BLOCK_N, GROUP_M)
    group = tl.program_id(1)
    # The row tile's rectangle: its first image, output depth, row and column.
    n0, od, oh0, ow0, _ = _rectangle(pid_m, n_images, dst_size, BOX_N, BOX_H, BOX_W)
    col0 = pid_n * BLOCK_N  # in the group; columns past it reach only masked outputs
    red_group = group * red
    # The filter's rows are output channels (K): forward's columns, backward-data's reduction.
    w_group = group * (cols if not BACKWARD_DATA else red)
    c_per_tap = red if not BACKWARD_DATA else cols  # C/g: filter columns per tap

    chunks = tl.cdiv(red, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(STEPS):
        tap = t // chunks
        r0 = (t - tap * chunks) * BLOCK_K
        rw = tap % KW
        rh = (tap // KW) % KH
        rd = tap // (KW * KH)
        box = src.load(
            [n0, od + sd + rd * td, oh0 + sh + rh * th, ow0 + sw + rw * tw, red_group + r0]
        )
        a = box.reshape(BLOCK_M, BLOCK_K)
        if BACKWARD_DATA:
            b = w.load([w_group + r0, tap * c_per_tap + col0])
        else:
            b = tl.trans(w.load([w_group + col0, tap * c_per_tap + r0]))
        if UPCAST:  # Triton's interpreter multiplies bfloat16 tiles wrongly
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)

    # Row i of the tile is pixel (n0 + i // (BOX_H BOX_W), oh0 + i // BOX_W % BOX_H, ...).
    i = tl.arange(0, BLOCK_M)
    ow = ow0 + i % BOX_W
    oh = oh0 + (i // BOX_W) % BOX_H
    n = n0 + i // (BOX_W * BOX_H)
    rows = dst_offset + n * ys_n + od * ys_d + oh * ys_h + ow * ys_w
    offs_n = col0 + tl.arange(0, BLOCK_N)
    chan = group * cols + offs_n
    cols_ok = offs_n < cols
    mask = ((n < n_images) & (oh < OH) & (ow < OW))[:, None] & cols_ok[None, :]
    offs = rows[:, None] + (chan * ys_c)[None, :]
    epilogue(
        DST, offs, mask, acc, alpha, beta, BIAS, chan, cols_ok, HAS_BIAS, BETA_NONZERO, ACTIVATION
    )


class TmaFilterGeometry(NamedTuple):
    """Backward-filter's sizes and strides, 3-D. The reduction runs over rectangles of dy's
    pixels, BOX_N x BOX_H x BOX_W at a time; the box_* fields are tl.constexpr."""

    box_n: object
    box_h: object
    box_w: object
    n: int
    cg: int
    kg: int
    in_size: tuple  # x's (D, H, W)
    out_size: tuple  # dy's (OD, OH, OW)
    kernel: tuple
    padding: tuple
    dilation: tuple
    x_strides: tuple  # (n, d, h, w); the channel stride is 1
    x_channels: int
    dy_strides: tuple  # (n, d, h, w); the channel stride is 1
    dy_channels: int
    w_strides: tuple  # dw's (k, c, d, h, w)
    w_offset: int


@triton.jit
def tma_conv_filter_kernel(
    X, DY, DW, WS, ARRIVALS, geo, rects_per_split, alpha, beta,
    BETA_NONZERO: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    SPLITS: tl.constexpr, FINISH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dw[k, c, tap] = alpha * sum_{n, o} dy[n, k, o] x[n, c, o - pad + tap * dil]
    + beta * dw[k, c, tap], at stride 1.

    Grid: (k tiles x c tiles, groups x taps x SPLITS). Each program sums its share of dy's
    pixel rectangles: the rectangle of dy (A, [pixels, BLOCK_M] transposed) against the same
    rectangle of x shifted by the tap (B, [pixels, BLOCK_N]); out-of-image pixels of either
    read as zeros. With SPLITS > 1 the programs of one output tile write float32 partial
    tiles to WS ([groups x taps, SPLITS, K/g, C/g]) and, with FINISH, the last to arrive adds
    them in order (deterministic) and stores, as brgemm_kernel's split-K does; without it
    brgemm.split_finish_kernel does, in a second launch."""
    BOX_N: tl.constexpr = geo.box_n
    BOX_H: tl.constexpr = geo.box_h
    BOX_W: tl.constexpr = geo.box_w
    BLOCK_P: tl.constexpr = BOX_N * BOX_H * BOX_W
    cg, kg, n_images = geo.cg, geo.kg, geo.n
    out_size = geo.out_size
    KD, KH, KW = geo.kernel
    pd, ph, pw = geo.padding
    dd, dh, dw = geo.dilation
    ws_k, ws_c, ws_d, ws_h, ws_w = geo.w_strides
    w_offset = geo.w_offset
    x = _image_box(
        X, n_images, geo.in_size, geo.x_strides, geo.x_channels, BOX_N, BOX_H, BOX_W, BLOCK_N
    )
    dy = _image_box(
        DY, n_images, out_size, geo.dy_strides, geo.dy_channels, BOX_N, BOX_H, BOX_W, BLOCK_M
    )

    k_tiles = tl.cdiv(kg, BLOCK_M)
    pid_k = tl.program_id(0) % k_tiles
    pid_c = tl.program_id(0) // k_tiles
    entry = tl.program_id(1) // SPLITS  # (group, tap)
    split = tl.program_id(1) % SPLITS
    taps = KD * KH * KW
    group = entry // taps
    tap = entry % taps
    rw = tap % KW
    rh = (tap // KW) % KH
    rd = tap // (KW * KH)
    k0 = group * kg + pid_k * BLOCK_M
    c0 = group * cg + pid_c * BLOCK_N

    rects = _rectangle(0, n_images, out_size, BOX_N, BOX_H, BOX_W)[4]
    r_begin = split * rects_per_split
    r_end = tl.minimum(r_begin + rects_per_split, rects)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r in range(r_begin, r_end):
        n0, od, oh0, ow0, _ = _rectangle(r, n_images, out_size, BOX_N, BOX_H, BOX_W)
        a = dy.load([n0, od, oh0, ow0, k0]).reshape(BLOCK_P, BLOCK_M)
        b = x.load([n0, od - pd + rd * dd, oh0 - ph + rh * dh, ow0 - pw + rw * dw, c0])
        b = b.reshape(BLOCK_P, BLOCK_N)
        if UPCAST:  # Triton's interpreter multiplies bfloat16 tiles wrongly
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(tl.trans(a), b, acc, input_precision=PRECISION)

    offs_k = pid_k * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_c = pid_c * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_k < kg)[:, None] & (offs_c < cg)[None, :]
    chan_k = group * kg + offs_k
    offs = (
        w_offset + rd * ws_d + rh * ws_h + rw * ws_w
        + (chan_k * ws_k)[:, None] + (offs_c * ws_c)[None, :]
    )  # fmt: skip
    if SPLITS == 1:
        epilogue(DW, offs, mask, acc, alpha, beta, DW, chan_k, offs_k < kg, False, BETA_NONZERO,
                 identity)  # fmt: skip
    else:
        tile = WS + offs_k[:, None] * cg + offs_c[None, :]
        first = (entry * SPLITS).to(tl.int64)  # this (group, tap)'s first partial tile
        tl.store(tile + (first + split) * kg * cg, acc, mask=mask)
        if FINISH:
            counter = ARRIVALS + entry * tl.num_programs(0) + tl.program_id(0)
            if last_to_arrive(counter, SPLITS):
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(SPLITS):
                    partial = tile + (first + s) * kg * cg
                    total += tl.load(partial, mask=mask, other=0.0, cache_modifier=".cg")
                epilogue(DW, offs, mask, total, alpha, beta, DW, chan_k, offs_k < kg, False,
                         BETA_NONZERO, identity)  # fmt: skip


def rectangle(rows: int, cols: int, block: int) -> tuple[int, int, int]:
    """(box_n, box_h, box_w): a box of `block` pixels over images of rows x cols pixels, as
    wide as a row allows (powers of two), then as tall, then across images."""
    box_w = min(triton.next_power_of_2(cols), block)
    box_h = min(triton.next_power_of_2(rows), block // box_w)
    return block // (box_w * box_h), box_h, box_w


def rectangles(geo: TmaGeometry | TmaFilterGeometry) -> int:
    """How many rectangles of box_n x box_h x box_w pixels cover the written image (forward,
    backward-data) or dy (backward-filter), as _rectangle counts them."""
    od, oh, ow = geo.dst_size if isinstance(geo, TmaGeometry) else geo.out_size
    per_image = od * cdiv(oh, int(geo.box_h)) * cdiv(ow, int(geo.box_w))
    return cdiv(geo.n, int(geo.box_n)) * per_image
