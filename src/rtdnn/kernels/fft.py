"""Kernels of the FFT convolution algorithms (algos/fft.py); the transforms are torch.fft's.

    pack     gathers tiles (windows) of a strided tensor into a float32 transform buffer,
             zero outside the tensor and outside the window: the convolution's zero padding
    cmac     a batched complex GEMM over frequencies, the channel sums of the convolution
    unpack   crops each tile's valid part out of the float32 inverse-transform buffer into
             the caller's output: out = alpha * value + bias + beta * out

Every problem is 3-D here (1-D and 2-D problems have leading spatial dims of size 1). The
transform buffers are contiguous: real [tiles * rows, channels, L0, L1, L2] (float32) and
their spectra [tiles * rows, channels, frequencies] (complex64, read as interleaved real and
imaginary float32); buffer offsets are int64, as a workspace may hold 2**31 elements or more.

A tile t of a wave is tile `wave_start + t` of the grid of tiles (tiles[0], tiles[1],
tiles[2]), row-major; tiles past the end of the grid lie outside the tensors, so they pack as
zeros and unpack nothing, which lets every wave have the same size.
"""

from typing import NamedTuple

import triton
import triton.language as tl

from ..core import cdiv


class PackGeometry(NamedTuple):
    """Buffer position q (per dim, 0 <= q < length) of tile t reads source index
    start + t * step + q, when lo <= q < hi and the index is inside the source."""

    rows: int  # rows of one tile (the batch N, or K for the filter)
    chans: int
    size: tuple  # source spatial sizes (3)
    strides: tuple  # source strides (5: row, channel, d, h, w)
    length: tuple  # transform lengths (3)
    start: tuple
    step: tuple
    lo: tuple
    hi: tuple
    tiles: tuple  # tiles per dim (3)


class UnpackGeometry(NamedTuple):
    """Output index s = t * step + u (per dim, 0 <= u < step) of tile t is buffer position
    crop + u, written when s is inside the output."""

    rows: int
    chans: int
    size: tuple  # output spatial sizes (3)
    strides: tuple  # output strides (5)
    length: tuple  # transform lengths (3)
    crop: tuple
    step: tuple
    tiles: tuple


class CmacGeometry(NamedTuple):
    """C[g, m, n, f] = sum_r A[g, m, r, f] * B[g, r, n, f] (complex) for f < freqs, with the
    strides of each operand in complex elements (f has stride 1)."""

    groups: int
    m: int
    n: int
    depth: int
    freqs: int
    a: tuple  # (group, m, r)
    b: tuple  # (group, r, n)
    c: tuple  # (group, m, n)


@triton.jit
def _tile_coords(t, tiles):
    """Tile number t -> its coordinates in the grid of tiles (row-major)."""
    t2 = t % tiles[2]
    rest = t // tiles[2]
    return rest // tiles[1], rest % tiles[1], t2


@triton.jit
def _split3(q, sizes):
    """Flat row-major index q into [sizes[0], sizes[1], sizes[2]] -> three indices."""
    q2 = q % sizes[2]
    rest = q // sizes[2]
    return rest // sizes[1], rest % sizes[1], q2


