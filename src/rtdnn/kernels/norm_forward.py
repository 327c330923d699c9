"""Normalization forward kernels (see norm_addressing.py for the geometry).

    y = alpha * act(xhat * w + b + z) + beta * y,   xhat = (x - mean) * rstd

Two ways to get there:

* Row kernel (`norm_row_forward_kernel`): one program owns a block of kept indices and every
  reduced position of them. When the whole reduced extent is one tile (SINGLE) the tile stays
  in registers, so x is read once, with exact two-pass statistics: layer and RMS norm rows,
  small groups. Otherwise the program walks the tiles twice (statistics, then the output); the
  second walk mostly hits L2.
* Split (deterministic): `norm_stats_kernel` runs a grid of (kept block, slice of reduced
  tiles); each program writes one (count, mean, M2) summary of its slice, and the last
  programs to finish merge the slices in a fixed order (a two-level tree), write mean and
  1/std and update running statistics; `norm_apply_kernel` is the elementwise pass. Used
  when there are too few kept indices to fill the GPU (batch norm: C channels over N*H*W
  rows). On a GPU `norm_stats_apply_kernel` runs both passes in one cooperative launch, a
  grid barrier between them (arrival.py): a training step's batch norms then cost the host
  one launch each, not two.
"""

import triton
import triton.language as tl

from .arrival import grid_sync_once, last_to_arrive, merge_tree
from .norm_addressing import (
    activate,
    chan_merge,
    inv_std,
    kept_offsets,
    load_tile,
    normalized,
    preload_params,
    shift_of,
    store_tile,
    tile_coords,
    tile_mask,
    tile_params,
    welford_finish,
    welford_step,
)


@triton.jit
def _output_tile(
    Y, Z, W, B, yr, zr, pr, coords, offs_r, yk, zk, pk, mask, rmask, xhat, wpre, bpre, alpha,
    beta, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_Z: tl.constexpr, ACT: tl.constexpr,
    BETA_NONZERO: tl.constexpr, PMODE: tl.constexpr,
):  # fmt: skip
    """Y[tile] = alpha * act(xhat * w + b + z) + beta * Y[tile]."""
    w, b = tile_params(W, B, pr, coords, offs_r, pk, mask, rmask, wpre, bpre, HAS_W, HAS_B, PMODE)
    v = xhat * w + b
    if HAS_Z:
        v += load_tile(Z, zr, coords, offs_r, zk, mask)
    store_tile(Y, yr, coords, offs_r, yk, mask, activate(v, ACT), alpha, beta, BETA_NONZERO)


