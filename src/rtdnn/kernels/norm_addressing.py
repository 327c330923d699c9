"""Addressing and statistics shared by every normalization kernel.

Every normalization (batch, layer, RMS, group, instance) is one computation on a tensor whose
dims are split into *kept* dims, which index the statistics, and *reduced* dims, which each
statistic is taken over:

    batch norm (spatial)      x (N, C, *S)        kept (C)          reduced (N, *S)
    batch norm (per-act.)     x (N, C, *S)        kept (C, *S)      reduced (N)
    layer / RMS norm          x (*L, *D)          kept (*L)         reduced (*D)
    group norm                x (N, G, C/G, *S)   kept (N, G)       reduced (C/G, *S)
    instance norm             x (N, C, *S)        kept (N, C)       reduced (*S)

The host merges adjacent dims wherever every tensor of the call allows it and pads to four
kept and four reduced dims (size 1 in front). A tensor is then addressed by a `Layout`: its
strides over the kept dims and over the reduced dims. Broadcast operands (weight, bias,
statistics) are just tensors with zero strides, so one kernel serves every family.

Kernels work on tiles of [BLOCK_R reduced positions, BLOCK_K kept indices]. A program owns a
block of kept indices, whose offsets it computes once; it then walks reduced tiles. Tile t is
(i0, i1, i2, chunk of dim 3): the three outer reduced indices are scalars and only the inner
dim is a vector, so no per-element division is needed in the loop.

Kernels unpack `geo` and the layouts into plain tuples before any loop and pass those to the
helpers: Triton 3.6 fails to compile an index into a NamedTuple argument inside a loop when
the indexed leaf was specialized to a constant (a size or stride of 1).

Statistics are accumulated per element with Welford's update (each register of a tile keeps
its own count, mean and M2 over the tiles it has seen), combined across the tile once at the end
and across programs with Chan et al.'s parallel formula, all on x - shift (the statistic's
first value). This keeps full float32 precision on data with a large mean and a small spread,
where E[x^2] - E[x]^2 would cancel, and it is deterministic: the order of the merges is fixed.
"""

from typing import NamedTuple

import triton
import triton.language as tl

from .mathfn import sigmoid

#: Activations that the fused kernels apply after the normalization (and the residual add):
#: torch's ReLU, SiLU (x * sigmoid(x)) and Hardswish (x * relu6(x + 3) / 6).
ACTIVATIONS = ("identity", "relu", "silu", "hardswish")


class NormGeometry(NamedTuple):
    ksize: tuple  # four kept dims, outermost first; the flat kept index is row-major over them
    rsize: tuple  # four reduced dims; rsize[3] is the vector dim of a tile
    kept: int  # number of statistics: the product of ksize
    chunks: int  # cdiv(rsize[3], BLOCK_R)
    tiles: int  # rsize[0] * rsize[1] * rsize[2] * chunks


class Layout(NamedTuple):
    k: tuple  # strides (elements) over the four kept dims
    r: tuple  # strides over the four reduced dims


