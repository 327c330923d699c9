"""Winograd F(m x m, 3 x 3) transforms (Lavin and Gray 2015) for the WINOGRAD_NONFUSED algorithm.

One output tile of m x m pixels of a 3 x 3 convolution comes from an a x a input tile
(a = m + 2) through a = (m + 2)^2 "transform points" p, each an independent product:

    y_tile = AT [ (G w G^T) * (BT d B) ] AT^T        (* elementwise over the a x a points)

Summed over input channels, each point is a GEMM over (tiles x channels), which the batch-reduce
GEMM runs; the kernels here move data in and out of that form, with float32 arithmetic:

    tile_transform_kernel    L x L tiles of an image -> MAT . tile . MAT^T -> ws[p, tile, channel]
                             (the input transform with MAT = BT, L = a; backward-filter also
                             transforms dy tiles with MAT = A = AT^T, L = m)
    filter_transform_kernel  3 x 3 filters -> G . w . G^T -> ws[p, group, in channel, out channel]
    output_transform_kernel  ws[p, tile, channel] -> AT . M . AT^T -> the image's m x m tile,
                             with alpha, bias and beta
    filter_output_kernel     ws[p, filter element] -> G^T . D . G -> the 3 x 3 filter gradient,
                             with alpha and beta (summing chunks of partial sums first)
    filter_fma_kernel        backward-filter's products for a few input channels a group in
                             float32 FMAs, transforms in registers, partial sums per chunk
    fused_kernel             WINOGRAD (fused): input transform, products of every point
                             (tensor cores; float32 FMAs where a group reduces a few
                             channels) and output transform in one kernel

The transforms are unrolled at compile time: a tile is a tuple of rows, each a tuple of
[BLOCK_T, BLOCK_C] tensors, and each matrix is a compile-time tuple of rows of floats whose
zero entries cost nothing.
"""

from typing import NamedTuple

import triton
import triton.language as tl

from .brgemm import epilogue, identity


def _transpose(mat: tuple) -> tuple:
    return tuple(zip(*mat, strict=True))


#: F(2x2, 3x3): input transform BT (4 x 4), filter transform G (4 x 3), output transform
#: AT (2 x 4).
F2 = (
    ((1.0, 0.0, -1.0, 0.0), (0.0, 1.0, 1.0, 0.0), (0.0, -1.0, 1.0, 0.0), (0.0, 1.0, 0.0, -1.0)),
    ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0)),
    ((1.0, 1.0, 1.0, 0.0), (0.0, 1.0, -1.0, -1.0)),
)
#: F(4x4, 3x3) with the interpolation points 0, 1, -1, 2, -2 (and infinity).
F4 = (
    (
        (4.0, 0.0, -5.0, 0.0, 1.0, 0.0),
        (0.0, -4.0, -4.0, 1.0, 1.0, 0.0),
        (0.0, 4.0, -4.0, -1.0, 1.0, 0.0),
        (0.0, -2.0, -1.0, 2.0, 1.0, 0.0),
        (0.0, 2.0, -1.0, -2.0, 1.0, 0.0),
        (0.0, 4.0, 0.0, -5.0, 0.0, 1.0),
    ),
    (
        (1 / 4, 0.0, 0.0),
        (-1 / 6, -1 / 6, -1 / 6),
        (-1 / 6, 1 / 6, -1 / 6),
        (1 / 24, 1 / 12, 1 / 6),
        (1 / 24, -1 / 12, 1 / 6),
        (0.0, 0.0, 1.0),
    ),
    (
        (1.0, 1.0, 1.0, 1.0, 1.0, 0.0),
        (0.0, 1.0, -1.0, 2.0, -2.0, 0.0),
        (0.0, 1.0, 1.0, 4.0, 4.0, 0.0),
        (0.0, 1.0, -1.0, 8.0, -8.0, 1.0),
    ),
)


class Transforms(NamedTuple):
    """The matrices of F(m x m, 3 x 3), each a tuple of rows."""

    m: int  # output tile
    bt: tuple  # a x a, input tiles
    g: tuple  # a x 3, filters
    at: tuple  # m x a, output tiles
    a: tuple  # a x m (AT^T), dy tiles of backward-filter
    gt: tuple  # 3 x a (G^T), the filter gradient

    @property
    def tile(self) -> int:
        return self.m + 2

    @property
    def points(self) -> int:
        return self.tile**2


