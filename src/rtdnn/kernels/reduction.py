"""Reductions over any set of dims: add, mul, min, max, amax, avg, norm1, norm2, with indices.

The host (`plan_reduce`) splits x's dims into kept dims (one output element each) and reduced
dims, merges contiguous neighbours, and picks one of each as a vector axis: a program owns a
tile of (innermost kept dim, innermost reduced dim) whose last (fastest) axis is whichever of
the two is contiguous in memory, so that it is read with vector loads: [BLOCK_R, BLOCK_K] when
a kept dim is contiguous (K_FAST, per-channel sums of NHWC data), else [BLOCK_K, BLOCK_R]. The
other kept dims come from the program id and the other reduced dims are a scalar loop. Programs
accumulate in a 2-D register tile (double-buffered: the next tile's load is in flight while
one is combined) and reduce it across lanes once at the end.

When few outputs share a long reduction (a global sum, per-channel sums of NHWC data) each
output's work is split over `splits` programs that write float32 partials; a finish kernel
combines them in a fixed order, so results are deterministic.

Min, max and amax accumulate order keys: the float's bits mapped to an int32 whose order is
the order of preference (NaN first, as in torch.max), and with indices a 64-bit key holding
that above BIG_INDEX - index. Combining is then one integer max, elementwise in the loop and
across lanes at the end, and it picks the first extremum (the lowest index) whatever order the
loop visits elements in. A program with a single tile (rows that fit one tile) takes the int32
key's max and then the lowest index holding it, which is cheaper than 64-bit keys. Indices are
flat positions in the reduced dims, row-major in x's dim order.

Launches are prepared once per plan (`_prepared`, SlotLaunch) and partials live in the
stream's scratch buffer: the host path must stay short next to a kernel of 0.1 ms.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..core import cdiv
from ..core.handle import stream_scratch
from .launch import SlotLaunch
from .layout import merge_dims, next_pow2

# Op codes: module constants read in @triton.jit code must be tl.constexpr.
ADD = tl.constexpr(0)
MUL = tl.constexpr(1)
MIN = tl.constexpr(2)
MAX = tl.constexpr(3)
AMAX = tl.constexpr(4)
AVG = tl.constexpr(5)
NORM1 = tl.constexpr(6)
NORM2 = tl.constexpr(7)
OPS = {"add": 0, "mul": 1, "min": 2, "max": 3, "amax": 4, "avg": 5, "norm1": 6, "norm2": 7}
INDEXED = ("min", "max", "amax")
BIG_INDEX = tl.constexpr(2**31 - 1)
MAX_INT32 = tl.constexpr(2**31 - 1)


class ReduceGeometry(NamedTuple):
    kept: tuple  # sizes (k0, k1, k2, k_inner)
    red: tuple  # sizes (r0, r1, r2, r_inner)
    x_kept: tuple  # x strides along kept dims
    x_red: tuple  # x strides along reduced dims
    out_kept: tuple  # out strides along kept dims
    idx_red: tuple  # row-major logical index strides along reduced dims
    k_tiles: int
    r_chunks: int  # chunks of BLOCK_R over r_inner
    work_per_split: int  # (outer reduced position, chunk) pairs per split
    count: int  # number of reduced elements


@triton.jit
def _identity(OP: tl.constexpr):
    if OP == MUL:
        return 1.0
    elif OP == MIN:
        return float("inf")
    elif OP == MAX:
        return float("-inf")
    else:
        return 0.0


@triton.jit
def _prep(v, OP: tl.constexpr):
    if OP == NORM1 or OP == AMAX:
        v = tl.abs(v)
    elif OP == NORM2:
        v = v * v
    return v


@triton.jit
def _order_key(v, LOWER: tl.constexpr):
    """An int32 whose signed order is the order of preference: the larger value wins (the
    smaller if LOWER), NaN beats every number. Negative floats' bit patterns count down, so
    their low 31 bits are flipped; -0.0 is first made +0.0 (they tie, as in torch)."""
    bits = (v + 0.0).to(tl.int32, bitcast=True)
    k = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    if LOWER:
        k = ~k
    return tl.where(v != v, MAX_INT32, k)


@triton.jit
def _key_value(k, LOWER: tl.constexpr):
    """The float32 value of an order key (NaN for NaN's key)."""
    if LOWER:
        k = ~k
    return tl.where(k >= 0, k, k ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _as_acc(v, i, OP: tl.constexpr, WITH_INDEX: tl.constexpr):
    """Values (prepared for OP) in accumulator form. Min, max and amax accumulate order keys,
    so that combining is one integer max: with WITH_INDEX the key is 64-bit, the value's key
    above BIG_INDEX - index (= index ^ BIG_INDEX: 31 bits), so that ties go to the lower
    index and one max carries both."""
    if OP == MIN or OP == MAX or OP == AMAX:
        k = _order_key(v, OP == MIN)
        if WITH_INDEX:
            k = (k.to(tl.int64) << 32) | (i ^ BIG_INDEX).to(tl.int64)
        return k
    else:
        return v


@triton.jit
def _accumulate(acc, a, OP: tl.constexpr):
    if OP == MUL:
        return acc * a
    elif OP == MIN or OP == MAX or OP == AMAX:
        return tl.maximum(acc, a)
    else:
        return acc + a


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def _combine_lanes(acc, OP: tl.constexpr, AXIS: tl.constexpr):
    """Reduce the 2-D accumulator along AXIS (the reduced axis of the tile)."""
    if OP == MUL:
        return tl.reduce(acc, AXIS, _mul)
    elif OP == MIN or OP == MAX or OP == AMAX:
        return tl.max(acc, AXIS)
    else:
        return tl.sum(acc, AXIS)


@triton.jit
def _result(acc, OP: tl.constexpr, WITH_INDEX: tl.constexpr):
    """Accumulator -> (float32 value, int32 index; BIG_INDEX without an index)."""
    none = tl.full(acc.shape, BIG_INDEX, tl.int32)
    if OP == MIN or OP == MAX or OP == AMAX:
        if WITH_INDEX:
            idx = (acc & BIG_INDEX).to(tl.int32) ^ BIG_INDEX
            value = _key_value((acc >> 32).to(tl.int32), OP == MIN)
        else:
            idx = none
            value = _key_value(acc, OP == MIN)
    else:
        idx = none
        value = acc
    return value, idx


@triton.jit
def _tile(k, r, K_FAST: tl.constexpr):
    """The kept and reduced offsets (1-D) broadcast to the tile: [BLOCK_R, BLOCK_K] if K_FAST,
    else [BLOCK_K, BLOCK_R] (the contiguous axis last)."""
    if K_FAST:
        return k[None, :], r[:, None]
    else:
        return k[:, None], r[None, :]


@triton.jit
def _finish(v, count, OP: tl.constexpr):
    if OP == AVG:
        v = v / count
    elif OP == NORM2:
        v = tl.sqrt_rn(v)
    return v


@triton.jit
def _work_tile(
    X, x_base, w, valid, r_chunks, r1s, r2s, rin, xr0, xr1, xr2, xr3, ir0, ir1, ir2, ir3, x_k,
    k_in, tile_r, OP: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Work item w (an outer reduced position and a chunk of the inner reduced dim): its
    values (prepared for OP, the identity where masked or not `valid`) and their indices
    (BIG_INDEX there)."""
    chunk = w % r_chunks
    ro = w // r_chunks
    r2 = ro % r2s
    ro = ro // r2s
    r1 = ro % r1s
    r0 = ro // r1s
    offs_r = chunk * BLOCK_R + tile_r
    mask = k_in & (offs_r < rin) & valid
    ptrs = X + x_base + r0 * xr0 + r1 * xr1 + r2 * xr2 + x_k + offs_r * xr3
    v = _prep(tl.load(ptrs, mask=mask, other=_identity(OP)).to(tl.float32), OP)
    i = tl.where(mask, r0 * ir0 + r1 * ir1 + r2 * ir2 + offs_r * ir3, BIG_INDEX)
    return v, i


@triton.jit
def _first_extremum(v, i, LOWER: tl.constexpr, AXIS: tl.constexpr):
    """The extremum of one tile along AXIS and the lowest index holding it: an int32 key max,
    then an index min. With one tile per program this is cheaper than the 64-bit keys a loop
    needs (max with indices over rows of 4096: measured)."""
    key = _order_key(v, LOWER)
    best = tl.max(key, AXIS)
    idx = tl.min(tl.where(key == tl.expand_dims(best, AXIS), i, BIG_INDEX), AXIS)
    return _key_value(best, LOWER), idx


@triton.jit
def _loop(
    X, x_base, v, i, w_start, w_end, r_chunks, r1s, r2s, rin, xr0, xr1, xr2, xr3, ir0, ir1,
    ir2, ir3, x_k, k_in, tile_r, OP: tl.constexpr, WITH_INDEX: tl.constexpr,
    ONE_STEP: tl.constexpr, K_FAST: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """Accumulate work items w_start .. w_end (the first one's values given), then reduce
    across lanes: (float32 value, int32 index) per kept element. The first item is the
    accumulator itself (combining with the identity is a copy); then double buffering: item
    w + 1 is requested before item w is combined, so that a program always has a load in
    flight."""
    acc = _as_acc(v, i, OP, WITH_INDEX)
    if not ONE_STEP:
        v, i = _work_tile(
            X, x_base, w_start + 1, w_start + 1 < w_end, r_chunks, r1s, r2s, rin, xr0, xr1,
            xr2, xr3, ir0, ir1, ir2, ir3, x_k, k_in, tile_r, OP, BLOCK_R,
        )  # fmt: skip
        for w in range(w_start + 1, w_end):
            v_next, i_next = _work_tile(
                X, x_base, w + 1, w + 1 < w_end, r_chunks, r1s, r2s, rin, xr0, xr1, xr2, xr3,
                ir0, ir1, ir2, ir3, x_k, k_in, tile_r, OP, BLOCK_R,
            )  # fmt: skip
            acc = _accumulate(acc, _as_acc(v, i, OP, WITH_INDEX), OP)
            v, i = v_next, i_next
    return _result(_combine_lanes(acc, OP, 0 if K_FAST else 1), OP, WITH_INDEX)


@triton.jit
def reduce_kernel(
    X, OUT, IDX, PART_V, PART_I, geo, alpha, beta,
    OP: tl.constexpr, SPLIT: tl.constexpr, WITH_INDEX: tl.constexpr,
    BETA_NONZERO: tl.constexpr, K_FAST: tl.constexpr, ONE_STEP: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """WITH_INDEX: track indices and write IDX (or, split, index partials in PART_I).
    ONE_STEP: every program has exactly one work item (no loop)."""
    # Unpack tuples before any loop: Triton 3.6 loses tuple elements specialized to 1 after a
    # runtime loop ("'NoneType' object has no attribute 'type'").
    k0s, k1s, k2s, kin = geo.kept
    r0s, r1s, r2s, rin = geo.red
    ok0, ok1, ok2, ok3 = geo.out_kept
    count = geo.count
    pid = tl.program_id(0)
    split = tl.program_id(1)
    kt = pid % geo.k_tiles
    rest = pid // geo.k_tiles
    k2 = rest % k2s
    rest = rest // k2s
    k1 = rest % k1s
    k0 = rest // k1s
    xk = geo.x_kept
    x_base = k0 * xk[0] + k1 * xk[1] + k2 * xk[2]
    offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = offs_k < kin
    lanes = tl.arange(0, BLOCK_R)
    tile_k, tile_r = _tile(offs_k, lanes, K_FAST)
    x_k = tile_k * xk[3]
    k_in = tile_k < kin
    xr0, xr1, xr2, xr3 = geo.x_red
    ir0, ir1, ir2, ir3 = geo.idx_red
    r_chunks = geo.r_chunks
    w_start = split * geo.work_per_split
    w_end = tl.minimum(w_start + geo.work_per_split, r0s * r1s * r2s * r_chunks)
    v, i = _work_tile(
        X, x_base, w_start, True, r_chunks, r1s, r2s, rin, xr0, xr1, xr2, xr3, ir0, ir1, ir2,
        ir3, x_k, k_in, tile_r, OP, BLOCK_R,
    )  # fmt: skip
    if ONE_STEP and WITH_INDEX and (OP == MIN or OP == MAX or OP == AMAX):
        val, idx = _first_extremum(v, i, OP == MIN, 0 if K_FAST else 1)
    else:
        val, idx = _loop(
            X, x_base, v, i, w_start, w_end, r_chunks, r1s, r2s, rin, xr0, xr1, xr2, xr3, ir0,
            ir1, ir2, ir3, x_k, k_in, tile_r, OP, WITH_INDEX, ONE_STEP, K_FAST, BLOCK_R,
        )  # fmt: skip
    if SPLIT:
        kflat = ((k0 * k1s + k1) * k2s + k2) * kin + offs_k
        n_kept = k0s * k1s * k2s * kin
        tl.store(PART_V + split * n_kept + kflat, val, mask=k_ok)
        if WITH_INDEX:
            tl.store(PART_I + split * n_kept + kflat, idx, mask=k_ok)
    else:
        o_offs = k0 * ok0 + k1 * ok1 + k2 * ok2 + offs_k * ok3
        res = alpha * _finish(val, count, OP)
        if BETA_NONZERO:
            res += beta * tl.load(OUT + o_offs, mask=k_ok).to(tl.float32)
        tl.store(OUT + o_offs, res.to(OUT.dtype.element_ty), mask=k_ok)
        if WITH_INDEX:
            tl.store(IDX + o_offs, idx.to(tl.int64), mask=k_ok)


@triton.jit
def _partials(PART_V, PART_I, s0, splits, n_kept, kflat, in_range, OP: tl.constexpr,
              WITH_INDEX: tl.constexpr, BLOCK_S: tl.constexpr):  # fmt: skip
    """Splits s0 .. s0 + BLOCK_S of each kept element, combined (a fixed tree)."""
    offs_s = s0 + tl.arange(0, BLOCK_S)
    mask = (offs_s < splits)[:, None] & in_range[None, :]
    ptrs = offs_s[:, None] * n_kept + kflat[None, :]
    v = tl.load(PART_V + ptrs, mask=mask, other=_identity(OP))
    i = tl.full(v.shape, BIG_INDEX, tl.int32)
    if WITH_INDEX:
        i = tl.load(PART_I + ptrs, mask=mask, other=BIG_INDEX)
    return _combine_lanes(_as_acc(v, i, OP, WITH_INDEX), OP, 0)


@triton.jit
def reduce_finish_kernel(
    OUT, IDX, PART_V, PART_I, geo, splits, alpha, beta,
    OP: tl.constexpr, WITH_INDEX: tl.constexpr, BETA_NONZERO: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Combine the partials of BLOCK kept elements: BLOCK_S splits at a time in a fixed tree,
    the blocks of splits in order (deterministic). With WITH_INDEX, min/max partials come
    with their indices in PART_I, so that ties between splits go to the lower index."""
    k0s, k1s, k2s, kin = geo.kept
    ok0, ok1, ok2, ok3 = geo.out_kept  # before the loop (see reduce_kernel)
    count = geo.count
    n_kept = k0s * k1s * k2s * kin
    kflat = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = kflat < n_kept
    kk = kflat % kin
    rest = kflat // kin
    k2 = rest % k2s
    rest = rest // k2s
    k1 = rest % k1s
    k0 = rest // k1s
    acc = _partials(PART_V, PART_I, 0, splits, n_kept, kflat, in_range, OP, WITH_INDEX, BLOCK_S)
    for s0 in range(BLOCK_S, splits, BLOCK_S):
        part = _partials(
            PART_V, PART_I, s0, splits, n_kept, kflat, in_range, OP, WITH_INDEX, BLOCK_S
        )
        acc = _accumulate(acc, part, OP)
    val, idx = _result(acc, OP, WITH_INDEX)
    o_offs = k0 * ok0 + k1 * ok1 + k2 * ok2 + kk * ok3
    res = alpha * _finish(val, count, OP)
    if BETA_NONZERO:
        res += beta * tl.load(OUT + o_offs, mask=in_range).to(tl.float32)
    tl.store(OUT + o_offs, res.to(OUT.dtype.element_ty), mask=in_range)
    if WITH_INDEX:
        tl.store(IDX + o_offs, idx.to(tl.int64), mask=in_range)


# -- planning (host side) --------------------------------------------------------------------


class ReducePlan(NamedTuple):
    geo: ReduceGeometry
    grid: tuple
    splits: int
    block_k: int
    block_r: int
    k_fast: bool  # the tile is [block_r, block_k]: a kept dim is the contiguous one
    num_warps: int


def _pad4(sizes, lists):
    pad = 4 - len(sizes)
    return (1,) * pad + tuple(sizes), [(0,) * pad + tuple(m) for m in lists]


@functools.lru_cache(maxsize=4096)
def plan_reduce(
    shape, x_strides, out_strides, reduced, *, slots: int, elem_bytes: int
) -> ReducePlan | None:
    """None if more than 4 kept or 4 reduced dims remain after merging."""
    nd = len(shape)
    red_logical = [d for d in range(nd) if d in reduced]
    # Row-major index over the reduced dims, in x's dim order.
    idx = [0] * nd
    step = 1
    for d in reversed(red_logical):
        idx[d] = step
        step *= shape[d]
    count = step
    kept = [d for d in range(nd) if d not in reduced]
    # Both groups outermost-first by x's strides: the innermost of each is the most
    # contiguous, and becomes its vector axis.
    kept.sort(key=lambda d: (-abs(x_strides[d]), d))
    red_sorted = sorted(red_logical, key=lambda d: (-abs(x_strides[d]), d))
    k_sizes, (xk, ok) = merge_dims(kept, shape, [x_strides, out_strides])
    r_sizes, (xr, ir) = merge_dims(red_sorted, shape, [x_strides, idx])
    if len(k_sizes) > 4 or len(r_sizes) > 4:
        return None
    k_sizes, (xk, ok) = _pad4(k_sizes, [xk, ok])
    r_sizes, (xr, ir) = _pad4(r_sizes, [xr, ir])
    kin, rin = k_sizes[3], r_sizes[3]
    tile = 8 * 32 * max(1, 32 // elem_bytes)  # elements per program per step
    k_fast = xk[3] == 1 and xr[3] != 1
    per_thread = 8  # elements per thread per step (at least: warps are at most 8)
    if k_fast and next_pow2(rin) <= 64:
        # A short reduction (global pooling of NHWC data): the whole of it in one step, as
        # many small programs, each thread with 64 loads in flight.
        block_r = next_pow2(rin)
        block_k = min(next_pow2(kin), 64)
        per_thread = 64
    elif k_fast:  # kept dim contiguous: long along K
        block_k = min(next_pow2(kin), 256)
        block_r = min(next_pow2(rin), max(1, tile // block_k))
    else:  # reduced dim contiguous, or neither
        block_r = min(next_pow2(rin), tile)
        block_k = min(next_pow2(kin), max(1, tile // block_r))
    k_tiles = cdiv(kin, block_k)
    r_chunks = cdiv(rin, block_r)
    work = r_sizes[0] * r_sizes[1] * r_sizes[2] * r_chunks
    kept_programs = k_tiles * k_sizes[0] * k_sizes[1] * k_sizes[2]
    splits = 1
    if kept_programs < slots and work > 1:
        splits = min(work, cdiv(slots, kept_programs))
    per_split = cdiv(work, splits)
    splits = cdiv(work, per_split)
    geo = ReduceGeometry(k_sizes, r_sizes, xk, xr, ok, ir, k_tiles, r_chunks, per_split, count)
    warps = max(1, min(8, block_k * block_r // (32 * per_thread)))
    return ReducePlan(geo, (kept_programs, splits), splits, block_k, block_r, k_fast, warps)


@functools.lru_cache(maxsize=4096)
def _prepared(
    plan: ReducePlan, op: str, with_index: bool, beta_nonzero: bool
) -> tuple[SlotLaunch, SlotLaunch | None]:
    """The main launch and (split plans) the finish launch of one problem: the host path of a
    memory-bound op must stay short next to a kernel of tens of microseconds."""
    geo, code = plan.geo, OPS[op]
    flags = dict(OP=code, WITH_INDEX=with_index, BETA_NONZERO=beta_nonzero)
    main = SlotLaunch(
        reduce_kernel, plan.grid, dict(num_warps=plan.num_warps),
        ("X", "OUT", "IDX", "PART_V", "PART_I", "alpha", "beta"), geo=geo,
        SPLIT=plan.splits > 1, K_FAST=plan.k_fast, ONE_STEP=geo.work_per_split == 1,
        BLOCK_K=plan.block_k, BLOCK_R=plan.block_r, **flags,
    )  # fmt: skip
    if plan.splits == 1:
        return main, None
    # All splits of a few kept elements per program, in one load where they fit: a serial
    # walk over hundreds of splits took a quarter of the main kernel's time.
    n_kept = geo.kept[0] * geo.kept[1] * geo.kept[2] * geo.kept[3]
    block_s = min(next_pow2(plan.splits), 1024)
    block = max(1, min(next_pow2(n_kept), 4096 // block_s))
    finish = SlotLaunch(
        reduce_finish_kernel, (cdiv(n_kept, block),), dict(num_warps=4),
        ("OUT", "IDX", "PART_V", "PART_I", "alpha", "beta"), geo=geo, splits=plan.splits,
        BLOCK_S=block_s, BLOCK=block, **flags,
    )  # fmt: skip
    return main, finish


def reduce_launch(plan: ReducePlan, op: str, with_index: bool, beta_nonzero: bool):
    """The launches of a reduction with this plan, as run(x, out, idx, alpha, beta): idx an
    int64 tensor with out's shape and strides when with_index, else None. Split partials
    live in the stream's scratch buffers."""
    main, finish = _prepared(plan, op, with_index, beta_nonzero)
    geo = plan.geo
    partials = plan.splits * geo.kept[0] * geo.kept[1] * geo.kept[2] * geo.kept[3]

    def run(x, out, idx, alpha: float, beta: float) -> None:
        part_v = part_i = out
        if finish is not None:
            part_v = part_i = stream_scratch(x.device, "reduce_part", partials)
            if with_index:
                part_i = stream_scratch(x.device, "reduce_index", partials, torch.int32)
        idx_arg = idx if with_index else out
        alpha, beta = float(alpha), float(beta)
        main(x, out, idx_arg, part_v, part_i, alpha, beta)
        if finish is not None:
            finish(out, idx_arg, part_v, part_i, alpha, beta)

    return run
