"""From a validated ConvProblem to the integer tuples the kernels read, and launch choices."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import torch
import triton.language as tl

from ..core import ConvProblem, Direction, TensorDesc
from ..kernels.conv_addressing import ConvGeometry, PhaseGeometry


def _to_3d(values: tuple[int, ...], fill: int) -> tuple[int, ...]:
    return (fill,) * (3 - len(values)) + tuple(values)


def _strides_3d(desc: TensorDesc) -> tuple[int, ...]:
    return (*desc.strides[:2], *_to_3d(desc.strides[2:], 0))


def conv_geometry(p: ConvProblem) -> ConvGeometry:
    """The problem as 3-D; true convolution reads (or writes) the filter flipped in place."""
    w = p.w
    if p.conv.mode == "convolution":
        w = w.flipped(range(2, w.ndim))
    g = p.groups
    return ConvGeometry(
        n=p.batch,
        cg=p.in_channels // g,
        kg=p.out_channels // g,
        in_size=_to_3d(p.in_spatial, 1),
        out_size=_to_3d(p.out_spatial, 1),
        kernel=_to_3d(p.kernel, 1),
        stride=_to_3d(p.conv.stride, 1),
        padding=_to_3d(p.conv.padding, 0),
        dilation=_to_3d(p.conv.dilation, 1),
        x_strides=_strides_3d(p.x),
        w_strides=_strides_3d(w),
        y_strides=_strides_3d(p.y),
        offsets=(p.x.offset, w.offset, p.y.offset),
    )


def static_taps(geo: ConvGeometry) -> ConvGeometry:
    """`geo` with the filter size as compile-time constants, for the GEMM kernels whose loop
    splits every step into a filter tap and a chunk of channels (conv_addressing.tap_and_chunk):
    the divisions by the filter size become multiplies. Networks use few filter sizes, so this
    adds few compilations."""
    return geo._replace(kernel=_constants(geo.kernel))


def static_phase_taps(phase: PhaseGeometry) -> PhaseGeometry:
    """A backward-data phase's tap counts as compile-time constants (see static_taps); as
    they are for a phase no tap reaches, whose GEMM has no steps (a constant count of 0
    would be a division by zero at compile time)."""
    if 0 in phase.taps:
        return phase
    return phase._replace(taps=_constants(phase.taps))


def _constants(values: tuple[int, ...]) -> tuple:
    return tuple(tl.constexpr(v) for v in values)


def data_phases(p: ConvProblem) -> list[PhaseGeometry]:
    """The stride phases of backward-data (see conv_addressing): one per combination of
    (input index + padding) mod stride over the spatial dims; a single phase at stride 1."""
    per_dim = []
    for size, kernel, s, pad, dil in zip(
        _to_3d(p.in_spatial, 1), _to_3d(p.kernel, 1), _to_3d(p.conv.stride, 1),
        _to_3d(p.conv.padding, 0), _to_3d(p.conv.dilation, 1), strict=True,
    ):  # fmt: skip
        options = []
        for q in range(s):
            first = (q - pad) % s
            count = max(0, -(-(size - first) // s))
            step = s // math.gcd(s, dil)
            reaching = [r for r in range(kernel) if (r * dil) % s == q]
            tap0 = reaching[0] if reaching else 0
            options.append(
                (first, count, tap0, step, len(range(tap0, kernel, step)) * bool(reaching))
            )
        per_dim.append(options)
    return [PhaseGeometry(*zip(*combo, strict=True)) for combo in itertools.product(*per_dim)]


def output_geometry(y: TensorDesc) -> ConvGeometry:
    """A geometry that describes only y (N, K, *S): for per-channel reductions over dy."""
    n, k = y.shape[:2]
    ones = (1, 1, 1)
    return ConvGeometry(
        n, 1, k, ones, _to_3d(y.shape[2:], 1), ones, ones, (0, 0, 0), ones,
        (0,) * 5, (0,) * 5, _strides_3d(y), (0, 0, y.offset),
    )  # fmt: skip


def before_hopper(device: str) -> bool:
    """Whether `device` is a CUDA GPU older than Hopper (compute capability 9), where the TMA
    paths do not run and the TF32 layouts below were not measured."""
    return device == "cuda" and torch.cuda.get_device_capability()[0] < 9


def strict_float32(p: ConvProblem) -> bool:
    """float32 data in strict float32 math mode (math="fp32"): IEEE products, no tensor-core
    TF32."""
    return p.dtype == torch.float32 and p.conv.math == "fp32"


def dot_precision(p: ConvProblem) -> str:
    """tl.dot input precision: TF32 only for float32 data in tf32 math mode."""
    return "tf32" if p.dtype == torch.float32 and p.conv.math == "tf32" else "ieee"


def brgemm_precision(p: ConvProblem) -> str:
    """The batch-reduce GEMM's PRECISION for `p` (kernels/brgemm.py): dot_precision(p), but
    "bf16x3" for weight gradients in tf32 math mode on Hopper (and in the interpreter) when x
    or dy has its channels innermost. The reduced dimension (pixels) is then not innermost,
    and Hopper's TF32 products read such operands only through 4-byte copies into shared
    memory; the three bfloat16 products read them as stored, and are more exact."""
    if p.direction != Direction.BACKWARD_FILTER or dot_precision(p) != "tf32":
        return dot_precision(p)
    if before_hopper(p.device):
        return "tf32"
    if p.x.strides[1] != 1 and p.y.strides[1] != 1:  # pixels innermost: TF32 reads them
        return "tf32"
    return "bf16x3"


@functools.cache
def multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def share_programs(tiles: Sequence[int], tile_costs: Sequence[int], programs: int) -> list[int]:
    """Persistent programs for launches that run side by side, each filling at most the
    multiprocessors it is given: launch i has tiles[i] tiles of tile_costs[i] each. One
    program at a time goes to the launch that would finish last, so that they finish
    together; a launch never gets more programs than tiles. (Each taking every
    multiprocessor, launches that hold one program a multiprocessor would run one after
    another, each with a partial last wave.)"""
    shares = [1] * len(tiles)
    if not tiles:
        return shares

    def finish(i: int) -> int:
        return -(-tiles[i] // shares[i]) * tile_costs[i]

    for _ in range(programs - len(tiles)):
        last = max(range(len(tiles)), key=finish)
        if shares[last] == tiles[last]:  # it cannot finish sooner
            break
        shares[last] += 1
    return shares


@functools.cache
def _shared_memory_bytes(device_index: int) -> int:
    # Triton's own figure: the limit its launcher checks a compiled kernel against.
    from triton.runtime import driver

    return driver.active.utils.get_device_properties(device_index)["max_shared_mem"]


def shared_memory_bytes(device: str) -> int:
    """Shared memory one program may take on the current GPU (the opt-in limit, as Triton
    reads it: 227 KiB on Hopper, 163 KiB on an A100)."""
    assert device == "cuda", device
    return _shared_memory_bytes(torch.cuda.current_device())


@functools.cache
def device_memory_bytes(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).total_memory


def parallel_slots(device: str) -> int:
    """How many tiles the device runs at once, roughly; fixed on the CPU so tests are stable."""
    if device == "cuda":
        return 2 * multiprocessor_count(torch.cuda.current_device())
    return 8
