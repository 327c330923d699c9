"""Forward convolution with operands read by the Hopper tensor memory accelerator (TMA).

The batch-reduce GEMM of conv_addressing's forward (rows: output pixels, columns: output
channels of a group, steps: (filter tap, chunk of input channels), one batch entry per group),
with its operands loaded through tensor descriptors instead of per-element pointers:

    A  a box [BOX_N, 1, BOX_H, BOX_W, BLOCK_K] of x, viewed as (N, D, H, W, C) channels-last:
       at stride 1 the input pixels under filter tap r of a rectangle of output pixels are
       themselves a rectangle, shifted by r * dilation - padding. Coordinates outside the image
       (the padding) read as zeros, filled in by the hardware: no masks and no index arithmetic
       per element.
    B  a box [BLOCK_N, BLOCK_K] of w, viewed as (K, taps * C/g): a dense channels-last filter
       holds each output channel's taps and input channels contiguously.

A row tile is therefore a rectangle of output pixels, BOX_N images x BOX_H rows x BOX_W
columns (BLOCK_M = their product), not a run of consecutive pixels; rows that fall outside the
output are masked at the store. The box shape is compile-time, so it travels as constexpr
fields of the geometry, which is passed to the kernel on its own: Triton 3.6 keeps a tuple's
constexpr fields only where the tuple flows straight from the kernel's arguments (not through
a local variable or a tuple of tuples), which is why this is a kernel of its own rather than
addressing functions of brgemm_kernel.

Requirements (checked by the algorithm, algos/implicit_gemm.py): forward, stride 1, x and w
channels-last with 16-byte aligned bases and strides, C/g a multiple of BLOCK_K (a box never
crosses a tap or a group). The descriptors are built by each program into a small global
scratch buffer that the launch allocates (kernels.launch).
"""

from typing import NamedTuple

import triton
import triton.language as tl

from .brgemm import epilogue, tile_coords


class TmaForwardGeometry(NamedTuple):
    """Sizes and strides of a TMA forward convolution, 3-D (1-D and 2-D problems have leading
    dims of size 1). The box_* and block_n fields are tl.constexpr."""

    box_n: object  # images per row tile
    box_h: object  # output rows per row tile
    box_w: object  # output columns per row tile
    block_n: object  # output channels per column tile
    n: int
    cg: int  # input channels per group
    kg: int  # output channels per group
    in_size: tuple  # (D, H, W)
    out_size: tuple  # (OD, OH, OW)
    kernel: tuple  # (RD, RH, RW)
    padding: tuple
    dilation: tuple
    x_strides: tuple  # (n, d, h, w); the channel stride is 1
    c_total: int  # input channels, all groups
    w_row: int  # filter row stride (at least taps * C/g)
    k_total: int  # output channels, all groups
    y_strides: tuple  # (n, k, d, h, w)
    y_offset: int


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
def tma_conv_forward_kernel(
    X, Wt, Y, BIAS, geo, M, STEPS, alpha, beta,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, BETA_NONZERO: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Y[n, k, o] = act(alpha * sum_{tap, c} x[n, c, o - pad + tap * dil] w[k, c, tap]
    + bias[k] + beta * Y[n, k, o]). Grid: (row tiles x column tiles, groups)."""
    BOX_N: tl.constexpr = geo.box_n
    BOX_H: tl.constexpr = geo.box_h
    BOX_W: tl.constexpr = geo.box_w
    BLOCK_N: tl.constexpr = geo.block_n
    BLOCK_M: tl.constexpr = BOX_N * BOX_H * BOX_W
    # Every geometry field is read here, before the loop (see conv_addressing's note on
    # Triton 3.6 and NamedTuple leaves specialized to 1).
    cg, kg, n_images = geo.cg, geo.kg, geo.n
    D, H, W = geo.in_size
    OD, OH, OW = geo.out_size
    KD, KH, KW = geo.kernel
    pd, ph, pw = geo.padding
    dd, dh, dw = geo.dilation
    xs_n, xs_d, xs_h, xs_w = geo.x_strides
    ys_n, ys_k, ys_d, ys_h, ys_w = geo.y_strides
    y_offset = geo.y_offset
    x = tl.make_tensor_descriptor(
        X, shape=[n_images, D, H, W, geo.c_total], strides=[xs_n, xs_d, xs_h, xs_w, 1],
        block_shape=[BOX_N, 1, BOX_H, BOX_W, BLOCK_K],
    )  # fmt: skip
    w = tl.make_tensor_descriptor(
        Wt, shape=[geo.k_total, geo.w_row], strides=[geo.w_row, 1],
        block_shape=[BLOCK_N, BLOCK_K],
    )  # fmt: skip

    pid_m, pid_n = tile_coords(tl.program_id(0), M, kg, BLOCK_M, BLOCK_N, GROUP_M)
    group = tl.program_id(1)
    # The row tile's rectangle: its first image, output depth, row and column.
    rect_sizes = (tl.cdiv(n_images, BOX_N), OD, tl.cdiv(OH, BOX_H), tl.cdiv(OW, BOX_W))
    tn, od, th, tw = _split(pid_m, rect_sizes)
    n0, oh0, ow0 = tn * BOX_N, th * BOX_H, tw * BOX_W
    k0 = group * kg + pid_n * BLOCK_N  # rows past the group's reach only masked columns
    c_group = group * cg

    chunks = tl.cdiv(cg, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(STEPS):
        tap = t // chunks
        c0 = (t - tap * chunks) * BLOCK_K
        rw = tap % KW
        rh = (tap // KW) % KH
        rd = tap // (KW * KH)
        box = x.load([n0, od - pd + rd * dd, oh0 - ph + rh * dh, ow0 - pw + rw * dw, c_group + c0])
        a = box.reshape(BLOCK_M, BLOCK_K)
        b = tl.trans(w.load([k0, tap * cg + c0]))
        if UPCAST:  # Triton's interpreter multiplies bfloat16 tiles wrongly
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)

    # Row i of the tile is pixel (n0 + i // (BOX_H BOX_W), oh0 + i // BOX_W % BOX_H, ...).
    i = tl.arange(0, BLOCK_M)
    ow = ow0 + i % BOX_W
    oh = oh0 + (i // BOX_W) % BOX_H
    n = n0 + i // (BOX_W * BOX_H)
    rows = y_offset + n * ys_n + od * ys_d + oh * ys_h + ow * ys_w
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    chan = group * kg + offs_n
    cols_ok = offs_n < kg
    mask = ((n < n_images) & (oh < OH) & (ow < OW))[:, None] & cols_ok[None, :]
    offs = rows[:, None] + (chan * ys_k)[None, :]
    epilogue(
        Y, offs, mask, acc, alpha, beta, BIAS, chan, cols_ok, HAS_BIAS, BETA_NONZERO, ACTIVATION
    )


def row_tiles(geo: TmaForwardGeometry) -> int:
    """How many row tiles (rectangles of output pixels) cover the output."""
    od, oh, ow = geo.out_size
    per_image = od * triton.cdiv(oh, int(geo.box_h)) * triton.cdiv(ow, int(geo.box_w))
    return triton.cdiv(geo.n, int(geo.box_n)) * per_image