@triton.jit
def kept_offsets(k, ksize, kstride, KD: tl.constexpr):
    """Element offsets of flat kept indices `k`; KD (1 to 4) dims are actually split."""
    s0, s1, s2, s3 = ksize
    t0, t1, t2, t3 = kstride
    if KD == 1:
        off = k * t3
    else:
        off = (k % s3) * t3
        q = k // s3
        if KD == 2:
            off += q * t2
        else:
            off += (q % s2) * t2
            q = q // s2
            if KD == 3:
                off += q * t1
            else:
                off += (q % s1) * t1 + (q // s1) * t0
    return off


@triton.jit
def tile_coords(t, rsize, chunks, BLOCK_R: tl.constexpr):
    """Reduced tile t -> (i0, i1, i2, first index of its chunk of dim 3), all scalars."""
    s0, s1, s2, s3 = rsize
    c = t % chunks
    q = t // chunks
    i2 = q % s2
    q = q // s2
    i1 = q % s1
    i0 = q // s1
    return i0, i1, i2, c * BLOCK_R


@triton.jit
def tile_offsets(coords, rstride, offs_r):
    """Element offsets (a BLOCK_R vector) of one tile's reduced positions in one tensor."""
    i0, i1, i2, start = coords
    t0, t1, t2, t3 = rstride
    return i0 * t0 + i1 * t1 + i2 * t2 + (start + offs_r) * t3


@triton.jit
def tile_mask(coords, rsize, offs_r, kmask):
    """[BLOCK_R, BLOCK_K] validity of a tile, and its reduced-position mask alone."""
    i0, i1, i2, start = coords
    s0, s1, s2, s3 = rsize
    rmask = (start + offs_r) < s3
    return rmask[:, None] & kmask[None, :], rmask


@triton.jit
def load_tile(PTR, rstride, coords, offs_r, koff, mask):
    """A [BLOCK_R, BLOCK_K] tile of one tensor as float32 (0 where masked); `rstride` is the
    tensor's reduced strides, `koff` its offsets of the tile's kept indices."""
    roff = tile_offsets(coords, rstride, offs_r)
    return tl.load(PTR + roff[:, None] + koff[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_tile(
    PTR, rstride, coords, offs_r, koff, mask, value, alpha, beta, BETA_NONZERO: tl.constexpr
):
    """PTR[tile] = alpha * value + beta * PTR[tile], cast to PTR's dtype.

    The prior value is read only when beta != 0: an unset output may hold NaN, and 0 * NaN
    is NaN.
    """
    ptrs = PTR + tile_offsets(coords, rstride, offs_r)[:, None] + koff[None, :]
    out = alpha * value
    if BETA_NONZERO:
        out += beta * tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, out.to(PTR.dtype.element_ty), mask=mask)


@triton.jit
def welford_step(x, shift, mask, rmask, cnt, mean, m2):
    """One tile into per-element Welford accumulators: cnt [BLOCK_R] counts the tiles each
    row position has seen, mean and m2 [BLOCK_R, BLOCK_K] are over x - shift. No reduction
    across threads here: the loop body stays a load and a few multiply-adds."""
    d = x - shift[None, :]
    cnt += rmask.to(tl.float32)
    inv = 1.0 / tl.maximum(cnt, 1.0)
    delta = tl.where(mask, d - mean, 0.0)
    mean += delta * inv[:, None]
    m2 += delta * (d - mean)
    return cnt, mean, m2


@triton.jit
def welford_finish(cnt, mean, m2):
    """Per-element accumulators -> (count, mean, M2) per kept lane, by Chan's formula over the
    BLOCK_R positions (count-weighted mean, M2 plus the spread of the position means)."""
    n = tl.sum(cnt, axis=0)
    total = tl.sum(cnt[:, None] * mean, axis=0) / tl.maximum(n, 1.0)
    d = mean - total[None, :]
    return n, total, tl.sum(m2 + cnt[:, None] * d * d, axis=0)


@triton.jit
def chan_merge(n_a, mean_a, m2_a, n_b, mean_b, m2_b):
    """Chan et al.: merge two (count, mean, M2) summaries of disjoint sets of values."""
    n = n_a + n_b
    w = tl.where(n > 0, n_b / tl.maximum(n, 1.0), 0.0)
    delta = mean_b - mean_a
    return n, mean_a + delta * w, m2_a + m2_b + delta * delta * (n_a * w)


@triton.jit
def inv_std(mean, m2, n, eps, IS_RMS: tl.constexpr):
    """1 / sqrt(var + eps) from a summary; RMS norm uses the mean square var + mean^2."""
    var = m2 / n
    if IS_RMS:
        var += mean * mean
    return 1.0 / tl.sqrt(var + eps)


@triton.jit
def activate(v, ACT: tl.constexpr):
    """ACT indexes ACTIVATIONS."""
    if ACT == 1:
        v = tl.maximum(v, 0.0)
    elif ACT == 2:
        v = v * sigmoid(v)
    elif ACT == 3:
        v = v * (tl.minimum(tl.maximum(v + 3.0, 0.0), 6.0) / 6.0)
    return v


@triton.jit
def activation_grad(pre, dy, ACT: tl.constexpr):
    """dy * act'(pre), the gradient at the activation's input (torch's formulas, also at the
    kinks: relu' = 0 at 0; hardswish' = x / 3 + 1/2 on [-3, 3])."""
    if ACT == 1:
        dy = tl.where(pre > 0.0, dy, 0.0)
    elif ACT == 2:
        s = sigmoid(pre)
        dy = dy * (s * (1.0 + pre * (1.0 - s)))
    elif ACT == 3:
        dy = tl.where(pre < -3.0, 0.0, tl.where(pre <= 3.0, dy * (pre / 3.0 + 0.5), dy))
    return dy


@triton.jit
def shift_of(X, xk, kmask, IS_RMS: tl.constexpr):
    """Each statistic's first value (reduced index 0, offset 0), a shift K. Statistics are
    accumulated on x - K, whose magnitude is the spread of the data, not its mean, so no
    partial mean near 1e3 is ever rounded to float32; RMS norm needs no shift (0)."""
    if IS_RMS:
        return tl.zeros(xk.shape, tl.float32)
    return tl.load(X + xk, mask=kmask, other=0.0).to(tl.float32)


@triton.jit
def normalized(x, shift, mean, rstd, IS_RMS: tl.constexpr):
    """xhat = ((x - shift) - mean) * rstd, mean taken relative to the shift (x - shift is exact
    for x near the shift); x * rstd for RMS norm (no centering)."""
    if IS_RMS:
        return x * rstd[None, :]
    return ((x - shift[None, :]) - mean[None, :]) * rstd[None, :]


@triton.jit
def preload_params(W, B, pk, kmask, HAS_W: tl.constexpr, HAS_B: tl.constexpr, PMODE: tl.constexpr):
    """Weight and bias vectors over the kept lanes, loaded once per program when they depend
    on the kept dims only (PMODE 1: batch norm); 1 and 0 otherwise."""
    w = 1.0
    b = 0.0
    if PMODE == 1:
        if HAS_W:
            w = tl.load(W + pk, mask=kmask, other=0.0).to(tl.float32)
        if HAS_B:
            b = tl.load(B + pk, mask=kmask, other=0.0).to(tl.float32)
    return w, b


@triton.jit
def _param(P, prs, coords, offs_r, pk, mask, rmask, pre, PMODE: tl.constexpr):
    if PMODE == 1:
        return pre[None, :]
    elif PMODE == 2:
        roff = tile_offsets(coords, prs, offs_r)
        return tl.load(P + roff, mask=rmask, other=0.0).to(tl.float32)[:, None]
    else:
        return load_tile(P, prs, coords, offs_r, pk, mask)


@triton.jit
def tile_params(
    W, B, prs, coords, offs_r, pk, mask, rmask, wpre, bpre,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, PMODE: tl.constexpr,
):  # fmt: skip
    """Weight and bias of one tile (1 and 0 when absent); `prs` their reduced strides. PMODE
    says what they depend on: 0 anything (a full tile is loaded), 1 the kept dims only
    (preloaded vectors), 2 the reduced dims only (one vector per tile: layer norm)."""
    w = 1.0
    b = 0.0
    if HAS_W:
        w = _param(W, prs, coords, offs_r, pk, mask, rmask, wpre, PMODE)
    if HAS_B:
        b = _param(B, prs, coords, offs_r, pk, mask, rmask, bpre, PMODE)
    return w, b
