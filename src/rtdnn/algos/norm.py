"""Normalization engine: logical views -> merged geometry, tile choice, prepared launches.

The ops layer describes every normalization the same way (kernels/norm_addressing.py): a set of
tensors of one logical shape (broadcast operands as expanded views with zero strides) and the
list of kept dims. This module merges dims, picks the row or the split path and the tiles,
and runs the kernels. Launches are prepared once per problem (shapes, strides, dtypes, flags)
and reused, since every training step repeats the same problems and Triton's per-call binding
costs more than a small normalization.

No validation here: the ops layer has done it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from ..core import NotSupportedError
from ..kernels.launch import KernelLaunch
from ..kernels.norm_addressing import ACTIVATIONS, Layout, NormGeometry
from ..kernels.norm_backward import (
    norm_bwd_apply_kernel,
    norm_bwd_finish_kernel,
    norm_bwd_partial_kernel,
    norm_row_backward_kernel,
    param_grad_finish_kernel,
)
from ..kernels.norm_forward import (
    norm_apply_kernel,
    norm_row_forward_kernel,
    norm_stats_finish_kernel,
    norm_stats_partial_kernel,
)
from .geometry import parallel_slots

MAX_DIMS = 4  # kept and reduced dims each, after merging
INT32_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class TilePolicy:
    """Launch choices. The CPU policy uses tiny tiles so that the interpreter exercises every
    path (several tiles per statistic, several slices) on tiny tensors."""

    row_elements: int  # largest row tile kept in registers (BLOCK_R * BLOCK_K)
    row_pack: int  # short rows are packed into tiles of about this many elements
    split_elements: int  # elements of one split-path tile
    max_block_r: int  # cap on BLOCK_R
    programs_per_slot: int  # split grids aim at this many programs per parallel slot
    row_programs_per_slot: int  # programs of the persistent row backward, per slot
    max_slices: int  # cap on reduced slices per kept block (split path)
    force_path: str | None = None  # "row" or "split" for tests; None decides by the problem


# Split grids are oversubscribed (8 programs per slot, about 16 per SM) so that the last wave
# is a small fraction of the work whatever the occupancy. The persistent row backward keeps
# one partial dweight row per program, so it runs about 4 programs per SM: a multiple of the
# SM count, and few enough partial rows to be a few percent of the traffic.
GPU_POLICY = TilePolicy(
    row_elements=16384, row_pack=4096, split_elements=4096, max_block_r=16384,
    programs_per_slot=8, row_programs_per_slot=2, max_slices=2048,
)  # fmt: skip
CPU_POLICY = TilePolicy(
    row_elements=64, row_pack=32, split_elements=32, max_block_r=16, programs_per_slot=1,
    row_programs_per_slot=1, max_slices=3,
)  # fmt: skip


def policy(device: torch.device) -> TilePolicy:
    return GPU_POLICY if device.type == "cuda" else CPU_POLICY


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))


# -- geometry ---------------------------------------------------------------------------------


def _merge(dims, shape, strides: list[tuple[int, ...]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours (outer a, inner b) where every tensor has
    stride[a] == stride[b] * size[b]. Returns sizes and, per tensor, strides."""
    sizes: list[int] = []
    merged: list[list[int]] = [[] for _ in strides]
    for d in dims:
        n = shape[d]
        if n == 1:
            continue
        cur = [s[d] for s in strides]
        if sizes and all(m[-1] == c * n for m, c in zip(merged, cur, strict=True)):
            sizes[-1] *= n
            for m, c in zip(merged, cur, strict=True):
                m[-1] = c
        else:
            sizes.append(n)
            for m, c in zip(merged, cur, strict=True):
                m.append(c)
    return sizes, merged


def _pad(values: list[int], fill: int) -> tuple[int, ...]:
    return (fill,) * (MAX_DIMS - len(values)) + tuple(values)


