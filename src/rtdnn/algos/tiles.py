"""Tile shapes: candidates per problem, and the run-time choice among them.

On the GPU the first run of a problem takes, in order: the choice this machine's tuning
database holds for it; the choice shipped with rtdnn for this kind of GPU (select.shipped);
else it times each candidate once (on scratch output, so the caller's `out` is never touched
by the trials), and keeps the fastest for the process and in the database. RTDNN_AUTOTUNE=0
times nothing and reads no database: the shipped choice (for a layer the table lacks, that of
the most similar one it has), else the first candidate.
RTDNN_AUTOTUNE=1 passes over the shipped choices: every problem is measured here once. In the
interpreter (CPU) one small tile is used: its cost there is per program, not per element.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Protocol

import torch
import triton

from ..core import INTERPRETED, ConvProblem, cdiv
from ..core.timing import device_time_ms
from ..kernels.launch import MatrixLayout, TileConfig, TmaGemmTiles
from .geometry import before_hopper, multiprocessor_count

CPU_TILES = TileConfig(32, 32, 16, group_m=1, num_warps=1, num_stages=1)

log = logging.getLogger("rtdnn.tiles")

_chosen: dict[object, TileConfig] = {}


class TileStore(Protocol):
    """Tile choices kept beyond the process, by tuner key: (algorithm name, *problem)."""

    def load(self, key: tuple) -> TileConfig | None: ...

    def save(self, key: tuple, tiles: TileConfig) -> None: ...


class ShippedStore(Protocol):
    """Tile choices shipped with rtdnn, by tuner key; `similar`: also a choice made for a
    problem like this one (select.shipped)."""

    def load(self, key: tuple, similar: bool = False) -> TileConfig | None: ...


# The layer above installs its tuning database and the shipped choices here; this one does
# not import them.
_store: TileStore | None = None
_shipped: ShippedStore | None = None

#: The environment variable that says whether to time tile candidates (module docstring).
AUTOTUNE_ENV = "RTDNN_AUTOTUNE"


def set_store(store: TileStore | None, shipped: ShippedStore | None = None) -> None:
    """Keep tile choices in `store` too (None: in this process only), and read the choices
    shipped for the GPU from `shipped`."""
    global _store, _shipped
    _store, _shipped = store, shipped


def gemm_candidates(p: ConvProblem, rows: int, cols: int, depth: int) -> list[TileConfig]:
    """Tiles for a rows x cols output whose reduction chunks are `depth` long (e.g. C/g)."""
    return tile_candidates(p.device, p.dtype, rows, cols, depth)


def tile_candidates(
    device: str, dtype: torch.dtype, rows: int, cols: int, depth: int
) -> list[TileConfig]:
    """Tiles for a rows x cols GEMM output whose reduction chunks are `depth` long."""
    if device != "cuda":
        # The interpreter's cost is per program and per step, not per element: long
        # reductions (backward-filter over every pixel) take longer chunks.
        # Likewise large outputs take taller tiles; the small test shapes keep 32 x 32 tiles,
        # so that they still span several tiles.
        bk = max(CPU_TILES.block_k, min(128, triton.next_power_of_2(depth)))
        bm = 128 if rows >= 1024 else 64 if rows >= 256 else CPU_TILES.block_m
        return [TileConfig(bm, CPU_TILES.block_n, bk, 1, 1, 1)]
    # Reduction chunks: 64 (16-bit) or 32 (float32) elements, or 2x that when the reduction
    # is long enough; never much more than its length.
    bk_base = 64 if dtype.itemsize == 2 else 32
    bk = max(16, min(bk_base, triton.next_power_of_2(depth)))
    shapes = [
        (128, 128, bk, 8, 3),
        (128, 128, 2 * bk, 8, 3),
        (64, 128, bk, 4, 4),
        (128, 64, bk, 4, 4),
        (128, 256, bk, 8, 3),
        (256, 128, bk, 8, 3),
    ]
    if cols <= 32:
        # A few output columns (backward-data of an RGB stem: 3 input channels): a 64-wide
        # tile computed 21 times the useful products there (AlexNet conv1, 16 ms against
        # cuDNN's 0.9 on an H100; 9.5 ms with 16-wide tiles). Narrow, tall tiles come first,
        # the untuned choice, as wide as the columns (each column tile reloads A).
        bn = 16 if cols <= 16 else 32
        shapes = [(128, bn, bk, 4, 4), (256, bn, bk, 8, 3), (128, 48 - bn, bk, 4, 4)] + shapes
    if min(rows, cols) <= 64:
        # A side of 64 or less (64-channel layers; a filter gradient's K x C per tap): 128-wide
        # tiles compute mostly padding there. 64 x 64 ran backward-filter of ResNet-50's
        # 64-channel layers twice as fast as 128 x 128 (filter_split_probe.py, H100).
        shapes += [(64, 64, bk, 4, 4), (64, 64, 2 * bk, 4, 3)]
    out = []
    for bm, bn, bk_, warps, stages in shapes:
        # Skip tiles far larger than the output or the reduction: they only add masked work.
        if bm > 2 * max(16, rows) or bn > 2 * max(16, cols) or bk_ > max(bk, depth):
            continue
        out.append(TileConfig(bm, bn, bk_, 8, warps, stages))
    return out or [TileConfig(64, 64, bk, 8, 4, 4)]


#: The TMA GEMM runs on Hopper and later GPUs; tests set this to run it under Triton's
#: interpreter too, which has no such rule.
TMA_GEMM_IN_INTERPRETER = False
#: Set to 0 to keep plain matrices on the pointer tiles (read when a call is prepared).
TMA_GEMM_ENV = "RTDNN_TMA_GEMM"

# (block_m, block_n, block_k, warps, stages), the untuned choice first: the fastest shapes of
# an H200 sweep over ViT-B/16's and ResNet-50's plain GEMMs (benchmarks/probes/
# plain_gemm_probe.py); 128 x 64 and 256 x 64, first for outputs 64 columns wide, were not in
# that sweep (its 128-wide tiles computed half padding there).
_TMA_SHAPES = (
    (128, 128, 64, 4, 4),
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (128, 128, 128, 8, 3),
    (64, 128, 64, 4, 5),
)
_TMA_NARROW_SHAPES = ((128, 64, 64, 4, 4), (256, 64, 64, 8, 3))


def tma_gemm_usable(device: str, dtype: torch.dtype, *layouts: MatrixLayout) -> bool:
    """Whether the TMA GEMM (kernels/gemm_tma.py) can read these operands: 16-bit data (its
    float32 operands would need K-major tiles that a transposed operand does not give), each
    stored with a unit last stride and a row stride of whole 16-byte units, on a Hopper or
    later GPU, unless RTDNN_TMA_GEMM=0. Each call still checks its tensors' 16-byte
    alignment."""
    if dtype not in (torch.float16, torch.bfloat16) or os.environ.get(TMA_GEMM_ENV) == "0":
        return False
    if device == "cuda":
        if before_hopper(device):
            return False
    elif not (INTERPRETED and TMA_GEMM_IN_INTERPRETER):
        return False
    for layout in layouts:
        shape, strides = layout.stored()
        if strides[0] < shape[1] or (strides[0] * dtype.itemsize) % 16:
            return False
    return True


def tma_gemm_programs(device: str) -> int:
    """The most programs a persistent TMA GEMM launch runs: one per multiprocessor (a few
    under the interpreter)."""
    return multiprocessor_count(torch.cuda.current_device()) if device == "cuda" else 4


def _tma_splits(device: str, tiles: int, k_tiles: int) -> tuple[int, ...]:
    """Reduction splits to offer for `tiles` output tiles, the untuned choice first. Too few
    tiles for the device: enough jobs for every multiprocessor, each at least 8 steps long, at
    most 32 (an H200 ran ResNet-50's 64 x 256 weight gradient over 200k pixels fastest in 32).
    Enough tiles, but a last wave that leaves most multiprocessors idle (144 tiles on 132):
    also the fewest splits that even the waves out."""
    if device != "cuda":
        return (2,) if k_tiles >= 4 else (1,)  # tests: the long reductions split
    sms = multiprocessor_count(torch.cuda.current_device())
    if tiles < sms:
        split = max(1, min(cdiv(sms, tiles), k_tiles // 8, 32))
        return (split, 1) if split > 1 else (1,)

    def busy(splits: int) -> float:  # the share of the multiprocessors' time spent on jobs
        jobs = tiles * splits
        return jobs / (cdiv(jobs, sms) * sms)

    if busy(1) < 0.8:
        for split in range(2, 9):
            if k_tiles // split < 8:
                break
            if busy(split) >= 0.85:
                return (1, split)
    return (1,)


def tma_gemm_candidates(
    device: str, dtype: torch.dtype, m: int, n: int, k: int, max_splits: int = 32
) -> list[TmaGemmTiles]:
    """TMA GEMM tiles for an m x n output over a reduction of k, the untuned choice first;
    each shape unsplit and split (_tma_splits), into at most `max_splits` (what the caller's
    workspace holds; 1: never split). The caller checks tma_gemm_usable first."""
    if device != "cuda":
        # The interpreter: small tiles, split when it can so that tests cover the reduction.
        s = min(_tma_splits(device, 1, cdiv(k, 16))[0], max_splits)
        return [TmaGemmTiles(32, 32, 16, group_m=1, num_warps=1, num_stages=1, splits=s)]
    shapes = _TMA_NARROW_SHAPES + _TMA_SHAPES if n <= 64 else _TMA_SHAPES
    out = []
    for bm, bn, bk, warps, stages in shapes:
        if bm > 2 * max(64, m) or bn > 2 * max(64, n):
            continue  # far larger than the output: mostly masked work
        for count in _tma_splits(device, cdiv(m, bm) * cdiv(n, bn), cdiv(k, bk)):
            out.append(TmaGemmTiles(bm, bn, bk, 8, warps, stages, splits=min(count, max_splits)))
    return list(dict.fromkeys(out))


def tune(key, candidates: list[TileConfig], make_run) -> TileConfig:
    """The tiles of `candidates` to run `key` with (the module docstring says how they are
    chosen): on the GPU a stored or shipped choice, else the fastest, timing
    `make_run(tiles)()` once per candidate; the first candidate elsewhere. Remembered for the
    process. `key` is (algorithm name, *what identifies the problem), each part with a stable
    str(). `make_run` must not write anything the caller reads."""
    if key in _chosen:
        return _chosen[key]
    best = candidates[0]
    autotune = os.environ.get(AUTOTUNE_ENV)
    choosing = len(candidates) > 1 and torch.cuda.is_available()
    if choosing:
        # A choice that is not among the candidates (another version's) is not used.
        known = None
        if autotune != "0" and _store is not None:
            known = _store.load(key)
        if known not in candidates and autotune != "1" and _shipped is not None:
            known = _shipped.load(key)
            if known is None and autotune == "0":
                # Untuned, a layer the table lacks takes the choice of one like it, unless
                # its first candidate keeps its place over another kind of tiles.
                known = _shipped.load(key, similar=True)
                first = candidates[0]
                if first.first_over_similar and type(known) is not type(first):
                    known = None
        if known in candidates:
            _chosen[key] = known
            return known
    if choosing and autotune != "0":
        best_ms = float("inf")
        for tiles in candidates:
            try:
                ms = device_time_ms(make_run(tiles), rep_ms=20)
            except triton.runtime.errors.OutOfResources:
                continue
            log.debug("%s: %s %.4f ms", key, tiles, ms)
            if ms < best_ms:
                best, best_ms = tiles, ms
        log.info("%s: chose %s (%.4f ms)", key, best, best_ms)
        if _store is not None and best_ms < float("inf"):
            _store.save(key, best)
    _chosen[key] = best
    return best


def choose_tiles(algo, p: ConvProblem, tensors, workspace) -> TileConfig:
    """The tile config to run `algo` on `p` with, timing the candidates on first use on scratch
    output, so the caller's `out` is never touched by the trials."""
    candidates = algo.tile_candidates(p)
    if p.device != "cuda" or len(candidates) == 1:
        return candidates[0]
    written = tensors.written(p.direction)
    scratch = torch.empty_strided(
        written.shape, written.stride(), dtype=written.dtype, device=written.device
    )
    trial = tensors.with_written(p.direction, scratch)

    def make_run(tiles):
        return functools.partial(algo.prepare(p, tiles), trial, workspace, 1.0, 0.0)

    return tune((algo.name, p.key()), candidates, make_run)
