"""Normalization backward kernels (see norm_addressing.py for the geometry).

With xhat = (x - mean) * rstd, pre = xhat * w + b + z, y = act(pre) and M reduced positions:

    dpre = dy * act'(pre)                     (act' recomputed from x, w, b, z: no y needed)
    dz   = dpre
    dx   = rstd * (w * dpre - mean_r(w * dpre) - xhat * mean_r(w * dpre * xhat))
    dw   = sum over everything but w's own dims of dpre * xhat,   db likewise of dpre

RMS norm drops the mean_r(w * dpre) term (xhat = x * rstd); inference-mode batch norm, whose
statistics are constants, keeps only dx = rstd * w * dpre.

* Row kernel (`norm_row_backward_kernel`, layer and RMS norm): a persistent grid; each program
  walks blocks of kept rows, computes both row sums and dx with the row in registers (SINGLE)
  or in two walks over its tiles, and accumulates dw and db for the reduced positions in its
  own partial row. `param_grad_finish_kernel` adds the partial rows in program order.
* Split (batch, group and instance norm): `norm_bwd_partial_kernel` writes per-slice sums of
  dpre and dpre * xhat per kept index (and dz, so that the last pass reads dz instead of
  recomputing the activation from dy, x and z); `norm_bwd_finish_kernel` adds the slices in
  order and gives dw, db and the two per-statistic coefficients (for batch norm the partial
  kernel's last program of each kept block does this itself, see arrival.py);
  `norm_bwd_apply_kernel` is the elementwise dx pass. On a GPU, batch norm's training
  backward runs both in one cooperative launch (`norm_bwd_fused_kernel`, a grid barrier
  between the passes).

Every sum has a fixed order, so results are bitwise reproducible (the only atomics count
programs' arrivals).
"""

import triton
import triton.language as tl

from .arrival import grid_sync_once, last_to_arrive, merge_tree
from .norm_addressing import (
    activation_grad,
    kept_offsets,
    load_tile,
    normalized,
    preload_params,
    store_tile,
    tile_coords,
    tile_mask,
    tile_offsets,
    tile_params,
)


@triton.jit
def _grad_tile(
    DY, X, W, B, Z, dyr, xr, pr, zr, coords, offs_r, dyk, xk, pk, zk, mask, rmask, mean, rstd,
    wpre, bpre, IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    HAS_Z: tl.constexpr, ACT: tl.constexpr, PMODE: tl.constexpr,
):  # fmt: skip
    """xhat, dpre (dy through the activation; 0 where masked) and w (or 1) of one tile."""
    x = load_tile(X, xr, coords, offs_r, xk, mask)
    dy = load_tile(DY, dyr, coords, offs_r, dyk, mask)
    return _grad_values(
        x, dy, W, B, Z, pr, zr, coords, offs_r, pk, zk, mask, rmask, mean, rstd, wpre, bpre,
        IS_RMS, HAS_W, HAS_B, HAS_Z, ACT, PMODE,
    )  # fmt: skip


@triton.jit
def _grad_values(
    x, dy, W, B, Z, pr, zr, coords, offs_r, pk, zk, mask, rmask, mean, rstd, wpre, bpre,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_Z: tl.constexpr,
    ACT: tl.constexpr, PMODE: tl.constexpr,
):  # fmt: skip
    """_grad_tile on x and dy tiles already loaded."""
    xhat = normalized(x, tl.zeros_like(mean), mean, rstd, IS_RMS)
    if ACT != 0:
        w, b = tile_params(
            W, B, pr, coords, offs_r, pk, mask, rmask, wpre, bpre, HAS_W, HAS_B, PMODE
        )
        pre = xhat * w + b
        if HAS_Z:
            pre += load_tile(Z, zr, coords, offs_r, zk, mask)
        dy = activation_grad(pre, dy, ACT)
    else:
        w, b = tile_params(
            W, B, pr, coords, offs_r, pk, mask, rmask, wpre, bpre, HAS_W, False, PMODE
        )
    return xhat, dy, w