@triton.jit
def _plane_block(geo, wave_start, items, BLOCK_C: tl.constexpr, BLOCK_Q: tl.constexpr):
    """Program id -> (row, channels, tile coordinates, the tile's row in the buffer, the
    program's block of `items` positions). A program owns BLOCK_C channels x BLOCK_Q positions
    of one row of one tile; its channel blocks are neighbours."""
    q_blocks = tl.cdiv(items, BLOCK_Q)
    c_blocks = tl.cdiv(geo.chans, BLOCK_C)
    pid = tl.program_id(0)
    q = (pid % q_blocks) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rest = pid // q_blocks
    chan = (rest % c_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    tile_row = rest // c_blocks
    row = tile_row % geo.rows
    t0, t1, t2 = _tile_coords(wave_start + tile_row // geo.rows, geo.tiles)
    return row, chan, t0, t1, t2, tile_row, q


@triton.jit
def _address(st, row, chan, i0, i1, i2):
    """[channels, positions] element offsets (int64) into a tensor of strides st."""
    spatial = i0.to(tl.int64) * st[2] + i1.to(tl.int64) * st[3] + i2.to(tl.int64) * st[4]
    return row.to(tl.int64) * st[0] + (chan.to(tl.int64) * st[1])[:, None] + spatial[None, :]


@triton.jit
def fft_pack_kernel(
    SRC, BUF, geo, wave_start, BLOCK_C: tl.constexpr, BLOCK_Q: tl.constexpr
):  # fmt: skip
    """BUF[t * rows + row, chan, q] = SRC[row, chan, start + (wave_start + t) * step + q] as
    float32 (zero outside the window or the source)."""
    volume = geo.length[0] * geo.length[1] * geo.length[2]
    row, chan, t0, t1, t2, tile_row, q = _plane_block(geo, wave_start, volume, BLOCK_C, BLOCK_Q)
    q0, q1, q2 = _split3(q, geo.length)
    i0 = geo.start[0] + t0 * geo.step[0] + q0
    i1 = geo.start[1] + t1 * geo.step[1] + q1
    i2 = geo.start[2] + t2 * geo.step[2] + q2
    ok = (q < volume) & (q0 >= geo.lo[0]) & (q0 < geo.hi[0]) & (q1 >= geo.lo[1])
    ok &= (q1 < geo.hi[1]) & (q2 >= geo.lo[2]) & (q2 < geo.hi[2])
    ok &= (i0 >= 0) & (i0 < geo.size[0]) & (i1 >= 0) & (i1 < geo.size[1])
    ok &= (i2 >= 0) & (i2 < geo.size[2])
    chan_ok = chan < geo.chans
    offs = _address(geo.strides, row, chan, i0, i1, i2)
    v = tl.load(SRC + offs, mask=chan_ok[:, None] & ok[None, :], other=0.0).to(tl.float32)
    plane = tile_row.to(tl.int64) * geo.chans + chan
    dest = BUF + plane[:, None] * volume + q[None, :]
    tl.store(dest, v, mask=chan_ok[:, None] & (q < volume)[None, :])


@triton.jit
def fft_unpack_kernel(
    BUF, OUT, BIAS, geo, wave_start, alpha, beta,
    HAS_BIAS: tl.constexpr, BETA_NONZERO: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):  # fmt: skip
    """OUT[row, chan, t * step + u] = alpha * BUF[t * rows + row, chan, crop + u]
    + bias[chan] + beta * OUT[...], for the outputs inside OUT."""
    volume = geo.length[0] * geo.length[1] * geo.length[2]
    valid = geo.step[0] * geo.step[1] * geo.step[2]
    row, chan, t0, t1, t2, tile_row, u = _plane_block(geo, wave_start, valid, BLOCK_C, BLOCK_Q)
    u0, u1, u2 = _split3(u, geo.step)
    s0 = t0 * geo.step[0] + u0
    s1 = t1 * geo.step[1] + u1
    s2 = t2 * geo.step[2] + u2
    ok = (u < valid) & (s0 < geo.size[0]) & (s1 < geo.size[1]) & (s2 < geo.size[2])
    chan_ok = chan < geo.chans
    mask = chan_ok[:, None] & ok[None, :]
    q = ((geo.crop[0] + u0) * geo.length[1] + geo.crop[1] + u1) * geo.length[2]
    q += geo.crop[2] + u2
    plane = tile_row.to(tl.int64) * geo.chans + chan
    v = tl.load(BUF + plane[:, None] * volume + q[None, :], mask=mask, other=0.0)
    v = v * alpha
    if HAS_BIAS:
        v += tl.load(BIAS + chan, mask=chan_ok, other=0.0).to(tl.float32)[:, None]
    offs = _address(geo.strides, row, chan, s0, s1, s2)
    if BETA_NONZERO:
        # Read OUT only when beta != 0: an unset output may hold NaN, and 0 * NaN is NaN.
        v += beta * tl.load(OUT + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + offs, v.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def fft_cmac_kernel(
    A, B, C, geo,
    CONJ_A: tl.constexpr, CONJ_B: tl.constexpr, ACCUMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_F: tl.constexpr,
):  # fmt: skip
    """C = sum_r op(A) * op(B) per frequency (op: conjugate when CONJ_*), plus C's prior
    value when ACCUMULATE. A, B, C are float32 views of complex buffers (real at 2i,
    imaginary at 2i + 1). Products and sums in float32 FMAs, in a fixed order.

    One program: a [BLOCK_M, BLOCK_N] tile of one group for BLOCK_F frequencies. Programs of
    one block of frequencies are neighbours, so that they share its A and B rows in L2."""
    m_blocks = tl.cdiv(geo.m, BLOCK_M)
    n_blocks = tl.cdiv(geo.n, BLOCK_N)
    pid = tl.program_id(0)
    pid_n = pid % n_blocks
    rest = pid // n_blocks
    pid_m = rest % m_blocks
    rest = rest // m_blocks
    g = (rest % geo.groups).to(tl.int64)
    pid_f = rest // geo.groups
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = offs_f < geo.freqs
    a_mask = (offs_m < geo.m)[:, None] & f_ok[None, :]
    b_mask = (offs_n < geo.n)[:, None] & f_ok[None, :]
    a_ptr = A + 2 * (g * geo.a[0] + offs_m.to(tl.int64)[:, None] * geo.a[1] + offs_f[None, :])
    b_ptr = B + 2 * (g * geo.b[0] + offs_n.to(tl.int64)[:, None] * geo.b[2] + offs_f[None, :])
    acc_re = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_F), dtype=tl.float32)
    acc_im = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_F), dtype=tl.float32)
    # The pointers step through the reduction (64-bit addresses: no int32 r * stride).
    for _ in range(geo.depth):
        a_re = tl.load(a_ptr, mask=a_mask, other=0.0)[:, None, :]
        a_im = tl.load(a_ptr + 1, mask=a_mask, other=0.0)[:, None, :]
        b_re = tl.load(b_ptr, mask=b_mask, other=0.0)[None, :, :]
        b_im = tl.load(b_ptr + 1, mask=b_mask, other=0.0)[None, :, :]
        a_ptr += 2 * geo.a[2]
        b_ptr += 2 * geo.b[1]
        if CONJ_A:
            a_im = -a_im
        if CONJ_B:
            b_im = -b_im
        acc_re += a_re * b_re - a_im * b_im
        acc_im += a_re * b_im + a_im * b_re
    c_off = (
        g * geo.c[0]
        + offs_m.to(tl.int64)[:, None, None] * geo.c[1]
        + offs_n.to(tl.int64)[None, :, None] * geo.c[2]
        + offs_f[None, None, :]
    )
    c_ptr = C + 2 * c_off
    c_mask = (offs_m < geo.m)[:, None, None] & (offs_n < geo.n)[None, :, None]
    c_mask &= f_ok[None, None, :]
    if ACCUMULATE:
        acc_re += tl.load(c_ptr, mask=c_mask, other=0.0)
        acc_im += tl.load(c_ptr + 1, mask=c_mask, other=0.0)
    tl.store(c_ptr, acc_re, mask=c_mask)
    tl.store(c_ptr + 1, acc_im, mask=c_mask)


def cmac_programs(geo: CmacGeometry, block_m: int, block_n: int, block_f: int) -> int:
    return cdiv(geo.m, block_m) * cdiv(geo.n, block_n) * geo.groups * cdiv(geo.freqs, block_f)
