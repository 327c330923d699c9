"""Normalization engine: logical views -> merged geometry, tile choice, prepared launches.

The ops layer describes every normalization the same way (kernels/norm_addressing.py): a set of
tensors of one logical shape (broadcast operands as expanded views with zero strides) and the
list of kept dims. This module merges dims, picks the row or the split path and the tiles,
and runs the kernels. Plans (prepared launches) are built once per problem and called with the
tensors only: every training step repeats the same problems, and the host must not take longer
than a memory-bound kernel of a few microseconds. The ops layer keeps them, per validated call
signature, in `cache`.

No validation here: the ops layer has done it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from ..core import INTERPRETED, NotSupportedError, cached_call, cdiv
from ..core.handle import stream_counters, stream_scratch
from ..core.prepared import PreparedCalls
from ..core.tensor import MAX_ELEMENTS, contiguous_strides, memory_span
from ..kernels.launch import SlotLaunch, slot_launch
from ..kernels.norm_addressing import ACTIVATIONS, Layout, NormGeometry
from ..kernels.norm_backward import (
    norm_bwd_apply_kernel,
    norm_bwd_finish_kernel,
    norm_bwd_fused_kernel,
    norm_bwd_partial_kernel,
    norm_row_backward_kernel,
    param_grad_finish_kernel,
)
from ..kernels.norm_forward import (
    norm_apply_kernel,
    norm_row_forward_kernel,
    norm_stats_apply_kernel,
    norm_stats_kernel,
)
from .geometry import parallel_slots

MAX_DIMS = 4  # kept and reduced dims each, after merging


@dataclass(frozen=True)
class TilePolicy:
    """Launch choices. The CPU policy uses tiny tiles so that the interpreter exercises every
    path (several tiles per statistic, several slices) on tiny tensors."""

    row_elements: int  # largest row tile kept in registers (BLOCK_R * BLOCK_K)
    row_pack: int  # short rows are packed into tiles of about this many elements
    row_pack_16bit: int  # the same for 16-bit data
    split_elements: int  # elements of one split-path tile
    max_block_r: int  # cap on BLOCK_R
    programs_per_slot: int  # split grids aim at this many programs per parallel slot
    row_programs_per_slot: int  # programs of the persistent row backward, per slot
    max_slices: int  # cap on reduced slices per kept block (split path)
    finish_block: int  # merges and finish kernels read at most this many slices per step
    lane_bytes: int = 128  # kept-contiguous split tiles: bytes of kept indices per row
    warp_elements: int = 512  # split tiles get one warp per this many elements
    stats_programs_per_slot: int = 0  # the forward statistics pass's (0: programs_per_slot)
    sums_programs_per_slot: int = 0  # the backward's partial-sums pass's (0: the same)
    stats_stages: int = 2  # software-pipeline stages of the statistics pass's loop
    # Batch norm's split passes in one cooperative launch a direction (a grid barrier between
    # them: kernels/arrival.py). Not in the interpreter, which runs programs one at a time.
    fused_passes: bool = False
    force_path: str | None = None  # "row" or "split" for tests; None decides by the problem


# Split grids are oversubscribed (8 programs per slot, about 16 per SM) so that the last wave
# is a small fraction of the work whatever the occupancy. The persistent row backward keeps
# one partial dweight row per program, so it runs about 4 programs per SM: a multiple of the
# SM count, and few enough partial rows to be a few percent of the traffic. Short rows of
# 16-bit data are packed into tiles of 2048 elements: with 4096 the row backward on bf16 rows
# of 768 and 1024 ran at 25-55% of copy bandwidth, with 2048 at 63-77%
# (benchmarks/probes/row_norm_sweep.py). Float32 keeps 4096 (not measured at 2048).
# The reducing passes run fewer programs: each has more tiles to walk after its prologue, and
# its merge tree is shallower. The forward statistics pass, 2 per slot: against 4, the same
# time at 112x112 and 2 to 14% less on the other ResNet-50 batch-norm shapes (batch 64 and
# 128; most at 14x14 and 7x7), and 4 had been 4 to 22% faster than 8. The backward's partial
# sums, 4 per slot: within 2% of 8 on the large shapes (the whole backward no slower), 6 to
# 18% faster at 14x14 and 7x7, while 2 was up to 8% slower at 56x56 and 28x28. The
# elementwise passes were 3 to 10% slower with fewer than 8 (benchmarks/probes/split_norm_sweep.py).
GPU_POLICY = TilePolicy(
    row_elements=16384, row_pack=4096, row_pack_16bit=2048, split_elements=4096, max_block_r=16384,
    programs_per_slot=8, row_programs_per_slot=2, max_slices=512, finish_block=256,
    warp_elements=1024, stats_programs_per_slot=2, sums_programs_per_slot=4,
    fused_passes=not INTERPRETED,
)  # fmt: skip
CPU_POLICY = TilePolicy(
    row_elements=64, row_pack=32, row_pack_16bit=32, split_elements=32, max_block_r=16,
    programs_per_slot=1, row_programs_per_slot=1, max_slices=3, finish_block=2,
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
        chunks = cdiv(self.rsize[3], block_r)
        return NormGeometry(
            self.ksize, self.rsize, self.kept, chunks, chunks * math.prod(self.rsize[:3])
        )


def geometry(shape, kept_dims, strides: list[tuple[int, ...]]) -> Geometry:
    """Merge the dims of a normalization problem. `strides[0]` (x) decides the order of the
    reduced dims (largest stride first, so the vector dim of a tile is x's most contiguous);
    kept dims keep their logical order, so the flat kept index is row-major over them."""
    nd = len(shape)
    for s in strides:
        span = cached_call(memory_span, tuple(shape), tuple(s))
        if span - 1 > MAX_ELEMENTS:
            raise NotSupportedError(
                f"a tensor spans {span} elements: offsets above 2**31 - 1 are not supported"
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


def _lane_block(g: Geometry, itemsize: int, nbytes: int) -> int:
    # Kept indices side by side are contiguous: take whole 128-byte lines of them.
    return min(_pow2(g.kept), max(8, nbytes // itemsize))


def split_tiles(g: Geometry, itemsize: int, pol: TilePolicy) -> Tiles:
    if _kept_contiguous(g):
        block_k = _lane_block(g, itemsize, pol.lane_bytes)
        block_r = min(_pow2(g.rsize[3]), max(1, pol.split_elements // block_k), pol.max_block_r)
    else:
        block_r = min(_pow2(g.rsize[3]), pol.split_elements, pol.max_block_r)
        block_k = min(_pow2(g.kept), max(1, pol.split_elements // block_r))
    return Tiles(block_r, block_k, _warps(block_r * block_k, pol.warp_elements))


def row_tiles(g: Geometry, itemsize: int, pol: TilePolicy) -> Tiles:
    if _kept_contiguous(g):
        block_k = _lane_block(g, itemsize, 128)
        block_r = min(_pow2(g.rsize[3]), max(1, pol.row_elements // block_k), pol.max_block_r)
    else:
        block_r = min(_pow2(g.rsize[3]), pol.row_elements, pol.max_block_r)
        pack = pol.row_pack_16bit if itemsize == 2 else pol.row_pack
        block_k = min(_pow2(g.kept), max(1, pack // block_r))
        if itemsize == 4 and block_k == 2:
            # Float32 tiles of two rows give a wrong dbias in the layer-norm backward on the
            # GPU (Triton 3.6, sm_90: benchmarks/probes/row_dbias_probe.py; one, four or eight rows,
            # and 16-bit data, are right): take one row per tile instead.
            block_k = 1
    return Tiles(block_r, block_k, _warps(block_r * block_k, 512))


def _warps(elements: int, per_warp: int) -> int:
    return max(1, min(16, _pow2(elements // per_warp)))


def _single(g: Geometry, t: Tiles) -> bool:
    return math.prod(g.rsize[:3]) == 1 and g.rsize[3] <= t.block_r


def _slices(
    g: Geometry,
    t: Tiles,
    device: torch.device,
    pol: TilePolicy,
    per_slot: int | None = None,
    resident: bool = False,
) -> tuple[int, int]:
    """(slices, tiles per slice) of the split grid (cdiv(kept, BLOCK_K), slices): about
    `per_slot` (default pol.programs_per_slot) programs per parallel slot (`resident`: no
    more, for a cooperative launch, whose programs must all fit at once), no empty slice, and
    at most max_slices summaries per kept index for the merge (see MergeTree) or finish pass
    to read, in order."""
    tiles = g.for_tiles(t.block_r).tiles
    kept_blocks = cdiv(g.kept, t.block_k)
    target = (per_slot or pol.programs_per_slot) * parallel_slots(device.type)
    per_block = target // kept_blocks if resident else cdiv(target, kept_blocks)
    slices = max(1, min(tiles, pol.max_slices, per_block))
    per_slice = cdiv(tiles, slices)
    return cdiv(tiles, per_slice), per_slice


class MergeTree:
    """How the split kernels merge their slices' partial results in the launch that made them
    (kernels/arrival.py): groups of `fan_in` slices, then the groups, about sqrt(slices)
    each, merged `block` at a time (blocks of [block, BLOCK_K] of at most 16 values per
    thread); `counters` arrival counters in all."""

    def __init__(self, slices: int, kept_blocks: int, t: Tiles, pol: TilePolicy):
        self.fan_in = max(1, math.isqrt(slices - 1) + 1) if slices > 1 else 1
        groups = cdiv(slices, self.fan_in)
        self.counters = kept_blocks * (groups + 1)
        per_step = max(1, 512 * t.num_warps // t.block_k)
        largest = max(self.fan_in, groups)
        self.block = max(1, min(_pow2(largest), pol.finish_block, _pow2(per_step + 1) // 2))


def use_row_path(g: Geometry, itemsize: int, device: torch.device, pol: TilePolicy) -> bool:
    """One program per kept block, when that is one pass over x (the tile holds the whole
    reduced extent) or when there are enough kept blocks to fill the device."""
    if pol.force_path is not None:
        return pol.force_path == "row"
    t = row_tiles(g, itemsize, pol)
    return _single(g, t) or cdiv(g.kept, t.block_k) >= parallel_slots(device.type)


# -- plans ----------------------------------------------------------------------------------

#: Validated call signatures -> prepared calls, filled by the ops layer.
cache = PreparedCalls()


def clear_plans() -> None:
    """Forget prepared calls (tests that change the tile policy call this)."""
    cache.clear()


def _layout_of(g: Geometry, index: int) -> Layout:
    return g.layouts[index]


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


def _or(t: torch.Tensor | None, default: torch.Tensor) -> torch.Tensor:
    return t if t is not None else default


_FWD_SLOTS = ("X", "Y", "Z", "W", "B", "MEAN", "RSTD", "eps", "alpha", "beta")


def _stats_layout(g: Geometry) -> Layout:
    """Where the split statistics pass leaves its statistics: contiguous, by the flat kept
    index (the merged mean and the shift in its workspace's planes 1 and 3)."""
    return Layout(contiguous_strides(g.ksize, range(MAX_DIMS)), (0,) * MAX_DIMS)


def _cooperative(launch: SlotLaunch, args: tuple) -> bool:
    """Run a fused cooperative launch; False, having run nothing, where CUDA refuses it (more
    programs than fit on the device at once, or fewer multiprocessors available than it
    reports, as under MPS limits): the plan then runs its passes as separate launches."""
    try:
        launch(*args)
    except RuntimeError as error:
        if "cooperative launch" not in str(error):
            raise
        return False
    return True


class ForwardPlan:
    """Statistics over the reduced dims and the normalized output, by the row or split path.

    Call with (x, y, mean, rstd, w, b, z, running_mean, running_var, eps, momentum, alpha,
    beta): w, b, z and the running statistics may be None; mean and rstd are float32,
    contiguous over the kept dims; the running statistics (split path only) are updated.
    """

    def __init__(self, x, y, kept, w, b, z, rms, activation, beta_nonzero, running: bool):
        pol = policy(x.device)
        views = [x, y, z, w if w is not None else b]
        g = geometry(x.shape, kept, _strides(views, x.stride()))
        xl, yl, zl, pl = (_layout_of(g, i) for i in range(4))
        flags = dict(
            IS_RMS=rms, HAS_W=w is not None, HAS_B=b is not None, HAS_Z=z is not None,
            ACT=_act(activation), BETA_NONZERO=beta_nonzero, PMODE=_pmode(pl), KD=g.kd,
        )  # fmt: skip
        itemsize = x.element_size()
        self.row = None
        if not running and use_row_path(g, itemsize, x.device, pol):
            t = row_tiles(g, itemsize, pol)
            self.row = SlotLaunch(
                norm_row_forward_kernel, (cdiv(g.kept, t.block_k),),
                dict(num_warps=t.num_warps), _FWD_SLOTS, geo=g.for_tiles(t.block_r), xl=xl,
                yl=yl, zl=zl, pl=pl, inv_count=1.0 / g.count, SINGLE=_single(g, t),
                BLOCK_R=t.block_r, BLOCK_K=t.block_k, **flags,
            )  # fmt: skip
            return
        t = split_tiles(g, itemsize, pol)
        geo = g.for_tiles(t.block_r)
        kept_blocks = cdiv(g.kept, t.block_k)
        slices, per_slice = _slices(g, t, x.device, pol, pol.stats_programs_per_slot)
        opts = dict(num_warps=t.num_warps)
        self.part_numel = 4 * slices * g.kept
        tree = MergeTree(slices, kept_blocks, t, pol)
        self.counters = tree.counters
        self.fused = None
        if pol.fused_passes:
            # As many programs as the statistics pass's, at most: all must fit at once.
            fused_slices, fused_per_slice = _slices(
                g, t, x.device, pol, pol.stats_programs_per_slot, resident=True
            )
            fused_tree = MergeTree(fused_slices, kept_blocks, t, pol)
            self.fused_counters = fused_tree.counters + 2  # and two for the grid barrier
            self.fused_part_numel = 4 * fused_slices * g.kept
            self.fused = slot_launch(
                norm_stats_apply_kernel, (kept_blocks, fused_slices),
                ("X", "Y", "Z", "W", "B", "PART", "MEAN", "RSTD", "RUN_MEAN", "RUN_VAR",
                 "ARRIVALS", "eps", "momentum", "alpha", "beta"),
                num_warps=t.num_warps, cooperative=True, geo=geo, xl=xl, yl=yl, zl=zl, pl=pl,
                sl=_stats_layout(g), tiles_per_slice=fused_per_slice,
                fan_in=fused_tree.fan_in, sync_offset=fused_tree.counters,
                UPDATE_RUNNING=running, BLOCK_R=t.block_r, BLOCK_K=t.block_k,
                BLOCK_S=fused_tree.block, STAGES=pol.stats_stages, **flags,
            )  # fmt: skip
        self.stats = SlotLaunch(
            norm_stats_kernel, (kept_blocks, slices), opts,
            ("X", "PART", "MEAN", "RSTD", "RUN_MEAN", "RUN_VAR", "ARRIVALS", "eps", "momentum"),
            geo=geo, xl=xl, tiles_per_slice=per_slice, fan_in=tree.fan_in, IS_RMS=rms,
            UPDATE_RUNNING=running, KD=g.kd, BLOCK_R=t.block_r, BLOCK_K=t.block_k,
            BLOCK_S=tree.block, STAGES=pol.stats_stages,
        )  # fmt: skip
        sl = _stats_layout(g)
        apply_slices, apply_per_slice = _slices(g, t, x.device, pol)
        self.apply = SlotLaunch(
            norm_apply_kernel, (kept_blocks, apply_slices), opts, (*_FWD_SLOTS, "SHIFT"),
            geo=geo, xl=xl, yl=yl, zl=zl, pl=pl, sl=sl, tiles_per_slice=apply_per_slice,
            mean_offset=slices * g.kept,
            shift_offset=3 * slices * g.kept, SHIFTED=True, STATS_ARE_VAR=False,
            BLOCK_R=t.block_r, BLOCK_K=t.block_k, **flags,
        )  # fmt: skip

    def __call__(self, x, y, mean, rstd, w, b, z, running_mean, running_var, eps, momentum,
                 alpha, beta) -> None:  # fmt: skip
        z, w, b = _or(z, x), _or(w, x), _or(b, x)
        if self.row is not None:
            self.row(x, y, z, w, b, mean, rstd, eps, alpha, beta)
            return
        rm, rv = _or(running_mean, mean), _or(running_var, rstd)
        if self.fused is not None:
            part = stream_scratch(x.device, "norm_part", self.fused_part_numel)
            arrivals = stream_counters(x.device, self.fused_counters)
            args = (x, y, z, w, b, part, mean, rstd, rm, rv, arrivals, eps, momentum, alpha, beta)
            if _cooperative(self.fused, args):
                return
            self.fused = None
        part = stream_scratch(x.device, "norm_part", self.part_numel)
        arrivals = stream_counters(x.device, self.counters)
        self.stats(x, part, mean, rstd, rm, rv, arrivals, eps, momentum)
        # The statistics pass left the mean relative to the shift in part[1, 0], the shift is in
        # part[3, 0] (the offsets are fixed in the launch): normalizing with them is exact
        # where x - mean in float32 is not.
        self.apply(x, y, z, w, b, part, rstd, eps, alpha, beta, part)


class ApplyPlan:
    """The elementwise pass with given statistics (views broadcast to x's shape: `mean` and
    `stat`, a variance if stat_is_var, else 1/std). Call with (x, y, mean, stat, w, b, z, eps,
    alpha, beta)."""

    def __init__(self, x, y, kept, mean, stat, stat_is_var, w, b, z, rms, activation,
                 beta_nonzero):  # fmt: skip
        pol = policy(x.device)
        views = [x, y, z, w if w is not None else b, mean]
        g = geometry(x.shape, kept, _strides(views, x.stride()))
        t = split_tiles(g, x.element_size(), pol)
        geo = g.for_tiles(t.block_r)
        kept_blocks = cdiv(g.kept, t.block_k)
        slices, per_slice = _slices(g, t, x.device, pol)
        xl, yl, zl, pl, sl = (_layout_of(g, i) for i in range(5))
        self.launch = SlotLaunch(
            norm_apply_kernel, (kept_blocks, slices), dict(num_warps=t.num_warps),
            ("X", "Y", "Z", "W", "B", "MEAN", "RSTD", "eps", "alpha", "beta", "SHIFT"), geo=geo,
            xl=xl, yl=yl, zl=zl, pl=pl, sl=sl, tiles_per_slice=per_slice, mean_offset=0,
            shift_offset=0, SHIFTED=False,
            STATS_ARE_VAR=stat_is_var, IS_RMS=rms, HAS_W=w is not None, HAS_B=b is not None,
            HAS_Z=z is not None, ACT=_act(activation), BETA_NONZERO=beta_nonzero,
            PMODE=_pmode(pl), KD=g.kd, BLOCK_R=t.block_r, BLOCK_K=t.block_k,
        )  # fmt: skip

    def __call__(self, x, y, mean, stat, w, b, z, eps, alpha, beta) -> None:
        # SHIFT is never read (SHIFTED=False): the mean stands in for the pointer.
        self.launch(x, y, _or(z, x), _or(w, x), _or(b, x), mean, stat, eps, alpha, beta, mean)


class RowBackwardPlan:
    """Layer / RMS norm backward: dx, and with `grads` the parameter gradients summed over the
    kept dims (the parameters span exactly the reduced dims, contiguous). Call with (dy, x, dx,
    mean, rstd, w, dw, db, alpha, beta); mean and rstd are float32, contiguous over the kept
    dims; dw and db (None without grads; db None without bias_grad) are contiguous."""

    def __init__(self, dy, x, dx, kept, w, grads, bias_grad, rms, beta_nonzero):
        pol = policy(x.device)
        param = w.stride() if w is not None else contiguous_strides(x.shape, _reduced(x, kept))
        g = geometry(x.shape, kept, [x.stride(), dy.stride(), dx.stride(), param])
        xl, dyl, dxl, pl = g.layouts
        t = row_tiles(g, x.element_size(), pol)
        kept_blocks = cdiv(g.kept, t.block_k)
        programs = min(kept_blocks, pol.row_programs_per_slot * parallel_slots(x.device.type))
        single = _single(g, t)
        params = g.count
        self.main = SlotLaunch(
            norm_row_backward_kernel, (programs,), dict(num_warps=t.num_warps),
            ("DY", "X", "W", "B", "Z", "MEAN", "RSTD", "DX", "PW", "PB", "alpha", "beta"),
            geo=g.for_tiles(t.block_r), dyl=dyl, xl=xl, pl=pl, zl=xl, dxl=dxl,
            inv_count=1.0 / g.count, kept_blocks=kept_blocks, n_params=params, IS_RMS=rms,
            HAS_W=w is not None, HAS_B=False, HAS_Z=False, ACT=0, BETA_NONZERO=beta_nonzero,
            PARAM_GRADS=grads, BIAS_GRAD=bias_grad, PMODE=_pmode(pl), SINGLE=single, KD=g.kd,
            BLOCK_R=t.block_r, BLOCK_K=t.block_k,
        )  # fmt: skip
        self.finish = None
        if grads:
            # About one column block per parallel slot (at least 32-byte sectors of them), and
            # all partial rows of a block in one load where they fit: the sum of the partial
            # rows (several MB on short rows) is a short tail, not a serial walk by two dozen
            # programs (5 us of a 70 us layer-norm backward, measured).
            slots = parallel_slots(x.device.type)
            bk = max(8, min(_pow2(params), _pow2(cdiv(params, slots))))
            bp = min(_pow2(programs), max(1, 8192 // bk), 4 * pol.finish_block)
            self.finish = SlotLaunch(
                param_grad_finish_kernel, (cdiv(params, bk),), dict(num_warps=8),
                ("PW", "PB", "DW", "DB"), n_params=params, n_parts=programs,
                HAS_DB=bias_grad, BLOCK_P=bp, BLOCK=bk,
            )  # fmt: skip
        self.part_numel = programs * params if grads else 1
        self.zero_parts = grads and not single
        self.bias_grad = bias_grad

    def __call__(self, dy, x, dx, mean, rstd, w, dw, db, alpha, beta) -> None:
        # The partial rows live in the stream's scratch buffers (those of the split backward,
        # free between ops: no allocation per call); the two-walk path adds into them, so they
        # start at zero there.
        pw = stream_scratch(x.device, "norm_part", self.part_numel)
        pb = stream_scratch(x.device, "norm_coef", self.part_numel) if self.bias_grad else pw
        if self.zero_parts:
            pw[: self.part_numel].zero_()
            if self.bias_grad:
                pb[: self.part_numel].zero_()
        # B and Z are never read here (no activation): x stands in for the pointers.
        self.main(dy, x, _or(w, x), x, x, mean, rstd, dx, pw, pb, alpha, beta)
        if self.finish is not None:
            self.finish(pw, pb, dw, _or(db, dw))


def _reduced(x: torch.Tensor, kept) -> list[int]:
    return [d for d in range(x.dim()) if d not in tuple(kept)]


class SplitBackwardPlan:
    """Batch / group / instance norm backward in three passes (kernels/norm_backward.py).

    `groups` = (outer, groups, group_size): the flat kept index is (outer, group, member), the
    statistics (views broadcast to x's shape, float32) are indexed by (outer, group), the
    contiguous weight by (group, member). Call with (dy, x, dx, mean, rstd, weight, bias, z,
    dz, dw, db, alpha, beta): bias and z are needed only to recompute an activation; z and dz
    go together; dw and db (contiguous, like the weight) are written when `grads`.
    """

    def __init__(self, dy, x, dx, kept, mean, groups, w, b, z, dz, grads, training, rms,
                 activation, beta_nonzero):  # fmt: skip
        pol = policy(x.device)
        views = [x, dy, dx, w if w is not None else b, z, mean, dz]
        g = geometry(x.shape, kept, _strides(views, x.stride()))
        xl, dyl, dxl, pl, zl, sl, dzl = (_layout_of(g, i) for i in range(7))
        t = split_tiles(g, x.element_size(), pol)
        geo = g.for_tiles(t.block_r)
        kept_blocks = cdiv(g.kept, t.block_k)
        # The partial pass reduces (fewer, longer programs, like the forward's statistics
        # pass); the elementwise pass has its own slicing.
        slices, per_slice = _slices(g, t, x.device, pol, pol.sums_programs_per_slot)
        apply_slices, apply_per_slice = _slices(g, t, x.device, pol)
        opts = dict(num_warps=t.num_warps)
        act = _act(activation)
        flags = dict(
            IS_RMS=rms, HAS_W=w is not None, HAS_B=b is not None, HAS_Z=z is not None,
            PMODE=_pmode(pl), KD=g.kd, BLOCK_R=t.block_r, BLOCK_K=t.block_k,
        )  # fmt: skip
        outer, n_groups, group_size = groups
        inv_count = 1.0 / (g.count * group_size)
        # Batch norm (a statistic and a weight per kept index) is finished by the partial
        # pass's last program of each kept block; group and instance norm sum over kept
        # blocks (members of a group, outer indices), so a finish kernel follows.
        fused = outer == 1 and group_size == 1
        tree = MergeTree(slices, kept_blocks, t, pol)
        self.counters = tree.counters
        self.fused = None
        if fused and training and pol.fused_passes:
            # One program a parallel slot (two a multiprocessor): the fused kernel holds up to
            # 236 registers a thread (ReLU recomputed), and every program must fit at once.
            fused_slices, fused_per_slice = _slices(g, t, x.device, pol, 1, resident=True)
            fused_tree = MergeTree(fused_slices, kept_blocks, t, pol)
            self.fused_counters = fused_tree.counters + 2  # and two for the grid barrier
            self.fused_part_numel = 2 * fused_slices * g.kept
            self.fused = slot_launch(
                norm_bwd_fused_kernel, (kept_blocks, fused_slices),
                ("DY", "X", "W", "B", "Z", "MEAN", "RSTD", "DZ", "PART", "DW", "DB", "COEF",
                 "DX", "ARRIVALS", "alpha", "beta"),
                num_warps=t.num_warps, cooperative=True, geo=geo, dyl=dyl, xl=xl, pl=pl, zl=zl,
                sl=sl, dzl=dzl, dxl=dxl, tiles_per_slice=fused_per_slice,
                fan_in=fused_tree.fan_in, sync_offset=fused_tree.counters, inv_count=inv_count,
                ACT=act, WRITE_DZ=dz is not None, PARAM_GRADS=grads, BETA_NONZERO=beta_nonzero,
                BLOCK_S=fused_tree.block, **flags,
            )  # fmt: skip
        self.partial = SlotLaunch(
            norm_bwd_partial_kernel, (kept_blocks, slices), opts,
            ("DY", "X", "W", "B", "Z", "MEAN", "RSTD", "DZ", "PART", "DW", "DB", "COEF",
             "ARRIVALS"), geo=geo, dyl=dyl, xl=xl, pl=pl, zl=zl, sl=sl, dzl=dzl,
            tiles_per_slice=per_slice, fan_in=tree.fan_in, inv_count=inv_count, ACT=act,
            WRITE_DZ=dz is not None, FINISH=fused, PARAM_GRADS=grads, BLOCK_S=tree.block,
            **flags,
        )  # fmt: skip
        self.finish = None
        if not fused:
            # Blocks of (outer, slice, member, group) sums of about 2048 elements per step.
            bc = _pow2(group_size)
            bs = min(_pow2(slices), pol.finish_block)
            bn = min(_pow2(outer), max(1, pol.finish_block // bs))
            bg = max(1, min(_pow2(n_groups), 2048 // (bs * bn * bc)))
            self.finish = SlotLaunch(
                norm_bwd_finish_kernel, (cdiv(n_groups, bg),), dict(num_warps=4),
                ("PART", "W", "DW", "DB", "COEF"), outer=outer, groups=n_groups,
                group_size=group_size, slices=slices, inv_count=inv_count,
                HAS_W=w is not None, PARAM_GRADS=grads, BLOCK_N=bn, BLOCK_S=bs, BLOCK_C=bc,
                BLOCK_G=bg,
            )  # fmt: skip
        self.uses_dz = dz is not None
        if self.uses_dz:  # dpre comes from dz: no activation to recompute, no residual to read
            dyl, act, flags["HAS_Z"] = dzl, 0, False
        self.apply = SlotLaunch(
            norm_bwd_apply_kernel, (kept_blocks, apply_slices), opts,
            ("DY", "X", "W", "B", "Z", "MEAN", "RSTD", "COEF", "DX", "alpha", "beta"), geo=geo,
            dyl=dyl, xl=xl, pl=pl, zl=zl, sl=sl, dxl=dxl, coef_plane=outer * n_groups,
            tiles_per_slice=apply_per_slice, TRAINING=training, ACT=act, BETA_NONZERO=beta_nonzero,
            **flags,
        )  # fmt: skip
        self.part_numel = 2 * slices * g.kept
        self.coef_numel = 2 * outer * n_groups

    def __call__(self, dy, x, dx, mean, rstd, weight, bias, z, dz, dw, db, alpha, beta) -> None:
        coef = stream_scratch(x.device, "norm_coef", self.coef_numel)
        w, b, z = _or(weight, x), _or(bias, x), _or(z, x)
        dw, db = _or(dw, coef), _or(db, coef)
        if self.fused is not None:
            part = stream_scratch(x.device, "norm_part", self.fused_part_numel)
            arrivals = stream_counters(x.device, self.fused_counters)
            args = (dy, x, w, b, z, mean, rstd, _or(dz, x), part, dw, db, coef, dx, arrivals,
                    alpha, beta)  # fmt: skip
            if _cooperative(self.fused, args):
                return
            self.fused = None
        part = stream_scratch(x.device, "norm_part", self.part_numel)
        arrivals = stream_counters(x.device, self.counters)
        self.partial(dy, x, w, b, z, mean, rstd, _or(dz, x), part, dw, db, coef, arrivals)
        if self.finish is not None:
            self.finish(part, w, dw, db, coef)
        # With dz written, the last pass reads dz = dy * act'(pre) instead of recomputing it.
        grad = dz if self.uses_dz else dy
        self.apply(grad, x, w, b, z, mean, rstd, coef, dx, alpha, beta)