def contiguous_strides(shape, dims) -> tuple[int, ...]:
    """Strides over all of `shape`'s dims of a contiguous tensor over `dims` only (0 elsewhere):
    how a weight of shape [shape[d] for d in dims] is addressed when broadcast to `shape`."""
    strides = [0] * len(shape)
    step = 1
    for d in reversed(tuple(dims)):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


@dataclass(frozen=True)
class Geometry:
    geo_sizes: tuple  # (ksize, rsize, kept)
    layouts: tuple  # one Layout per tensor, in the order given
    kd: int  # kept dims actually used (1 to 4)

    @property
    def ksize(self):
        return self.geo_sizes[0]

    @property
    def rsize(self):
        return self.geo_sizes[1]

    @property
    def kept(self) -> int:
        return self.geo_sizes[2]

    @property
    def count(self) -> int:
        return math.prod(self.rsize)

    def for_tiles(self, block_r: int) -> NormGeometry:
        chunks = triton.cdiv(self.rsize[3], block_r)
        return NormGeometry(
            self.ksize, self.rsize, self.kept, chunks, chunks * math.prod(self.rsize[:3])
        )


def geometry(shape, kept_dims, strides: list[tuple[int, ...]]) -> Geometry:
    """Merge the dims of a normalization problem. `strides[0]` (x) decides the order of the
    reduced dims (largest stride first, so the vector dim of a tile is x's most contiguous);
    kept dims keep their logical order, so the flat kept index is row-major over them."""
    nd = len(shape)
    for s in strides:
        span = sum((n - 1) * abs(st) for n, st in zip(shape, s, strict=True))
        if span > INT32_LIMIT:
            raise NotSupportedError(
                f"a tensor spans {span + 1} elements: offsets above 2**31 - 1 are not supported"
            )
    kept_dims = tuple(kept_dims)
    reduced = sorted(
        (d for d in range(nd) if d not in kept_dims), key=lambda d: -abs(strides[0][d])
    )
    ksizes, kstrides = _merge(kept_dims, shape, strides)
    rsizes, rstrides = _merge(reduced, shape, strides)
    if len(ksizes) > MAX_DIMS or len(rsizes) > MAX_DIMS:
        raise NotSupportedError(
            f"shape {tuple(shape)} with these strides needs {len(ksizes)} kept and "
            f"{len(rsizes)} reduced dims after merging; at most {MAX_DIMS} each are supported "
            "(make the input contiguous)"
        )
    layouts = tuple(Layout(_pad(k, 0), _pad(r, 0)) for k, r in zip(kstrides, rstrides, strict=True))
    ksize, rsize = _pad(ksizes, 1), _pad(rsizes, 1)
    return Geometry((ksize, rsize, math.prod(ksize)), layouts, max(1, len(ksizes)))


# -- tiles --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tiles:
    block_r: int
    block_k: int
    num_warps: int


def _kept_contiguous(g: Geometry) -> bool:
    """x's innermost kept dim has unit stride (batch norm on channels-last data)."""
    return g.ksize[3] > 1 and g.layouts[0].k[3] == 1