def transforms(m: int) -> Transforms:
    """The matrices of F(m x m, 3 x 3) for m = 2 or 4."""
    bt, g, at = {2: F2, 4: F4}[m]
    return Transforms(m, bt, g, at, _transpose(at), _transpose(g))


class TileGeometry(NamedTuple):
    """An image (N, channels, H, W) cut into tiles: tile (n, th, tw) covers the L x L pixels
    from (th * step + start_h, tw * step + start_w); pixels outside the image read as zero
    and are not written."""

    tiles: int  # N * tiles_h * tiles_w
    channels: int
    height: int
    width: int
    tiles_h: int
    tiles_w: int
    strides: tuple  # (n, c, h, w) in elements
    offset: int
    start_h: int
    start_w: int


class FilterGeometry(NamedTuple):
    """A filter (or its gradient) read as [group, o, i, 3, 3] through element strides."""

    elements: int  # groups * outs * ins
    outs: int  # per group
    ins: int  # per group
    strides: tuple  # (group, o, i, r, s)
    offset: int


# -- compile-time matrix products ------------------------------------------------------------


@triton.jit
def _combine(mat: tl.constexpr, i: tl.constexpr, v):
    """sum_j mat[i][j] * v[j], skipping the zero coefficients."""
    started: tl.constexpr = False
    for j in tl.static_range(len(v)):
        if mat[i][j] != 0.0:
            if started:
                # acc was set at the first non-zero coefficient (this loop is unrolled).
                acc = acc + v[j] * mat[i][j]  # noqa: F821
            else:
                acc = v[j] * mat[i][j]
                started = True
    return acc


@triton.jit
def _apply(mat: tl.constexpr, v):
    """The matrix-vector product mat . v of a compile-time matrix and a tuple of tensors."""
    out = ()
    for i in tl.static_range(len(mat)):
        out = out + (_combine(mat, i, v),)
    return out


@triton.jit
def _transpose_tiles(x):
    out = ()
    for j in tl.static_range(len(x[0])):
        col = ()
        for i in tl.static_range(len(x)):
            col = col + (x[i][j],)
        out = out + (col,)
    return out


@triton.jit
def transform2d(mat: tl.constexpr, x):
    """mat . x . mat^T for a tuple of rows x, each a tuple of tensors."""
    rows = ()
    for i in tl.static_range(len(x)):
        rows = rows + (_apply(mat, x[i]),)  # rows[i][j] = (x . mat^T)[i][j]
    cols = _transpose_tiles(rows)
    out = ()
    for j in tl.static_range(len(cols)):
        out = out + (_apply(mat, cols[j]),)  # out[j][i] = (mat . x . mat^T)[i][j]
    return _transpose_tiles(out)


# -- kernels -------------------------------------------------------------------------------------


@triton.jit
def _split_tile(offs_t, geo):
    tw = offs_t % geo.tiles_w
    q = offs_t // geo.tiles_w
    return q // geo.tiles_h, q % geo.tiles_h, tw


@triton.jit
def _load_tile(SRC, base, chan, t_ok, c_ok, row0, col0, height, width, sh, sw,
               L: tl.constexpr):  # fmt: skip
    """The L x L pixels from (row0, col0) of each tile as float32, a tuple of rows of
    [tiles, channels] tensors: base (per tile) + chan (per channel: a row vector, or one
    channel's scalar offset for a [tiles, 1] column); zero outside the image and where t_ok
    or c_ok is false."""
    x = ()
    for i in tl.static_range(L):
        h = row0 + i
        h_ok = t_ok & (h >= 0) & (h < height)
        row = ()
        for j in tl.static_range(L):
            w = col0 + j
            ok = h_ok & (w >= 0) & (w < width)
            ptrs = SRC + (base + h * sh + w * sw)[:, None] + chan
            v = tl.load(ptrs, mask=ok[:, None] & c_ok, other=0.0)
            row = row + (v.to(tl.float32),)
        x = x + (row,)
    return x