@triton.jit
def norm_row_backward_kernel(
    DY, X, W, B, Z, MEAN, RSTD, DX, PW, PB, geo, dyl, xl, pl, zl, dxl, inv_count, alpha, beta,
    kept_blocks, n_params,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_Z: tl.constexpr,
    ACT: tl.constexpr, BETA_NONZERO: tl.constexpr, PARAM_GRADS: tl.constexpr,
    BIAS_GRAD: tl.constexpr, PMODE: tl.constexpr, SINGLE: tl.constexpr, KD: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Grid: (programs,), each walking kept blocks pid, pid + programs, ...

    PW, PB: (programs, n_params) float32 partial sums of dw and (with BIAS_GRAD) db, addressed by
    the weight's layout `pl` over the reduced dims (which must not depend on the kept dims).
    """
    ksize, rsize, kept, chunks, tiles = geo
    dyks, dyr = dyl
    xks, xr = xl
    pks, pr = pl
    zks, zr = zl
    dxks, dxr = dxl
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offs_r = tl.arange(0, BLOCK_R)
    acc_w = tl.zeros((BLOCK_R,), tl.float32)
    acc_b = tl.zeros((BLOCK_R,), tl.float32)
    if SINGLE:
        # Every row is one tile, in registers. Double buffering: the rows of block
        # kb + programs are requested before block kb's arithmetic, so that the program always
        # has loads in flight (short rows are otherwise latency-bound).
        coords = tile_coords(0, rsize, chunks, BLOCK_R)
        offs_k = pid * BLOCK_K + tl.arange(0, BLOCK_K)
        kmask = offs_k < kept
        mask, rmask = tile_mask(coords, rsize, offs_r, kmask)
        x = load_tile(X, xr, coords, offs_r, kept_offsets(offs_k, ksize, xks, KD), mask)
        dy = load_tile(DY, dyr, coords, offs_r, kept_offsets(offs_k, ksize, dyks, KD), mask)
        mean = tl.load(MEAN + offs_k, mask=kmask, other=0.0)
        rstd = tl.load(RSTD + offs_k, mask=kmask, other=0.0)
        for kb in range(pid, kept_blocks, programs):
            next_k = (kb + programs) * BLOCK_K + tl.arange(0, BLOCK_K)
            next_kmask = next_k < kept
            next_mask, _ = tile_mask(coords, rsize, offs_r, next_kmask)
            x_next = load_tile(
                X, xr, coords, offs_r, kept_offsets(next_k, ksize, xks, KD), next_mask
            )
            dy_next = load_tile(
                DY, dyr, coords, offs_r, kept_offsets(next_k, ksize, dyks, KD), next_mask
            )
            mean_next = tl.load(MEAN + next_k, mask=next_kmask, other=0.0)
            rstd_next = tl.load(RSTD + next_k, mask=next_kmask, other=0.0)
            pk = kept_offsets(offs_k, ksize, pks, KD)
            zk = kept_offsets(offs_k, ksize, zks, KD)
            wpre, bpre = preload_params(W, B, pk, kmask, HAS_W, HAS_B, PMODE)
            xhat, dp, w = _grad_values(
                x, dy, W, B, Z, pr, zr, coords, offs_r, pk, zk, mask, rmask, mean, rstd, wpre,
                bpre, IS_RMS, HAS_W, HAS_B, HAS_Z, ACT, PMODE,
            )  # fmt: skip
            g = dp * w
            c2 = tl.sum(g * xhat, axis=0) * inv_count
            dx = g - xhat * c2[None, :]
            if not IS_RMS:
                dx -= (tl.sum(g, axis=0) * inv_count)[None, :]
            dxk = kept_offsets(offs_k, ksize, dxks, KD)
            store_tile(
                DX, dxr, coords, offs_r, dxk, mask, dx * rstd[None, :], alpha, beta, BETA_NONZERO
            )
            if PARAM_GRADS:
                acc_w += tl.sum(dp * xhat, axis=1)
                if BIAS_GRAD:
                    acc_b += tl.sum(dp, axis=1)
            offs_k, kmask, mask = next_k, next_kmask, next_mask
            x, dy, mean, rstd = x_next, dy_next, mean_next, rstd_next
    else:
        for kb in range(pid, kept_blocks, programs):
            offs_k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
            kmask = offs_k < kept
            dyk = kept_offsets(offs_k, ksize, dyks, KD)
            xk = kept_offsets(offs_k, ksize, xks, KD)
            pk = kept_offsets(offs_k, ksize, pks, KD)
            zk = kept_offsets(offs_k, ksize, zks, KD)
            dxk = kept_offsets(offs_k, ksize, dxks, KD)
            mean = tl.load(MEAN + offs_k, mask=kmask, other=0.0)
            rstd = tl.load(RSTD + offs_k, mask=kmask, other=0.0)
            wpre, bpre = preload_params(W, B, pk, kmask, HAS_W, HAS_B, PMODE)
            acc1 = tl.zeros((BLOCK_R, BLOCK_K), tl.float32)
            acc2 = tl.zeros((BLOCK_R, BLOCK_K), tl.float32)
            for t in range(0, tiles):
                coords = tile_coords(t, rsize, chunks, BLOCK_R)
                mask, rmask = tile_mask(coords, rsize, offs_r, kmask)
                xhat, dp, w = _grad_tile(
                    DY, X, W, B, Z, dyr, xr, pr, zr, coords, offs_r, dyk, xk, pk, zk, mask,
                    rmask, mean, rstd, wpre, bpre, IS_RMS, HAS_W, HAS_B, HAS_Z, ACT, PMODE,
                )  # fmt: skip
                g = dp * w
                acc1 += g
                acc2 += g * xhat
            c1 = tl.sum(acc1, axis=0) * inv_count
            c2 = tl.sum(acc2, axis=0) * inv_count
            for t in range(0, tiles):
                coords = tile_coords(t, rsize, chunks, BLOCK_R)
                mask, rmask = tile_mask(coords, rsize, offs_r, kmask)
                xhat, dp, w = _grad_tile(
                    DY, X, W, B, Z, dyr, xr, pr, zr, coords, offs_r, dyk, xk, pk, zk, mask,
                    rmask, mean, rstd, wpre, bpre, IS_RMS, HAS_W, HAS_B, HAS_Z, ACT, PMODE,
                )  # fmt: skip
                dx = dp * w - xhat * c2[None, :]
                if not IS_RMS:
                    dx -= c1[None, :]
                store_tile(
                    DX, dxr, coords, offs_r, dxk, mask, dx * rstd[None, :], alpha, beta,
                    BETA_NONZERO,
                )  # fmt: skip
                if PARAM_GRADS:
                    # This program's own partial row: read-modify-write with no other writer.
                    poff = pid * n_params + tile_offsets(coords, pr, offs_r)
                    pw = tl.load(PW + poff, mask=rmask, other=0.0)
                    tl.store(PW + poff, pw + tl.sum(dp * xhat, axis=1), mask=rmask)
                    if BIAS_GRAD:
                        pb = tl.load(PB + poff, mask=rmask, other=0.0)
                        tl.store(PB + poff, pb + tl.sum(dp, axis=1), mask=rmask)
                    # Threads of the block may hold replicas of one element: make the store
                    # visible to all of them before the next block's load.
                    tl.debug_barrier()
    if SINGLE and PARAM_GRADS:
        coords = tile_coords(0, rsize, chunks, BLOCK_R)
        rmask = offs_r < rsize[3]
        poff = pid * n_params + tile_offsets(coords, pr, offs_r)
        tl.store(PW + poff, acc_w, mask=rmask)
        if BIAS_GRAD:
            tl.store(PB + poff, acc_b, mask=rmask)


@triton.jit
def param_grad_finish_kernel(
    PW, PB, DW, DB, n_params, n_parts, HAS_DB: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """DW[p] = sum over parts i of PW[i, p] (and DB from PB), BLOCK_P parts per step in a
    fixed tree, the steps in order."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_params
    acc_w = tl.zeros((BLOCK,), tl.float32)
    acc_b = tl.zeros((BLOCK,), tl.float32)
    for i0 in range(0, n_parts, BLOCK_P):
        offs_i = i0 + tl.arange(0, BLOCK_P)
        m = (offs_i < n_parts)[:, None] & mask[None, :]
        ptrs = offs_i[:, None] * n_params + offs[None, :]
        acc_w += tl.sum(tl.load(PW + ptrs, mask=m, other=0.0), axis=0)
        if HAS_DB:
            acc_b += tl.sum(tl.load(PB + ptrs, mask=m, other=0.0), axis=0)
    tl.store(DW + offs, acc_w.to(DW.dtype.element_ty), mask=mask)
    if HAS_DB:
        tl.store(DB + offs, acc_b.to(DB.dtype.element_ty), mask=mask)


@triton.jit
def norm_bwd_partial_kernel(
    DY, X, W, B, Z, MEAN, RSTD, DZ, PART, DW, DB, COEF, ARRIVALS, geo, dyl, xl, pl, zl, sl, dzl,
    tiles_per_slice, fan_in, inv_count,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_Z: tl.constexpr,
    ACT: tl.constexpr, WRITE_DZ: tl.constexpr, PMODE: tl.constexpr, KD: tl.constexpr,
    FINISH: tl.constexpr, PARAM_GRADS: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Grid: (cdiv(kept, BLOCK_K), slices). PART (2, slices, kept) float32: the slice's sums of
    dpre * xhat and of dpre per kept index. With WRITE_DZ, dz = dpre is stored on the way.

    With FINISH (batch norm: one statistic and one weight per kept index) the slices' sums
    are added up in the same launch, in a two-level tree as in norm_stats_kernel (groups of
    `fan_in` slices, then the groups; ARRIVALS holds groups + 1 counters per kept block), and
    the last program writes what `norm_bwd_finish_kernel` would (`_write_bn_grads`).
    Otherwise that kernel runs next."""
    _partial_pass(
        DY, X, W, B, Z, MEAN, RSTD, DZ, PART, DW, DB, COEF, ARRIVALS, geo, dyl, xl, pl, zl, sl,
        dzl, tiles_per_slice, fan_in, inv_count, tl.program_id(0), tl.program_id(1),
        tl.num_programs(1), IS_RMS, HAS_W, HAS_B, HAS_Z, ACT, WRITE_DZ, PMODE, KD, FINISH,
        PARAM_GRADS, BLOCK_R, BLOCK_K, BLOCK_S,
    )  # fmt: skip


@triton.jit
def _partial_pass(
    DY, X, W, B, Z, MEAN, RSTD, DZ, PART, DW, DB, COEF, ARRIVALS, geo, dyl, xl, pl, zl, sl, dzl,
    tiles_per_slice, fan_in, inv_count, kb, s, slices,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_Z: tl.constexpr,
    ACT: tl.constexpr, WRITE_DZ: tl.constexpr, PMODE: tl.constexpr, KD: tl.constexpr,
    FINISH: tl.constexpr, PARAM_GRADS: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """The partial-sums pass of kept block kb, slice s of `slices` (norm_bwd_partial_kernel)."""
    ksize, rsize, kept, chunks, tiles = geo
    dyks, dyr = dyl
    xks, xr = xl
    pks, pr = pl
    zks, zr = zl
    sks, sr = sl
    dzks, dzr = dzl
    offs_k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    kmask = offs_k < kept
    dyk = kept_offsets(offs_k, ksize, dyks, KD)
    xk = kept_offsets(offs_k, ksize, xks, KD)
    pk = kept_offsets(offs_k, ksize, pks, KD)
    zk = kept_offsets(offs_k, ksize, zks, KD)
    sk = kept_offsets(offs_k, ksize, sks, KD)
    dzk = kept_offsets(offs_k, ksize, dzks, KD)
    mean = tl.load(MEAN + sk, mask=kmask, other=0.0)
    rstd = tl.load(RSTD + sk, mask=kmask, other=0.0)
    wpre, bpre = preload_params(W, B, pk, kmask, HAS_W, HAS_B, PMODE)
    # Per-element sums, reduced across the tile once at the end (not once per tile).
    a = tl.zeros((BLOCK_R, BLOCK_K), tl.float32)
    b = tl.zeros((BLOCK_R, BLOCK_K), tl.float32)
    first = s * tiles_per_slice
    last = tl.minimum(first + tiles_per_slice, tiles)
    # Double buffering: x and dy of tile t + 1 are requested before tile t's arithmetic, so
    # that a program always has loads in flight.
    coords = tile_coords(first, rsize, chunks, BLOCK_R)
    mask, rmask = tile_mask(coords, rsize, offs_r, kmask & (first < last))
    x = load_tile(X, xr, coords, offs_r, xk, mask)
    dy = load_tile(DY, dyr, coords, offs_r, dyk, mask)
    for t in range(first, last):
        coords = tile_coords(t, rsize, chunks, BLOCK_R)
        next_coords = tile_coords(t + 1, rsize, chunks, BLOCK_R)
        next_mask, next_rmask = tile_mask(next_coords, rsize, offs_r, kmask & (t + 1 < last))
        x_next = load_tile(X, xr, next_coords, offs_r, xk, next_mask)
        dy_next = load_tile(DY, dyr, next_coords, offs_r, dyk, next_mask)
        xhat, dp, w = _grad_values(
            x, dy, W, B, Z, pr, zr, coords, offs_r, pk, zk, mask, rmask, mean, rstd, wpre, bpre,
            IS_RMS, HAS_W, HAS_B, HAS_Z, ACT, PMODE,
        )  # fmt: skip
        a += dp * xhat
        b += dp
        if WRITE_DZ:
            store_tile(DZ, dzr, coords, offs_r, dzk, mask, dp, 1.0, 0.0, False)
        x, dy, mask, rmask = x_next, dy_next, next_mask, next_rmask
    plane = slices * kept
    slot = PART + s * kept + offs_k
    tl.store(slot, tl.sum(a, axis=0), mask=kmask)
    tl.store(slot + plane, tl.sum(b, axis=0), mask=kmask)
    if FINISH:
        group, members, groups, counters = merge_tree(ARRIVALS, kb, s, slices, fan_in)
        # (New names below: Triton wants a variable's type to stay the same across an if.)
        if last_to_arrive(counters + group, members):
            group_slot = PART + group * fan_in * kept + offs_k
            a_g, b_g = _sum_slots(group_slot, kept, plane, members, kmask, BLOCK_S)
            tl.store(group_slot, a_g, mask=kmask)
            tl.store(group_slot + plane, b_g, mask=kmask)
            if last_to_arrive(counters + groups, groups):
                a_t, b_t = _sum_slots(PART + offs_k, fan_in * kept, plane, groups, kmask, BLOCK_S)
                _write_bn_grads(
                    W, DW, DB, COEF, offs_k, kmask, kept, a_t, b_t, inv_count, HAS_W, PARAM_GRADS
                )


@triton.jit
def _sum_slots(first, stride, plane, count, kmask, BLOCK_S: tl.constexpr):
    """The sums of `count` (a, b) pairs `stride` elements apart from `first`, in order, BLOCK_S
    at a time; written by other programs, so read through L2 (".cg")."""
    a = tl.zeros(kmask.shape, tl.float32)
    b = tl.zeros(kmask.shape, tl.float32)
    for s0 in range(0, count, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        mask = (offs_s < count)[:, None] & kmask[None, :]
        ptrs = first + offs_s[:, None] * stride
        a += tl.sum(tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg"), axis=0)
        b += tl.sum(tl.load(ptrs + plane, mask=mask, other=0.0, cache_modifier=".cg"), axis=0)
    return a, b


@triton.jit
def _write_bn_grads(
    W, DW, DB, COEF, offs_k, kmask, kept, a, b, inv_count, HAS_W: tl.constexpr,
    PARAM_GRADS: tl.constexpr,
):  # fmt: skip
    """What `norm_bwd_finish_kernel` writes when each kept index is its own statistic and
    weight (outer 1, group_size 1), from the total sums a (of dpre * xhat) and b (of dpre)."""
    w = 1.0
    if HAS_W:
        w = tl.load(W + offs_k, mask=kmask, other=0.0).to(tl.float32)
    tl.store(COEF + offs_k, w * b * inv_count, mask=kmask)
    tl.store(COEF + kept + offs_k, w * a * inv_count, mask=kmask)
    if PARAM_GRADS:
        tl.store(DW + offs_k, a.to(DW.dtype.element_ty), mask=kmask)
        tl.store(DB + offs_k, b.to(DB.dtype.element_ty), mask=kmask)


@triton.jit
def norm_bwd_finish_kernel(
    PART, W, DW, DB, COEF, outer, groups, group_size, slices, inv_count,
    HAS_W: tl.constexpr, PARAM_GRADS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr,
):  # fmt: skip
    """Kept indices of the partial pass are (outer, groups, group_size), row-major; the weight
    is indexed by (group, member) and the statistics by (outer, group):

        batch norm      outer 1, groups C (or C*S per-activation), group_size 1
        instance norm   outer N, groups C, group_size 1
        group norm      outer N, groups G, group_size C/G (the partial pass keeps (N, C))

    Grid: (cdiv(groups, BLOCK_G),). Each step loads a [BLOCK_N, BLOCK_S, BLOCK_C, BLOCK_G]
    block of (outer, slice, member, group) sums, so that many slices (batch norm) or many
    outer indices (group norm) take few steps. Writes DW, DB (sums over outer and slices, in
    that fixed order) and COEF (2, outer, groups) float32: mean_r(w * dpre) and
    mean_r(w * dpre * xhat) per statistic, inv_count being 1 / (values per statistic).
    """
    offs_g = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    offs_c = tl.arange(0, BLOCK_C)
    gmask = offs_g < groups
    mask_cg = (offs_c < group_size)[:, None] & gmask[None, :]
    j = offs_g[None, :] * group_size + offs_c[:, None]  # [BLOCK_C, BLOCK_G]: weight index
    kept = outer * groups * group_size
    w = 1.0
    if HAS_W:
        w = tl.load(W + j, mask=mask_cg, other=0.0).to(tl.float32)[None, :, :]
    dw = tl.zeros((BLOCK_C, BLOCK_G), tl.float32)
    db = tl.zeros((BLOCK_C, BLOCK_G), tl.float32)
    for n0 in range(0, outer, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        nmask = offs_n < outer
        a = tl.zeros((BLOCK_N, BLOCK_C, BLOCK_G), tl.float32)
        b = tl.zeros((BLOCK_N, BLOCK_C, BLOCK_G), tl.float32)
        for s0 in range(0, slices, BLOCK_S):
            offs_s = s0 + tl.arange(0, BLOCK_S)
            row = offs_s[None, :] * kept + offs_n[:, None] * (groups * group_size)
            mask = (nmask[:, None] & (offs_s < slices)[None, :])[:, :, None, None]
            mask = mask & mask_cg[None, None, :, :]
            ptrs = PART + row[:, :, None, None] + j[None, None, :, :]
            a += tl.sum(tl.load(ptrs, mask=mask, other=0.0), axis=1)
            b += tl.sum(tl.load(ptrs + slices * kept, mask=mask, other=0.0), axis=1)
        dw += tl.sum(a, axis=0)
        db += tl.sum(b, axis=0)
        smask = nmask[:, None] & gmask[None, :]
        soff = offs_n[:, None] * groups + offs_g[None, :]
        tl.store(COEF + soff, tl.sum(w * b, axis=1) * inv_count, mask=smask)
        tl.store(COEF + outer * groups + soff, tl.sum(w * a, axis=1) * inv_count, mask=smask)
    if PARAM_GRADS:
        tl.store(DW + j, dw.to(DW.dtype.element_ty), mask=mask_cg)
        tl.store(DB + j, db.to(DB.dtype.element_ty), mask=mask_cg)


@triton.jit
def norm_bwd_apply_kernel(
    DY, X, W, B, Z, MEAN, RSTD, COEF, DX, geo, dyl, xl, pl, zl, sl, dxl, coef_plane, alpha,
    beta, tiles_per_slice,
    TRAINING: tl.constexpr, IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    HAS_Z: tl.constexpr, ACT: tl.constexpr, BETA_NONZERO: tl.constexpr, PMODE: tl.constexpr,
    KD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The elementwise dx pass. Grid: (cdiv(kept, BLOCK_K), slices). COEF is addressed like
    the statistics (`sl`), with its second coefficient `coef_plane` elements further on.
    Program (k, s) writes slice slices - 1 - s, the tiles of its slice in reverse order."""
    # Last slice first: the partial pass has just read the end of x and dy (or written the end
    # of dz), which is still in L2.
    first = (tl.num_programs(1) - 1 - tl.program_id(1)) * tiles_per_slice
    _bwd_apply_pass(
        DY, X, W, B, Z, MEAN, RSTD, COEF, DX, geo, dyl, xl, pl, zl, sl, dxl, coef_plane, alpha,
        beta, tiles_per_slice, tl.program_id(0), first, TRAINING, IS_RMS, HAS_W, HAS_B, HAS_Z,
        ACT, BETA_NONZERO, PMODE, KD, BLOCK_R, BLOCK_K,
    )  # fmt: skip


@triton.jit
def _bwd_apply_pass(
    DY, X, W, B, Z, MEAN, RSTD, COEF, DX, geo, dyl, xl, pl, zl, sl, dxl, coef_plane, alpha,
    beta, tiles_per_slice, kb, first,
    TRAINING: tl.constexpr, IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    HAS_Z: tl.constexpr, ACT: tl.constexpr, BETA_NONZERO: tl.constexpr, PMODE: tl.constexpr,
    KD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The dx pass over kept block kb's tiles from `first` (norm_bwd_apply_kernel). The
    coefficients are read through L2: in a fused launch another program wrote them."""
    ksize, rsize, kept, chunks, tiles = geo
    dyks, dyr = dyl
    xks, xr = xl
    pks, pr = pl
    zks, zr = zl
    sks, sr = sl
    dxks, dxr = dxl
    offs_k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    kmask = offs_k < kept
    dyk = kept_offsets(offs_k, ksize, dyks, KD)
    xk = kept_offsets(offs_k, ksize, xks, KD)
    pk = kept_offsets(offs_k, ksize, pks, KD)
    zk = kept_offsets(offs_k, ksize, zks, KD)
    sk = kept_offsets(offs_k, ksize, sks, KD)
    dxk = kept_offsets(offs_k, ksize, dxks, KD)
    mean = tl.load(MEAN + sk, mask=kmask, other=0.0).to(tl.float32)
    rstd = tl.load(RSTD + sk, mask=kmask, other=0.0).to(tl.float32)
    wpre, bpre = preload_params(W, B, pk, kmask, HAS_W, HAS_B, PMODE)
    c1 = tl.load(COEF + sk, mask=kmask, other=0.0, cache_modifier=".cg")
    c2 = tl.load(COEF + coef_plane + sk, mask=kmask, other=0.0, cache_modifier=".cg")
    # Each slice's tiles last first: what was read last is the likeliest still in L2.
    last = tl.minimum(first + tiles_per_slice, tiles)
    for i in range(first, last):
        t = first + last - 1 - i
        coords = tile_coords(t, rsize, chunks, BLOCK_R)
        mask, rmask = tile_mask(coords, rsize, offs_r, kmask)
        xhat, dp, w = _grad_tile(
            DY, X, W, B, Z, dyr, xr, pr, zr, coords, offs_r, dyk, xk, pk, zk, mask, rmask, mean,
            rstd, wpre, bpre, IS_RMS, HAS_W, HAS_B, HAS_Z, ACT, PMODE,
        )  # fmt: skip
        dx = dp * w
        if TRAINING:
            dx -= xhat * c2[None, :]
            if not IS_RMS:
                dx -= c1[None, :]
        store_tile(
            DX, dxr, coords, offs_r, dxk, mask, dx * rstd[None, :], alpha, beta, BETA_NONZERO
        )


@triton.jit
def norm_bwd_fused_kernel(
    DY, X, W, B, Z, MEAN, RSTD, DZ, PART, DW, DB, COEF, DX, ARRIVALS, geo, dyl, xl, pl, zl, sl,
    dzl, dxl, tiles_per_slice, fan_in, sync_offset, inv_count, alpha, beta,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_Z: tl.constexpr,
    ACT: tl.constexpr, WRITE_DZ: tl.constexpr, PMODE: tl.constexpr, KD: tl.constexpr,
    PARAM_GRADS: tl.constexpr, BETA_NONZERO: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Batch norm's training backward in one cooperative launch (grid as
    norm_bwd_partial_kernel's, every program resident): each program sums its slice and the
    last ones finish the sums (FINISH), every program waits at a grid barrier (ARRIVALS +
    sync_offset: two more counters, zero before and after), then writes dx for the same
    slice, its tiles last first. With WRITE_DZ the dx pass reads dz (written by this program's
    own partial pass) instead of recomputing the activation's derivative."""
    kb = tl.program_id(0)
    s = tl.program_id(1)
    slices = tl.num_programs(1)
    _partial_pass(
        DY, X, W, B, Z, MEAN, RSTD, DZ, PART, DW, DB, COEF, ARRIVALS, geo, dyl, xl, pl, zl, sl,
        dzl, tiles_per_slice, fan_in, inv_count, kb, s, slices, IS_RMS, HAS_W, HAS_B, HAS_Z,
        ACT, WRITE_DZ, PMODE, KD, True, PARAM_GRADS, BLOCK_R, BLOCK_K, BLOCK_S,
    )  # fmt: skip
    grid_sync_once(ARRIVALS + sync_offset, tl.num_programs(0) * slices)
    _, _, kept, _, _ = geo
    if WRITE_DZ:  # dpre = dz, stored above: no activation, no residual
        _bwd_apply_pass(
            DZ, X, W, B, Z, MEAN, RSTD, COEF, DX, geo, dzl, xl, pl, zl, sl, dxl, kept, alpha,
            beta, tiles_per_slice, kb, s * tiles_per_slice, True, IS_RMS, HAS_W, HAS_B, False,
            0, BETA_NONZERO, PMODE, KD, BLOCK_R, BLOCK_K,
        )  # fmt: skip
    else:
        _bwd_apply_pass(
            DY, X, W, B, Z, MEAN, RSTD, COEF, DX, geo, dyl, xl, pl, zl, sl, dxl, kept, alpha,
            beta, tiles_per_slice, kb, s * tiles_per_slice, True, IS_RMS, HAS_W, HAS_B, HAS_Z,
            ACT, BETA_NONZERO, PMODE, KD, BLOCK_R, BLOCK_K,
        )  # fmt: skip