def _lane_block(g: Geometry, itemsize: int) -> int:
    # Kept indices side by side are contiguous: take whole 128-byte lines of them.
    return min(_pow2(g.kept), max(8, 128 // itemsize))


def split_tiles(g: Geometry, itemsize: int, pol: TilePolicy) -> Tiles:
    if _kept_contiguous(g):
        block_k = _lane_block(g, itemsize)
        block_r = min(_pow2(g.rsize[3]), max(1, pol.split_elements // block_k), pol.max_block_r)
    else:
        block_r = min(_pow2(g.rsize[3]), pol.split_elements, pol.max_block_r)
        block_k = min(_pow2(g.kept), max(1, pol.split_elements // block_r))
    return Tiles(block_r, block_k, _warps(block_r * block_k, 512))


def row_tiles(g: Geometry, itemsize: int, pol: TilePolicy) -> Tiles:
    if _kept_contiguous(g):
        block_k = _lane_block(g, itemsize)
        block_r = min(_pow2(g.rsize[3]), max(1, pol.row_elements // block_k), pol.max_block_r)
    else:
        block_r = min(_pow2(g.rsize[3]), pol.row_elements, pol.max_block_r)
        block_k = min(_pow2(g.kept), max(1, pol.row_pack // block_r))
    return Tiles(block_r, block_k, _warps(block_r * block_k, 512))


def _warps(elements: int, per_warp: int) -> int:
    return max(1, min(16, _pow2(elements // per_warp)))


def _single(g: Geometry, t: Tiles) -> bool:
    return math.prod(g.rsize[:3]) == 1 and g.rsize[3] <= t.block_r


def _slices(tiles: int, kept_blocks: int, device: torch.device, pol: TilePolicy) -> tuple[int, int]:
    """(slices, tiles per slice): enough programs to fill the device, no empty slice."""
    target = pol.programs_per_slot * parallel_slots(device.type)
    slices = max(1, min(tiles, pol.max_slices, triton.cdiv(target, kept_blocks)))
    per_slice = triton.cdiv(tiles, slices)
    return triton.cdiv(tiles, per_slice), per_slice


def use_row_path(g: Geometry, itemsize: int, device: torch.device, pol: TilePolicy) -> bool:
    """One program per kept block, when that is one pass over x (the tile holds the whole
    reduced extent) or when there are enough kept blocks to fill the device."""
    if pol.force_path is not None:
        return pol.force_path == "row"
    t = row_tiles(g, itemsize, pol)
    return _single(g, t) or triton.cdiv(g.kept, t.block_k) >= parallel_slots(device.type)


# -- prepared launches --------------------------------------------------------------------------

_plans: dict[tuple, object] = {}


def clear_plans() -> None:
    """Forget prepared launches (tests that change the tile policy call this)."""
    _plans.clear()


def _key(kind: str, *tensors, **flags) -> tuple:
    parts = [kind]
    for t in tensors:
        parts.append(None if t is None else (t.shape, t.stride(), t.dtype, t.device))
    parts.extend(sorted(flags.items()))
    return tuple(parts)


def _layout_of(g: Geometry, index: int | None) -> Layout:
    return g.layouts[index] if index is not None else Layout((0,) * MAX_DIMS, (0,) * MAX_DIMS)


def _strides(views: list[torch.Tensor | None], fallback: tuple[int, ...]) -> list[tuple]:
    return [v.stride() if v is not None else fallback for v in views]


def _act(activation: str) -> int:
    return ACTIVATIONS.index(activation)


def _pmode(pl: Layout) -> int:
    """What weight and bias depend on (kernels/norm_addressing.tile_params): 1 the kept dims
    only (or no parameters), 2 the reduced dims only, 0 both."""
    if not any(pl.r):
        return 1
    return 2 if not any(pl.k) else 0


# -- forward ------------------------------------------------------------------------------------


@dataclass
class _ForwardPlan:
    row: KernelLaunch | None = None
    partial: KernelLaunch | None = None
    finish: KernelLaunch | None = None
    apply: KernelLaunch | None = None
    part_shape: tuple = ()


def forward_train(
    x: torch.Tensor,
    y: torch.Tensor,
    kept: tuple[int, ...],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    *,
    w: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    rms: bool = False,
    activation: str = "identity",
    eps: float = 1e-5,
    alpha: float = 1.0,
    beta: float = 0.0,
    running: tuple[torch.Tensor, torch.Tensor] | None = None,
    momentum: float = 0.0,
) -> None:
    """Statistics of x over its non-kept dims, written to `mean` and `rstd` (float32,
    contiguous over the kept dims), and y = alpha * act(xhat * w + b + z) + beta * y.

    x, y, z, w, b share one logical shape (w, b broadcast). With `running` (batch norm, split
    path only) the running mean and variance (contiguous, indexed like `mean`) are updated.
    """
    pol = policy(x.device)
    key = _key(
        "fwd", x, y, z, w, b, kept=tuple(kept), rms=rms, act=activation, beta0=beta != 0,
        running=running is not None and tuple(r.dtype for r in running), pol=pol,
    )  # fmt: skip
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _forward_plan(x, y, z, w, b, kept, rms, activation, beta, running, pol)
    inv = {"eps": float(eps), "alpha": float(alpha), "beta": float(beta)}
    tensors = dict(X=x, Y=y, Z=_or(z, x), W=_or(w, x), B=_or(b, x), MEAN=mean, RSTD=rstd)
    if plan.row is not None:
        plan.row(**tensors, **inv)
        return
    part = torch.empty(plan.part_shape, dtype=torch.float32, device=x.device)
    plan.partial(X=x, PART=part)
    rm, rv = running if running is not None else (mean, rstd)
    plan.finish(
        PART=part, MEAN=mean, RSTD=rstd, RUN_MEAN=rm, RUN_VAR=rv, eps=float(eps),
        momentum=float(momentum),
    )  # fmt: skip
    # The finish pass left the mean relative to the shift in part[1, 0] (the shift: part[3, 0]).
    plan.apply(**{**tensors, "MEAN": part[1, 0]}, SHIFT=part[3, 0], **inv)


def _or(t: torch.Tensor | None, default: torch.Tensor) -> torch.Tensor:
    return t if t is not None else default


def _forward_plan(x, y, z, w, b, kept, rms, activation, beta, running, pol) -> _ForwardPlan:
    views = [x, y, z, w if w is not None else b]
    g = geometry(x.shape, kept, _strides(views, x.stride()))
    xl, yl, zl, pl = (_layout_of(g, i) for i in range(4))
    flags = dict(
        IS_RMS=rms, HAS_W=w is not None, HAS_B=b is not None, HAS_Z=z is not None,
        ACT=_act(activation), BETA_NONZERO=beta != 0, PMODE=_pmode(pl), KD=g.kd,
    )  # fmt: skip
    itemsize = x.element_size()
    if running is None and use_row_path(g, itemsize, x.device, pol):
        t = row_tiles(g, itemsize, pol)
        geo = g.for_tiles(t.block_r)
        row = KernelLaunch(
            norm_row_forward_kernel, (triton.cdiv(g.kept, t.block_k),),
            dict(num_warps=t.num_warps), geo=geo, xl=xl, yl=yl, zl=zl, pl=pl,
            inv_count=1.0 / g.count, SINGLE=_single(g, t), BLOCK_R=t.block_r,
            BLOCK_K=t.block_k, **flags,
        )  # fmt: skip
        return _ForwardPlan(row=row)
    t = split_tiles(g, itemsize, pol)
    geo = g.for_tiles(t.block_r)
    kept_blocks = triton.cdiv(g.kept, t.block_k)
    slices, per_slice = _slices(geo.tiles, kept_blocks, x.device, pol)
    grid = (kept_blocks, slices)
    opts = dict(num_warps=t.num_warps)
    partial = KernelLaunch(
        norm_stats_partial_kernel, grid, opts, geo=geo, xl=xl, tiles_per_slice=per_slice,
        IS_RMS=rms, KD=g.kd, BLOCK_R=t.block_r, BLOCK_K=t.block_k,
    )  # fmt: skip
    fb = min(128, _pow2(g.kept))
    finish = KernelLaunch(
        norm_stats_finish_kernel, (triton.cdiv(g.kept, fb),), dict(num_warps=4),
        kept=g.kept, slices=slices, IS_RMS=rms, UPDATE_RUNNING=running is not None, BLOCK_K=fb,
    )  # fmt: skip
    # The statistics were just written contiguously, indexed by the flat kept index.
    sl = Layout(contiguous_strides(g.ksize, range(MAX_DIMS)), (0,) * MAX_DIMS)
    apply = KernelLaunch(
        norm_apply_kernel, grid, opts, geo=geo, xl=xl, yl=yl, zl=zl, pl=pl, sl=sl,
        tiles_per_slice=per_slice, SHIFTED=True, STATS_ARE_VAR=False, BLOCK_R=t.block_r,
        BLOCK_K=t.block_k,
        **flags,
    )  # fmt: skip
    return _ForwardPlan(partial=partial, finish=finish, apply=apply, part_shape=(4, slices, g.kept))


def forward_apply(
    x: torch.Tensor,
    y: torch.Tensor,
    kept: tuple[int, ...],
    mean: torch.Tensor,
    stat: torch.Tensor,
    *,
    stat_is_var: bool,
    w: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    rms: bool = False,
    activation: str = "identity",
    eps: float = 1e-5,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> None:
    """y = alpha * act(xhat * w + b + z) + beta * y with given statistics: `mean` and `stat`
    (a variance if stat_is_var, else 1/std) are views broadcast to x's shape."""
    pol = policy(x.device)
    key = _key(
        "apply", x, y, z, w, b, mean, stat, kept=tuple(kept), var=stat_is_var, rms=rms,
        act=activation, beta0=beta != 0, pol=pol,
    )  # fmt: skip
    plan = _plans.get(key)
    if plan is None:
        views = [x, y, z, w if w is not None else b, mean]
        g = geometry(x.shape, kept, _strides(views, x.stride()))
        t = split_tiles(g, x.element_size(), pol)
        geo = g.for_tiles(t.block_r)
        kept_blocks = triton.cdiv(g.kept, t.block_k)
        slices, per_slice = _slices(geo.tiles, kept_blocks, x.device, pol)
        xl, yl, zl, pl, sl = (_layout_of(g, i) for i in range(5))
        plan = _plans[key] = KernelLaunch(
            norm_apply_kernel, (kept_blocks, slices), dict(num_warps=t.num_warps), geo=geo,
            xl=xl, yl=yl, zl=zl, pl=pl, sl=sl, tiles_per_slice=per_slice, SHIFTED=False,
            STATS_ARE_VAR=stat_is_var, IS_RMS=rms, HAS_W=w is not None, HAS_B=b is not None,
            HAS_Z=z is not None, ACT=_act(activation), BETA_NONZERO=beta != 0,
            PMODE=_pmode(pl), KD=g.kd, BLOCK_R=t.block_r, BLOCK_K=t.block_k,
        )  # fmt: skip
    plan(
        X=x, Y=y, Z=_or(z, x), W=_or(w, x), B=_or(b, x), SHIFT=mean, MEAN=mean, RSTD=stat,
        eps=float(eps),
        alpha=float(alpha), beta=float(beta),
    )  # fmt: skip


# -- backward -----------------------------------------------------------------------------------


@dataclass
class _RowBackwardPlan:
    main: KernelLaunch
    finish: KernelLaunch | None
    part_shape: tuple
    zero_parts: bool


def backward_rows(
    dy: torch.Tensor,
    x: torch.Tensor,
    dx: torch.Tensor,
    kept: tuple[int, ...],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    *,
    w: torch.Tensor | None = None,
    dw: torch.Tensor | None = None,
    db: torch.Tensor | None = None,
    rms: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> None:
    """Layer / RMS norm backward: dx, and with `dw` (and `db`) the parameter gradients summed
    over the kept dims. The parameters span exactly the reduced dims; mean and rstd are
    float32, contiguous over the kept dims. dw and db are contiguous of the weight's shape."""
    pol = policy(x.device)
    key = _key(
        "rowbwd", dy, x, dx, w, kept=tuple(kept), rms=rms, beta0=beta != 0, dw=dw is not None,
        db=db is not None, dwt=dw is not None and dw.dtype, pol=pol,
    )  # fmt: skip
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _row_backward_plan(dy, x, dx, kept, w, dw, db, rms, beta, pol)
    alloc = torch.zeros if plan.zero_parts else torch.empty
    pw = alloc(plan.part_shape, dtype=torch.float32, device=x.device)
    pb = alloc(plan.part_shape, dtype=torch.float32, device=x.device) if db is not None else pw
    plan.main(
        DY=dy, X=x, W=_or(w, x), B=x, Z=x, MEAN=mean, RSTD=rstd, DX=dx, PW=pw, PB=pb,
        alpha=float(alpha), beta=float(beta),
    )  # fmt: skip
    if plan.finish is not None:
        plan.finish(PW=pw, PB=pb, DW=dw, DB=_or(db, dw))


def _row_backward_plan(dy, x, dx, kept, w, dw, db, rms, beta, pol) -> _RowBackwardPlan:
    param = w.stride() if w is not None else contiguous_strides(x.shape, _reduced(x.dim(), kept))
    g = geometry(x.shape, kept, [x.stride(), dy.stride(), dx.stride(), param])
    xl, dyl, dxl, pl = g.layouts
    t = row_tiles(g, x.element_size(), pol)
    geo = g.for_tiles(t.block_r)
    kept_blocks = triton.cdiv(g.kept, t.block_k)
    programs = min(kept_blocks, pol.row_programs_per_slot * parallel_slots(x.device.type))
    single = _single(g, t)
    params = g.count
    grads = dw is not None
    main = KernelLaunch(
        norm_row_backward_kernel, (programs,), dict(num_warps=t.num_warps), geo=geo, dyl=dyl,
        xl=xl, pl=pl, zl=xl, dxl=dxl, inv_count=1.0 / g.count, kept_blocks=kept_blocks,
        n_params=params, IS_RMS=rms, HAS_W=w is not None, HAS_B=False, HAS_Z=False, ACT=0,
        BETA_NONZERO=beta != 0, PARAM_GRADS=grads, BIAS_GRAD=db is not None,
        PMODE=_pmode(pl), SINGLE=single,
        KD=g.kd, BLOCK_R=t.block_r, BLOCK_K=t.block_k,
    )  # fmt: skip
    finish = None
    if grads:
        fb = min(1024, _pow2(params))
        finish = KernelLaunch(
            param_grad_finish_kernel, (triton.cdiv(params, fb),), dict(num_warps=4),
            n_params=params, n_parts=programs, HAS_DB=db is not None, BLOCK=fb,
        )  # fmt: skip
    shape = (programs, params) if grads else (1,)
    return _RowBackwardPlan(main, finish, shape, grads and not single)


def _reduced(ndim: int, kept) -> list[int]:
    return [d for d in range(ndim) if d not in tuple(kept)]


@dataclass
class _SplitBackwardPlan:
    partial: KernelLaunch
    finish: KernelLaunch
    apply: KernelLaunch
    part_shape: tuple
    coef_shape: tuple


def backward_split(
    dy: torch.Tensor,
    x: torch.Tensor,
    dx: torch.Tensor,
    kept: tuple[int, ...],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    groups: tuple[int, int, int],
    *,
    weight: torch.Tensor | None = None,
    w: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dz: torch.Tensor | None = None,
    dw: torch.Tensor | None = None,
    db: torch.Tensor | None = None,
    training: bool = True,
    rms: bool = False,
    activation: str = "identity",
    alpha: float = 1.0,
    beta: float = 0.0,
) -> None:
    """Batch / group / instance norm backward in three passes (see kernels/norm_backward.py).

    `groups` = (outer, groups, group_size): the flat kept index is (outer, group, member) and
    the statistics `mean`, `rstd` (views broadcast to x's shape, float32) are indexed by
    (outer, group). `weight` is the contiguous weight (groups * group_size,) and w, b its and
    the bias' broadcast views; dw, db (contiguous, like weight) receive the parameter gradients
    when given. z (the residual, needed to recompute the activation) and dz go together.
    """
    pol = policy(x.device)
    key = _key(
        "splitbwd", dy, x, dx, w, b, z, dz, mean, kept=tuple(kept), groups=tuple(groups),
        training=training, rms=rms, act=activation, beta0=beta != 0, dw=dw is not None,
        dwt=dw is not None and dw.dtype, pol=pol,
    )  # fmt: skip
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _split_backward_plan(
            dy, x, dx, kept, mean, groups, w, b, z, dz, dw, training, rms, activation, beta, pol
        )
    part = torch.empty(plan.part_shape, dtype=torch.float32, device=x.device)
    coef = torch.empty(plan.coef_shape, dtype=torch.float32, device=x.device)
    common = dict(X=x, W=_or(w, x), B=_or(b, x), MEAN=mean, RSTD=rstd)
    plan.partial(DY=dy, Z=_or(z, x), DZ=_or(dz, x), PART=part, **common)
    plan.finish(PART=part, W=_or(weight, x), DW=_or(dw, coef), DB=_or(db, coef), COEF=coef)
    # With dz written, the last pass reads dz = dy * act'(pre) instead of recomputing it.
    plan.apply(
        DY=dz if dz is not None else dy, Z=_or(z, x), COEF=coef, DX=dx, alpha=float(alpha),
        beta=float(beta), **common,
    )  # fmt: skip


def _split_backward_plan(
    dy, x, dx, kept, mean, groups, w, b, z, dz, dw, training, rms, activation, beta, pol
) -> _SplitBackwardPlan:
    views = [x, dy, dx, w if w is not None else b, z, mean, dz]
    g = geometry(x.shape, kept, _strides(views, x.stride()))
    xl, dyl, dxl, pl, zl, sl, dzl = (_layout_of(g, i) for i in range(7))
    t = split_tiles(g, x.element_size(), pol)
    geo = g.for_tiles(t.block_r)
    kept_blocks = triton.cdiv(g.kept, t.block_k)
    slices, per_slice = _slices(geo.tiles, kept_blocks, x.device, pol)
    grid = (kept_blocks, slices)
    opts = dict(num_warps=t.num_warps)
    act = _act(activation)
    flags = dict(
        IS_RMS=rms, HAS_W=w is not None, HAS_B=b is not None, HAS_Z=z is not None,
        PMODE=_pmode(pl), KD=g.kd, BLOCK_R=t.block_r, BLOCK_K=t.block_k,
    )  # fmt: skip
    partial = KernelLaunch(
        norm_bwd_partial_kernel, grid, opts, geo=geo, dyl=dyl, xl=xl, pl=pl, zl=zl, sl=sl,
        dzl=dzl, tiles_per_slice=per_slice, ACT=act, WRITE_DZ=dz is not None, **flags,
    )  # fmt: skip
    outer, n_groups, group_size = groups
    block_c = _pow2(group_size)
    block_g = min(_pow2(n_groups), max(1, 1024 // block_c))
    finish = KernelLaunch(
        norm_bwd_finish_kernel, (triton.cdiv(n_groups, block_g),), dict(num_warps=4),
        outer=outer, groups=n_groups, group_size=group_size, slices=slices,
        inv_count=1.0 / (g.count * group_size), HAS_W=w is not None, PARAM_GRADS=dw is not None,
        BLOCK_G=block_g, BLOCK_C=block_c,
    )  # fmt: skip
    if dz is not None:  # dpre comes from dz: no activation to recompute, no residual to read
        dyl, act, flags["HAS_Z"] = dzl, 0, False
    apply = KernelLaunch(
        norm_bwd_apply_kernel, grid, opts, geo=geo, dyl=dyl, xl=xl, pl=pl, zl=zl, sl=sl,
        dxl=dxl, coef_plane=outer * n_groups, tiles_per_slice=per_slice, TRAINING=training,
        ACT=act, BETA_NONZERO=beta != 0, **flags,
    )  # fmt: skip
    return _SplitBackwardPlan(partial, finish, apply, (2, slices, g.kept), (2, outer, n_groups))