@triton.jit
def _store_tile(Y, BIAS, y, base, chan, offs_c, c_ok, t_ok, row0, col0, height, width, sh, sw,
                alpha, beta, HAS_BIAS: tl.constexpr, BETA_NONZERO: tl.constexpr):  # fmt: skip
    """Each tile's m x m outputs y (a tuple of rows of [tiles, channels] tensors) through the
    epilogue into Y from (row0, col0), where inside the image: base per tile, chan the
    channels' offsets, offs_c their indices (for the bias)."""
    for i in tl.static_range(len(y)):
        h = row0 + i
        for j in tl.static_range(len(y)):
            w = col0 + j
            ok = t_ok & (h < height) & (w < width)
            offs = (base + h * sh + w * sw)[:, None] + chan[None, :]
            epilogue(
                Y, offs, ok[:, None] & c_ok[None, :], y[i][j], alpha, beta, BIAS, offs_c, c_ok,
                HAS_BIAS, BETA_NONZERO, identity,
            )  # fmt: skip


@triton.jit
def tile_transform_kernel(
    SRC,
    WS,
    geo,
    MAT: tl.constexpr,
    L: tl.constexpr,
    STEP: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """ws[p, t, c] = (MAT . src_tile(t, c) . MAT^T)[p] in float32, for every point p of the
    len(MAT) x len(MAT) result, tile t of geo.tiles and channel c. Grid: (tile blocks,
    channel blocks)."""
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    n, th, tw = _split_tile(offs_t, geo)
    sn, sc, sh, sw = geo.strides
    t_ok = offs_t < geo.tiles
    c_ok = offs_c < geo.channels
    row0 = th * STEP + geo.start_h
    col0 = tw * STEP + geo.start_w
    base = geo.offset + n * sn
    x = _load_tile(SRC, base, (offs_c * sc)[None, :], t_ok, c_ok[None, :], row0, col0,
                   geo.height, geo.width, sh, sw, L)  # fmt: skip
    v = transform2d(MAT, x)
    # Workspace offsets in int64: points x tiles x channels can pass 2^31.
    plane = tl.cast(geo.tiles, tl.int64) * geo.channels
    out = WS + offs_t.to(tl.int64)[:, None] * geo.channels + offs_c[None, :]
    mask = t_ok[:, None] & c_ok[None, :]
    for i in tl.static_range(len(MAT)):
        for j in tl.static_range(len(MAT)):
            tl.store(out + (i * len(MAT) + j) * plane, v[i][j], mask=mask)


@triton.jit
def filter_transform_kernel(Wt, WS, geo, MAT: tl.constexpr, BLOCK: tl.constexpr):
    """ws[p, g, i, o] = (MAT . w[g, o, i] . MAT^T)[p] in float32. Grid: element blocks."""
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = e < geo.elements
    per_group = geo.outs * geo.ins
    g = e // per_group
    i = (e % per_group) // geo.outs
    o = e % geo.outs
    s_g, s_o, s_i, s_r, s_s = geo.strides
    base = geo.offset + g * s_g + o * s_o + i * s_i
    x = ()
    for r in tl.static_range(3):
        row = ()
        for s in tl.static_range(3):
            v = tl.load(Wt + base + r * s_r + s * s_s, mask=ok, other=0.0)
            row = row + (v.to(tl.float32),)
        x = x + (row,)
    u = transform2d(MAT, x)
    for p in tl.static_range(len(MAT)):
        for q in tl.static_range(len(MAT)):
            tl.store(WS + (p * len(MAT) + q) * geo.elements + e, u[p][q], mask=ok)


@triton.jit
def output_transform_kernel(
    WS,
    Y,
    BIAS,
    geo,
    alpha,
    beta,
    MAT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """y tile (t, c) = alpha * MAT . ws[:, t, c] . MAT^T + bias[c] + beta * y, written through
    y's strides where inside the image. ws is float32 [a * a, tiles, channels], MAT is m x a.
    Grid: (tile blocks, channel blocks)."""
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    n, th, tw = _split_tile(offs_t, geo)
    sn, sc, sh, sw = geo.strides
    t_ok = offs_t < geo.tiles
    c_ok = offs_c < geo.channels
    a: tl.constexpr = len(MAT[0])
    plane = tl.cast(geo.tiles, tl.int64) * geo.channels
    src = WS + offs_t.to(tl.int64)[:, None] * geo.channels + offs_c[None, :]
    mask = t_ok[:, None] & c_ok[None, :]
    x = ()
    for i in tl.static_range(a):
        row = ()
        for j in tl.static_range(a):
            row = row + (tl.load(src + (i * a + j) * plane, mask=mask, other=0.0),)
        x = x + (row,)
    y = transform2d(MAT, x)
    _store_tile(Y, BIAS, y, geo.offset + n * sn, offs_c * sc, offs_c, c_ok, t_ok,
                th * len(MAT), tw * len(MAT), geo.height, geo.width, sh, sw, alpha, beta,
                HAS_BIAS, BETA_NONZERO)  # fmt: skip


@triton.jit
def filter_output_kernel(
    WS,
    DW,
    geo,
    chunks,
    alpha,
    beta,
    MAT: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """dw[g, o, i] = alpha * MAT . ws[:, (g, o, i)] . MAT^T + beta * dw, 3 x 3, written through
    dw's strides. ws is float32 [chunks, a * a, elements], summed over the chunks in order
    (filter_fma_kernel's partial sums; one chunk after the GEMM), MAT is 3 x a. Grid: element
    blocks."""
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = e < geo.elements
    per_group = geo.outs * geo.ins
    g = e // per_group
    o = (e % per_group) // geo.ins
    i = e % geo.ins
    a: tl.constexpr = len(MAT[0])
    # The geometry and dw's addresses before the loops (see brgemm_kernel's note on Triton 3.6
    # and geometry reads after loops).
    elements = geo.elements
    chunk_elements = a * a * elements
    s_g, s_o, s_i, s_r, s_s = geo.strides
    base = geo.offset + g * s_g + o * s_o + i * s_i
    x = ()
    for p in tl.static_range(a):
        row = ()
        for q in tl.static_range(a):
            point = WS + (p * a + q) * elements + e
            v = tl.zeros((BLOCK,), dtype=tl.float32)
            for c in range(chunks):  # in order: the same sum on every run
                v += tl.load(point + c * chunk_elements, mask=ok, other=0.0)
            row = row + (v,)
        x = x + (row,)
    d = transform2d(MAT, x)
    for r in tl.static_range(3):
        for s in tl.static_range(3):
            epilogue(
                DW, base + r * s_r + s * s_s, ok, d[r][s], alpha, beta, DW, e, ok, False,
                BETA_NONZERO, identity,
            )  # fmt: skip


@triton.jit
def filter_fma_kernel(
    X,
    DY,
    WS,
    x_geo,
    dy_geo,
    outs,
    ins,
    tiles_per_chunk,
    BT_MAT: tl.constexpr,
    A_MAT: tl.constexpr,
    STEP: tl.constexpr,
    CHANNELS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Backward-filter's products for a few input channels a group (an RGB stem's 3) in
    float32 FMAs, over one chunk of tiles, without the transformed planes in memory: for each
    tile t of the chunk, Y = A . dy_tile . A^T (a x a from m x m, BLOCK_K output channels o)
    and V = BT . x_tile . B (every input channel i, CHANNELS of them with padding), and
    ws[chunk, p, (g, o, i)] = sum over t of Y[p][t, o] * V[p][t, i]. filter_output_kernel sums
    the chunks in order and applies G^T . D . G. Grid: (chunks, output-channel blocks,
    groups)."""
    a: tl.constexpr = len(BT_MAT)
    m: tl.constexpr = len(A_MAT[0])
    chunk = tl.program_id(0)
    group = tl.program_id(2)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_i = tl.arange(0, CHANNELS)
    k_ok = offs_k < outs
    i_ok = offs_i < ins
    # The geometry before the loop (see brgemm_kernel's note on Triton 3.6 and geometry reads
    # after loops).
    xsn, xsc, xsh, xsw = x_geo.strides
    dsn, dsc, dsh, dsw = dy_geo.strides
    x_off, x_h, x_w, start_h, start_w = (x_geo.offset, x_geo.height, x_geo.width, x_geo.start_h,
                                         x_geo.start_w)  # fmt: skip
    dy_off, dy_h, dy_w = dy_geo.offset, dy_geo.height, dy_geo.width
    x_chan = ((group * ins + offs_i) * xsc)[None, :]
    dy_chan = ((group * outs + offs_k) * dsc)[None, :]
    first = chunk * tiles_per_chunk
    last = tl.minimum(first + tiles_per_chunk, x_geo.tiles)
    # ws's addresses before the loop (see brgemm_kernel's note on Triton 3.6 and geometry
    # reads after loops).
    elements = tl.num_programs(2) * outs * ins
    e = group * outs * ins + offs_k[:, None] * ins + offs_i[None, :]
    ws = WS + chunk.to(tl.int64) * (a * a) * elements + e
    mask = k_ok[:, None] & i_ok[None, :]

    acc = ()
    for _p in tl.static_range(a * a):
        acc = acc + (tl.zeros((BLOCK_K, CHANNELS), dtype=tl.float32),)
    for t0 in range(first, last, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        t_ok = offs_t < last
        n, th, tw = _split_tile(offs_t, x_geo)
        dy = _load_tile(DY, dy_off + n * dsn, dy_chan, t_ok, k_ok[None, :], th * STEP,
                        tw * STEP, dy_h, dy_w, dsh, dsw, m)  # fmt: skip
        y = transform2d(A_MAT, dy)  # a x a of [BLOCK_T, BLOCK_K]
        x = _load_tile(X, x_off + n * xsn, x_chan, t_ok, i_ok[None, :], th * STEP + start_h,
                       tw * STEP + start_w, x_h, x_w, xsh, xsw, a)  # fmt: skip
        v = transform2d(BT_MAT, x)  # a x a of [BLOCK_T, CHANNELS]
        new = ()
        for i in tl.static_range(a):
            for j in tl.static_range(a):
                prod = y[i][j][:, :, None] * v[i][j][:, None, :]
                new = new + (acc[i * a + j] + tl.sum(prod, axis=0),)
        acc = new
    for p in tl.static_range(a * a):
        tl.store(ws + p * elements, acc[p], mask=mask)


@triton.jit
def fused_kernel(
    SRC,
    U,
    Y,
    BIAS,
    in_geo,
    out_geo,
    ins,
    outs,
    alpha,
    beta,
    BT_MAT: tl.constexpr,
    AT_MAT: tl.constexpr,
    STEP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BETA_NONZERO: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    FMA: tl.constexpr,
):
    """The whole of F(m x m, 3 x 3) in one pass for BLOCK_T tiles x BLOCK_K output channels of
    one group: for each chunk of BLOCK_C input channels the input tiles are transformed in
    registers and multiplied, point by point, with the transformed filter U (float32
    [a * a, groups, ins, outs], from filter_transform_kernel); the a * a accumulators then go
    through the output transform and the epilogue. Grid: (tile blocks x channel blocks,
    groups).

    FMA (layers of a few reduced channels a group, an RGB stem's 3): the products as float32
    FMAs, one channel at a time (BLOCK_C and PRECISION unused): a tensor-core product would
    reduce over 8 or more channels, most of them padding, where each point takes one outer
    product a channel here, its transformed inputs of BLOCK_T tiles by its transformed
    filter row of BLOCK_K channels; exact in float32 under any math mode. BLOCK_K below 16 (a
    few written channels a group): each point's product is summed from float32 FMAs, as
    tensor-core products are at least 16 columns wide."""
    a: tl.constexpr = len(BT_MAT)
    group = tl.program_id(1)
    k_blocks = tl.cdiv(outs, BLOCK_K)
    offs_t = (tl.program_id(0) // k_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_k = (tl.program_id(0) % k_blocks) * BLOCK_K + tl.arange(0, BLOCK_K)
    n, th, tw = _split_tile(offs_t, in_geo)
    sn, sc, sh, sw = in_geo.strides
    t_ok = offs_t < in_geo.tiles
    k_ok = offs_k < outs
    row0 = th * STEP + in_geo.start_h
    col0 = tw * STEP + in_geo.start_w
    base = in_geo.offset + n * sn + group * ins * sc
    height, width = in_geo.height, in_geo.width
    # The output's addresses before the loop (see brgemm_kernel's note on Triton 3.6 and
    # geometry reads after loops).
    on, oth, otw = _split_tile(offs_t, out_geo)
    osn, osc, osh, osw = out_geo.strides
    out_base = out_geo.offset + on * osn
    out_h0 = oth * STEP
    out_w0 = otw * STEP
    out_height, out_width = out_geo.height, out_geo.width
    chan = group * outs + offs_k
    plane = tl.num_programs(1) * ins * outs  # elements of U per point
    u_cols = U + group * ins * outs + offs_k[None, :]

    acc = ()
    for _p in tl.static_range(a * a):
        acc = acc + (tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32),)
    if FMA:
        # A loop at run time, not unrolled: the compiler would hoist every channel's loads.
        for c in range(ins):
            # One channel's tiles as [BLOCK_T, 1] columns, broadcast against the filter rows.
            x = _load_tile(SRC, base, c * sc, t_ok, True, row0, col0, height, width, sh, sw, a)
            v = transform2d(BT_MAT, x)
            new = ()
            for i in tl.static_range(a):
                for j in tl.static_range(a):
                    u = tl.load(u_cols + c * outs + (i * a + j) * plane, mask=k_ok[None, :],
                                other=0.0)  # fmt: skip
                    new = new + (acc[i * a + j] + v[i][j] * u,)
            acc = new
    else:
        offs_c = tl.arange(0, BLOCK_C)
        for c0 in range(0, ins, BLOCK_C):
            c = c0 + offs_c
            c_ok = c < ins
            x = _load_tile(SRC, base, (c * sc)[None, :], t_ok, c_ok[None, :], row0, col0,
                           height, width, sh, sw, a)  # fmt: skip
            v = transform2d(BT_MAT, x)
            u_ptrs = u_cols + c[:, None] * outs
            u_mask = c_ok[:, None] & k_ok[None, :]
            new = ()
            for i in tl.static_range(a):
                for j in tl.static_range(a):
                    u = tl.load(u_ptrs + (i * a + j) * plane, mask=u_mask, other=0.0)
                    if BLOCK_K < 16:
                        # Narrower than a tensor-core product (a few written channels: a stem's
                        # backward-data): summed from float32 FMAs.
                        prod = tl.sum(v[i][j][:, :, None] * u[None, :, :], axis=1)
                        new = new + (acc[i * a + j] + prod,)
                    else:
                        prod = tl.dot(v[i][j], u, acc[i * a + j], input_precision=PRECISION)
                        new = new + (prod,)
            acc = new
    _output_transform(Y, BIAS, acc, AT_MAT, out_base, chan * osc, chan, k_ok, t_ok, out_h0,
                      out_w0, out_height, out_width, osh, osw, alpha, beta, HAS_BIAS,
                      BETA_NONZERO)  # fmt: skip


@triton.jit
def _output_transform(Y, BIAS, acc, AT_MAT: tl.constexpr, base, chan, offs_c, c_ok, t_ok, row0,
                      col0, height, width, sh, sw, alpha, beta, HAS_BIAS: tl.constexpr,
                      BETA_NONZERO: tl.constexpr):  # fmt: skip
    """The fused kernels' end: the a * a point accumulators (a flat tuple) through the output
    transform AT_MAT, then the epilogue into Y (_store_tile)."""
    a: tl.constexpr = len(AT_MAT[0])
    prods = ()
    for i in tl.static_range(a):
        row = ()
        for j in tl.static_range(a):
            row = row + (acc[i * a + j],)
        prods = prods + (row,)
    y = transform2d(AT_MAT, prods)
    _store_tile(
        Y,
        BIAS,
        y,
        base,
        chan,
        offs_c,
        c_ok,
        t_ok,
        row0,
        col0,
        height,
        width,
        sh,
        sw,
        alpha,
        beta,
        HAS_BIAS,
        BETA_NONZERO,
    )