@triton.jit
def _apply_tile(
    X, Y, Z, W, B, rsize, chunks, xr, yr, zr, pr, t, offs_r, xk, yk, zk, pk, kmask, shift,
    mean, rstd, wpre, bpre, alpha, beta, IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr, HAS_Z: tl.constexpr, ACT: tl.constexpr, BETA_NONZERO: tl.constexpr,
    PMODE: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    coords = tile_coords(t, rsize, chunks, BLOCK_R)
    mask, rmask = tile_mask(coords, rsize, offs_r, kmask)
    x = load_tile(X, xr, coords, offs_r, xk, mask)
    xhat = normalized(x, shift, mean, rstd, IS_RMS)
    _output_tile(
        Y, Z, W, B, yr, zr, pr, coords, offs_r, yk, zk, pk, mask, rmask, xhat, wpre, bpre,
        alpha, beta, HAS_W, HAS_B, HAS_Z, ACT, BETA_NONZERO, PMODE,
    )  # fmt: skip


@triton.jit
def norm_row_forward_kernel(
    X, Y, Z, W, B, MEAN, RSTD, geo, xl, yl, zl, pl, eps, inv_count, alpha, beta,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_Z: tl.constexpr,
    ACT: tl.constexpr, BETA_NONZERO: tl.constexpr, PMODE: tl.constexpr, SINGLE: tl.constexpr,
    KD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Grid: (cdiv(kept, BLOCK_K),). MEAN and RSTD are float32, indexed by the flat kept index."""
    ksize, rsize, kept, chunks, tiles = geo
    xks, xr = xl
    yks, yr = yl
    zks, zr = zl
    pks, pr = pl
    offs_k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    kmask = offs_k < kept
    xk = kept_offsets(offs_k, ksize, xks, KD)
    yk = kept_offsets(offs_k, ksize, yks, KD)
    zk = kept_offsets(offs_k, ksize, zks, KD)
    pk = kept_offsets(offs_k, ksize, pks, KD)
    wpre, bpre = preload_params(W, B, pk, kmask, HAS_W, HAS_B, PMODE)
    shift = shift_of(X, xk, kmask, IS_RMS)
    if SINGLE:
        # The whole reduced extent is one tile: exact two-pass statistics in registers.
        coords = tile_coords(0, rsize, chunks, BLOCK_R)
        mask, rmask = tile_mask(coords, rsize, offs_r, kmask)
        x = load_tile(X, xr, coords, offs_r, xk, mask)
        if IS_RMS:
            mean = tl.zeros((BLOCK_K,), tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) * inv_count + eps)
            xhat = x * rstd[None, :]
        else:
            d = tl.where(mask, x - shift[None, :], 0.0)
            mean = tl.sum(d, axis=0) * inv_count
            d = tl.where(mask, d - mean[None, :], 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) * inv_count + eps)
            xhat = d * rstd[None, :]
        _output_tile(
            Y, Z, W, B, yr, zr, pr, coords, offs_r, yk, zk, pk, mask, rmask, xhat, wpre, bpre,
            alpha, beta, HAS_W, HAS_B, HAS_Z, ACT, BETA_NONZERO, PMODE,
        )  # fmt: skip
    else:
        cnt = tl.zeros((BLOCK_R,), tl.float32)
        acc_mean = tl.zeros((BLOCK_R, BLOCK_K), tl.float32)
        acc_m2 = tl.zeros((BLOCK_R, BLOCK_K), tl.float32)
        for t in range(0, tiles):
            coords = tile_coords(t, rsize, chunks, BLOCK_R)
            mask, rmask = tile_mask(coords, rsize, offs_r, kmask)
            x = load_tile(X, xr, coords, offs_r, xk, mask)
            cnt, acc_mean, acc_m2 = welford_step(x, shift, mask, rmask, cnt, acc_mean, acc_m2)
        n, mean, m2 = welford_finish(cnt, acc_mean, acc_m2)
        rstd = inv_std(mean, m2, n, eps, IS_RMS)
        for t in range(0, tiles):
            _apply_tile(
                X, Y, Z, W, B, rsize, chunks, xr, yr, zr, pr, t, offs_r, xk, yk, zk, pk, kmask,
                shift, mean, rstd, wpre, bpre, alpha, beta, IS_RMS, HAS_W, HAS_B, HAS_Z, ACT,
                BETA_NONZERO, PMODE, BLOCK_R,
            )  # fmt: skip
    tl.store(MEAN + offs_k, shift + mean, mask=kmask)
    tl.store(RSTD + offs_k, rstd, mask=kmask)


@triton.jit
def norm_stats_kernel(
    X, PART, MEAN, RSTD, RUN_MEAN, RUN_VAR, ARRIVALS, geo, xl, tiles_per_slice, fan_in, eps,
    momentum, IS_RMS: tl.constexpr, UPDATE_RUNNING: tl.constexpr, KD: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """Grid: (cdiv(kept, BLOCK_K), slices). Each program summarizes its slice of the reduced
    tiles in PART (4, slices, kept) float32: count, mean of x - shift, M2, and the shift (the
    same in every slice: the statistic's first value).

    The summaries are merged in a two-level tree, in the same launch (see arrival.py): slices
    form groups of `fan_in`; the last program of a group to arrive merges the group's
    summaries into the group's first slot, and the last group to finish merges the groups'
    and writes the statistics (`_write_stats`). Two short merges instead of one long one: the
    merging programs run while the others still stream x. ARRIVALS holds groups + 1 int32
    counters per kept block, zero before and after."""
    _stats_pass(
        X, PART, MEAN, RSTD, RUN_MEAN, RUN_VAR, ARRIVALS, geo, xl, tiles_per_slice, fan_in,
        eps, momentum, tl.program_id(0), tl.program_id(1), tl.num_programs(1), IS_RMS,
        UPDATE_RUNNING, KD, BLOCK_R, BLOCK_K, BLOCK_S, STAGES,
    )  # fmt: skip


@triton.jit
def _stats_pass(
    X, PART, MEAN, RSTD, RUN_MEAN, RUN_VAR, ARRIVALS, geo, xl, tiles_per_slice, fan_in, eps,
    momentum, kb, s, slices, IS_RMS: tl.constexpr, UPDATE_RUNNING: tl.constexpr,
    KD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    """The statistics pass of kept block kb, slice s of `slices` (norm_stats_kernel)."""
    ksize, rsize, kept, chunks, tiles = geo
    xks, xr = xl
    offs_k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    kmask = offs_k < kept
    xk = kept_offsets(offs_k, ksize, xks, KD)
    first = s * tiles_per_slice
    last = tl.minimum(first + tiles_per_slice, tiles)
    cnt = tl.zeros((BLOCK_R,), tl.float32)
    acc_mean = tl.zeros((BLOCK_R, BLOCK_K), tl.float32)
    acc_m2 = tl.zeros((BLOCK_R, BLOCK_K), tl.float32)
    # Triton's software pipeline keeps the next tiles in flight through shared memory, not
    # registers (which the accumulators fill). Two stages took 2 to 14% less time than
    # double buffering in registers on the ResNet-50 shapes, and less than three or four
    # stages (benchmarks/probes/split_norm_sweep.py); per-element shifted sums instead of Welford
    # updates made no difference, so the arithmetic is not what limits this pass.
    shift = shift_of(X, xk, kmask, IS_RMS)
    for t in tl.range(first, last, num_stages=STAGES):
        coords = tile_coords(t, rsize, chunks, BLOCK_R)
        mask, rmask = tile_mask(coords, rsize, offs_r, kmask)
        x = load_tile(X, xr, coords, offs_r, xk, mask)
        cnt, acc_mean, acc_m2 = welford_step(x, shift, mask, rmask, cnt, acc_mean, acc_m2)
    n, mean, m2 = welford_finish(cnt, acc_mean, acc_m2)
    plane = slices * kept
    _store_summary(PART + s * kept + offs_k, plane, n, mean, m2, kmask)
    tl.store(PART + s * kept + offs_k + 3 * plane, shift, mask=kmask)

    group, members, groups, counters = merge_tree(ARRIVALS, kb, s, slices, fan_in)
    # (New names below: Triton wants a variable's type to stay the same across an if.)
    if last_to_arrive(counters + group, members):
        group_slot = PART + group * fan_in * kept + offs_k
        n_g, mean_g, m2_g = _merge_summaries(group_slot, kept, plane, members, kmask, BLOCK_S)
        _store_summary(group_slot, plane, n_g, mean_g, m2_g, kmask)
        if last_to_arrive(counters + groups, groups):
            n_t, mean_t, m2_t = _merge_summaries(
                PART + offs_k, fan_in * kept, plane, groups, kmask, BLOCK_S
            )
            _write_stats(
                PART, MEAN, RSTD, RUN_MEAN, RUN_VAR, offs_k, kmask, plane, n_t, mean_t, m2_t,
                eps, momentum, IS_RMS, UPDATE_RUNNING,
            )  # fmt: skip


@triton.jit
def _store_summary(slot, plane, n, mean, m2, kmask):
    tl.store(slot, n, mask=kmask)
    tl.store(slot + plane, mean, mask=kmask)
    tl.store(slot + 2 * plane, m2, mask=kmask)


@triton.jit
def _merge_summaries(first, stride, plane, count, kmask, BLOCK_S: tl.constexpr):
    """Merge `count` (n, mean, M2) summaries, `stride` elements apart from `first`, in order:
    BLOCK_S at a time (their count-weighted mean and M2 with the spread of their means, in
    registers), then chunk after chunk with Chan's formula. They were written by other
    programs: read through L2 (".cg"), never a stale L1."""
    n = tl.zeros(kmask.shape, tl.float32)
    mean = tl.zeros(kmask.shape, tl.float32)
    m2 = tl.zeros(kmask.shape, tl.float32)
    for s0 in range(0, count, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        mask = (offs_s < count)[:, None] & kmask[None, :]
        ptrs = first + offs_s[:, None] * stride
        n_s = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg")
        mean_s = tl.load(ptrs + plane, mask=mask, other=0.0, cache_modifier=".cg")
        m2_s = tl.load(ptrs + 2 * plane, mask=mask, other=0.0, cache_modifier=".cg")
        n_c = tl.sum(n_s, axis=0)
        mean_c = tl.sum(n_s * mean_s, axis=0) / tl.maximum(n_c, 1.0)
        d = mean_s - mean_c[None, :]
        m2_c = tl.sum(m2_s + n_s * d * d, axis=0)
        n, mean, m2 = chan_merge(n, mean, m2, n_c, mean_c, m2_c)
    return n, mean, m2


@triton.jit
def _write_stats(
    PART, MEAN, RSTD, RUN_MEAN, RUN_VAR, offs_k, kmask, plane, n, mean, m2, eps, momentum,
    IS_RMS: tl.constexpr, UPDATE_RUNNING: tl.constexpr,
):  # fmt: skip
    """From the merged summary (mean of x - shift): mean and 1/std (float32) and, with
    UPDATE_RUNNING, running = (1 - momentum) * running + momentum * batch statistic, where
    the running variance takes the unbiased batch variance M2 / (n - 1), as cuDNN and torch do.

    The merged mean of x - shift goes to slot 0 of PART's mean plane: the apply pass
    normalizes with (x - shift) - mean, exact where x - mean rounded to float32 is not."""
    n = tl.maximum(n, 1.0)  # masked lanes only
    shift = tl.load(PART + 3 * plane + offs_k, mask=kmask, other=0.0, cache_modifier=".cg")
    tl.store(PART + plane + offs_k, mean, mask=kmask)
    tl.store(MEAN + offs_k, shift + mean, mask=kmask)
    tl.store(RSTD + offs_k, inv_std(mean, m2, n, eps, IS_RMS), mask=kmask)
    if UPDATE_RUNNING:
        rm = tl.load(RUN_MEAN + offs_k, mask=kmask, other=0.0).to(tl.float32)
        rv = tl.load(RUN_VAR + offs_k, mask=kmask, other=0.0).to(tl.float32)
        unbiased = m2 / tl.maximum(n - 1.0, 1.0)
        rm = (1.0 - momentum) * rm + momentum * (shift + mean)
        rv = (1.0 - momentum) * rv + momentum * unbiased
        tl.store(RUN_MEAN + offs_k, rm.to(RUN_MEAN.dtype.element_ty), mask=kmask)
        tl.store(RUN_VAR + offs_k, rv.to(RUN_VAR.dtype.element_ty), mask=kmask)


@triton.jit
def norm_apply_kernel(
    X, Y, Z, W, B, SHIFT, MEAN, RSTD, geo, xl, yl, zl, pl, sl, eps, alpha, beta,
    tiles_per_slice, mean_offset, shift_offset, SHIFTED: tl.constexpr,
    STATS_ARE_VAR: tl.constexpr, IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr, HAS_Z: tl.constexpr, ACT: tl.constexpr, BETA_NONZERO: tl.constexpr,
    PMODE: tl.constexpr, KD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The elementwise pass. Grid: (cdiv(kept, BLOCK_K), slices). SHIFT, MEAN and RSTD are
    addressed by `sl`, MEAN and SHIFT from elements mean_offset and shift_offset on (the split
    path passes its workspace for both). SHIFTED: MEAN is relative to SHIFT (from the split
    statistics); else SHIFT is unused. STATS_ARE_VAR: RSTD holds a variance (running
    statistics, inference) and 1 / sqrt(var + eps) is taken here, once per kept index.
    Program (k, s) writes slice slices - 1 - s, the tiles of its slice in reverse order."""
    # Last slice first: the statistics pass has just read the end of x, which is still in L2
    # (all of it, for x smaller than L2).
    first = (tl.num_programs(1) - 1 - tl.program_id(1)) * tiles_per_slice
    _apply_pass(
        X, Y, Z, W, B, SHIFT, MEAN, RSTD, geo, xl, yl, zl, pl, sl, eps, alpha, beta,
        tiles_per_slice, mean_offset, shift_offset, tl.program_id(0), first, SHIFTED,
        STATS_ARE_VAR, IS_RMS, HAS_W, HAS_B, HAS_Z, ACT, BETA_NONZERO, PMODE, KD, BLOCK_R,
        BLOCK_K,
    )  # fmt: skip


@triton.jit
def _apply_pass(
    X, Y, Z, W, B, SHIFT, MEAN, RSTD, geo, xl, yl, zl, pl, sl, eps, alpha, beta,
    tiles_per_slice, mean_offset, shift_offset, kb, first, SHIFTED: tl.constexpr,
    STATS_ARE_VAR: tl.constexpr, IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr, HAS_Z: tl.constexpr, ACT: tl.constexpr, BETA_NONZERO: tl.constexpr,
    PMODE: tl.constexpr, KD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The elementwise pass over kept block kb's tiles from `first` (norm_apply_kernel). The
    statistics are read through L2: in a fused launch other programs wrote them."""
    ksize, rsize, kept, chunks, tiles = geo
    xks, xr = xl
    yks, yr = yl
    zks, zr = zl
    pks, pr = pl
    sks, sr = sl
    offs_k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    kmask = offs_k < kept
    xk = kept_offsets(offs_k, ksize, xks, KD)
    yk = kept_offsets(offs_k, ksize, yks, KD)
    zk = kept_offsets(offs_k, ksize, zks, KD)
    pk = kept_offsets(offs_k, ksize, pks, KD)
    sk = kept_offsets(offs_k, ksize, sks, KD)
    mean = tl.load(MEAN + mean_offset + sk, mask=kmask, other=0.0, cache_modifier=".cg")
    mean = mean.to(tl.float32)
    rstd = tl.load(RSTD + sk, mask=kmask, other=1.0, cache_modifier=".cg").to(tl.float32)
    if SHIFTED:
        shift = tl.load(SHIFT + shift_offset + sk, mask=kmask, other=0.0, cache_modifier=".cg")
    else:
        shift = tl.zeros((BLOCK_K,), tl.float32)
    if STATS_ARE_VAR:
        rstd = 1.0 / tl.sqrt(rstd + eps)
    wpre, bpre = preload_params(W, B, pk, kmask, HAS_W, HAS_B, PMODE)
    # Each slice's tiles last first: what was read last is the likeliest still in L2.
    last = tl.minimum(first + tiles_per_slice, tiles)
    for i in range(first, last):
        t = first + last - 1 - i
        _apply_tile(
            X, Y, Z, W, B, rsize, chunks, xr, yr, zr, pr, t, offs_r, xk, yk, zk, pk, kmask,
            shift, mean, rstd, wpre, bpre, alpha, beta, IS_RMS, HAS_W, HAS_B, HAS_Z, ACT,
            BETA_NONZERO, PMODE, BLOCK_R,
        )  # fmt: skip


@triton.jit
def norm_stats_apply_kernel(
    X, Y, Z, W, B, PART, MEAN, RSTD, RUN_MEAN, RUN_VAR, ARRIVALS, geo, xl, yl, zl, pl, sl,
    tiles_per_slice, fan_in, sync_offset, eps, momentum, alpha, beta, IS_RMS: tl.constexpr,
    UPDATE_RUNNING: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    HAS_Z: tl.constexpr, ACT: tl.constexpr, BETA_NONZERO: tl.constexpr, PMODE: tl.constexpr,
    KD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    """The split path's two passes in one cooperative launch (grid as norm_stats_kernel's,
    every program resident): each program summarizes its slice as norm_stats_kernel does,
    waits at a grid barrier for the last one to write the statistics (ARRIVALS +
    sync_offset: two more counters, zero before and after), then normalizes the same slice,
    its tiles last first, the ones it read last still in L2. One launch instead of two: the
    host's cost of a batch norm's forward is mostly its launches."""
    kb = tl.program_id(0)
    s = tl.program_id(1)
    slices = tl.num_programs(1)
    _, _, kept, _, _ = geo
    _stats_pass(
        X, PART, MEAN, RSTD, RUN_MEAN, RUN_VAR, ARRIVALS, geo, xl, tiles_per_slice, fan_in,
        eps, momentum, kb, s, slices, IS_RMS, UPDATE_RUNNING, KD, BLOCK_R, BLOCK_K, BLOCK_S,
        STAGES,
    )  # fmt: skip
    grid_sync_once(ARRIVALS + sync_offset, tl.num_programs(0) * slices)
    # The mean relative to the shift sits in PART's plane 1, the shift in plane 3 (_write_stats).
    _apply_pass(
        X, Y, Z, W, B, PART, PART, RSTD, geo, xl, yl, zl, pl, sl, eps, alpha, beta,
        tiles_per_slice, slices * kept, 3 * slices * kept, kb, s * tiles_per_slice, True,
        False, IS_RMS, HAS_W, HAS_B, HAS_Z, ACT, BETA_NONZERO, PMODE, KD, BLOCK_R, BLOCK_K,
    )  # fmt: skip
