"""Per-channel sums (the bias gradient): out[k] = alpha * sum_{n, pixels} dy[n, k, ...] + beta*out.

Two deterministic passes: programs over (channel block, slice of pixels) write float32 partial
sums, then one program per channel block adds the slices in order and applies alpha and beta.
"""

import triton
import triton.language as tl

from .conv_addressing import num_pixels, split_pixel


@triton.jit
def channel_partial_sum_kernel(
    DY, PART, geo, pixels_per_slice, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr
):
    """geo: a ConvGeometry whose out_size, kg and y_strides describe dy."""
    offs_k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    slice_id = tl.program_id(1)
    total = num_pixels(geo, geo.out_size)
    # Fields are read into locals before the loop: Triton 3.6 fails to compile a NamedTuple
    # field read inside a loop when one of its leaves was specialized to 1.
    ys_n, ys_k, ys_d, ys_h, ys_w = geo.y_strides
    out_size = geo.out_size
    base = geo.offsets[2]
    channels = geo.kg
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    start = slice_id * pixels_per_slice
    end = tl.minimum(start + pixels_per_slice, total)
    for p0 in range(start, end, BLOCK_P):
        j = p0 + tl.arange(0, BLOCK_P)
        n, od, oh, ow = split_pixel(j, out_size)
        pix = base + n * ys_n + od * ys_d + oh * ys_h + ow * ys_w
        mask = (j < end)[:, None] & (offs_k < channels)[None, :]
        tile = tl.load(DY + pix[:, None] + (offs_k * ys_k)[None, :], mask=mask, other=0.0)
        acc += tl.sum(tile.to(tl.float32), axis=0)
    tl.store(PART + slice_id * channels + offs_k, acc, mask=offs_k < channels)


@triton.jit
def channel_sum_finish_kernel(
    PART, OUT, out_stride, K, slices, alpha, beta, BETA_NONZERO: tl.constexpr, BLOCK_K: tl.constexpr
):
    offs_k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = offs_k < K
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for s in range(slices):
        acc += tl.load(PART + s * K + offs_k, mask=mask, other=0.0)
    out = alpha * acc
    if BETA_NONZERO:
        out += beta * tl.load(OUT + offs_k * out_stride, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + offs_k * out_stride, out.to(OUT.dtype.element_ty), mask=mask)
