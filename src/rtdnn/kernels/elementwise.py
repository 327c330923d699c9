"""One elementwise kernel for every map-like primitive: activations, dropout, op_tensor,
add/scale/set/transform tensor.

    OUT[e] = alpha * OP(A[e], B[e], C[e], u(e), p0, p1, p2, seed) + beta * OUT[e]

`OP` is a @triton.jit function passed as a compile-time constant. Each operand has its own
strides (0 for a broadcast dim), so layouts may differ between operands.

u(e) (only when RNG is on, for dropout) is a uniform [0, 1) float keyed by the seed and the
element's logical (row-major) index e: Philox4x32-10 run on counter e // 4, output e % 4. One
Philox call yields four numbers; the kernel uses all four on four neighbouring elements
(RNG_GROUPED), which is what keeps dropout memory-bound rather than integer-ALU-bound, and
falls back to one call per element (same numbers) when neighbours in the tile are not logical
neighbours.

Addressing. The host (`plan`) drops size-1 dims, orders the rest by the output's strides and
merges dims that are contiguous in every operand, so equal dense layouts (NCHW with NCHW,
channels-last with channels-last) become one flat dim. What is left is at most six dims: two
tile dims t0, t1 and four outer dims. t1 is the output's innermost dim; t0 is the innermost dim
of an input that is not laid out like the output (a transpose, e.g. NCHW -> NHWC), else the
output's next dim. (With RNG the dims follow the logical order instead: t1 is the logical
innermost dim, and a channels-last operand makes t0 its channel dim.) A program owns one
[BLOCK_0, BLOCK_1] tile at one outer position, so the
only integer division is on scalars, and strides equal to 1 are compile-time constants (Triton
specializes them), which gives vectorized loads and stores along each operand's contiguous dim;
when the tiles divide the space exactly the kernel has no masks at all (EVEN). Offsets are
int32: callers make sure every operand spans fewer than 2**31 elements.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import triton
import triton.language as tl

from ..core import cdiv
from .launch import SlotLaunch
from .layout import merge_dims, next_pow2

MAX_DIMS = 6


class EwGeometry(NamedTuple):
    sizes: tuple  # (o0, o1, o2, o3, t0, t1)
    tiles: tuple  # (tiles over t0, tiles over t1)
    a: tuple  # strides of A in the order of `sizes`
    b: tuple
    c: tuple
    out: tuple
    index: tuple  # strides of the logical (row-major) index, for counter-based RNG


RNG_OFF = tl.constexpr(0)
RNG_PER_ELEMENT = tl.constexpr(1)
RNG_GROUPED = tl.constexpr(2)


@triton.jit
def _offsets(st, o0, o1, o2, o3, i0, i1):
    base = o0 * st[0] + o1 * st[1] + o2 * st[2] + o3 * st[3]
    return base + (i0 * st[4])[:, None] + (i1 * st[5])[None, :]


@triton.jit
def _uniform(seed, o0, o1, o2, o3, i0, j1, st, RNG: tl.constexpr, BLOCK_0: tl.constexpr,
             BLOCK_1: tl.constexpr):  # fmt: skip
    """u(e) for the tile: Philox4x32-10 output e % 4 of counter e // 4."""
    if RNG == RNG_GROUPED:
        # Logical index is contiguous along axis 1 and rows start at multiples of 4.
        row = o0 * st[0] + o1 * st[1] + o2 * st[2] + o3 * st[3] + i0 * st[4] + j1 * BLOCK_1
        ctr = (row // 4)[:, None] + tl.arange(0, BLOCK_1 // 4)[None, :]
        u0, u1, u2, u3 = tl.rand4x(seed, ctr)
        # tl.join appends a minor dim: join(join(u0, u2), join(u1, u3))[., k, j, i] = u_{2j+i},
        # which the reshape puts at position 4k + 2j + i: element e gets u_{e % 4}.
        u = tl.join(tl.join(u0, u2), tl.join(u1, u3))
        return tl.reshape(u, (BLOCK_0, BLOCK_1))
    else:
        i1 = j1 * BLOCK_1 + tl.arange(0, BLOCK_1)
        e = _offsets(st, o0, o1, o2, o3, i0, i1)
        u0, u1, u2, u3 = tl.rand4x(seed, e // 4)
        lane = e % 4
        return tl.where(lane == 0, u0, tl.where(lane == 1, u1, tl.where(lane == 2, u2, u3)))


@triton.jit
def elementwise_kernel(
    A, B, C, OUT, geo, alpha, beta, p0, p1, p2, seed,
    OP: tl.constexpr, NUM_IN: tl.constexpr, RNG: tl.constexpr, EVEN: tl.constexpr,
    BETA_NONZERO: tl.constexpr, BLOCK_0: tl.constexpr, BLOCK_1: tl.constexpr,
):  # fmt: skip
    """EVEN: the tiles cover the iteration space exactly, so no masks (always vectorizable)."""
    s0, s1, s2, s3, t0, t1 = geo.sizes
    tiles0, tiles1 = geo.tiles
    pid = tl.program_id(0)
    j1 = pid % tiles1
    rest = pid // tiles1
    j0 = rest % tiles0
    rest = rest // tiles0
    o3 = rest % s3
    rest = rest // s3
    o2 = rest % s2
    rest = rest // s2
    o1 = rest % s1
    o0 = rest // s1
    i0 = j0 * BLOCK_0 + tl.arange(0, BLOCK_0)
    i1 = j1 * BLOCK_1 + tl.arange(0, BLOCK_1)
    if EVEN:
        mask = None
    else:
        mask = (i0 < t0)[:, None] & (i1 < t1)[None, :]
    a = tl.zeros((BLOCK_0, BLOCK_1), dtype=tl.float32)
    b = a
    c = a
    if NUM_IN >= 1:
        a = tl.load(A + _offsets(geo.a, o0, o1, o2, o3, i0, i1), mask=mask).to(tl.float32)
    if NUM_IN >= 2:
        b = tl.load(B + _offsets(geo.b, o0, o1, o2, o3, i0, i1), mask=mask).to(tl.float32)
    if NUM_IN >= 3:
        c = tl.load(C + _offsets(geo.c, o0, o1, o2, o3, i0, i1), mask=mask).to(tl.float32)
    if RNG != RNG_OFF:
        u = _uniform(seed, o0, o1, o2, o3, i0, j1, geo.index, RNG, BLOCK_0, BLOCK_1)
    else:
        u = a
    v = alpha * OP(a, b, c, u, p0, p1, p2, seed)
    out_ptrs = OUT + _offsets(geo.out, o0, o1, o2, o3, i0, i1)
    if BETA_NONZERO:
        v += beta * tl.load(out_ptrs, mask=mask).to(tl.float32)
    tl.store(out_ptrs, v.to(OUT.dtype.element_ty), mask=mask)


# -- operations (OP) -----------------------------------------------------------------------


@triton.jit
def op_first(a, b, c, index, p0, p1, p2, seed):
    """A itself: copies, transforms, add_tensor (alpha * A + beta * OUT), scale_tensor."""
    return a


@triton.jit
def op_fill(a, b, c, index, p0, p1, p2, seed):
    return a * 0.0 + p0


# -- planning (host side) --------------------------------------------------------------------


def row_major_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for s in reversed(tuple(shape)):
        strides.append(step)
        step *= s
    return tuple(reversed(strides))


class EwPlan(NamedTuple):
    geo: EwGeometry
    grid: tuple
    block_0: int
    block_1: int
    num_warps: int
    even: bool  # tiles cover the space exactly: no masks
    rng: int  # RNG_OFF, RNG_PER_ELEMENT or RNG_GROUPED


@functools.lru_cache(maxsize=4096)
def plan(
    shape: tuple, out_strides: tuple, in_strides: tuple, *, index: bool = False, elem_bytes: int = 4
) -> EwPlan | None:
    """Tile the iteration space; None if more than MAX_DIMS dims remain after merging.

    in_strides: a tuple of the strides of each loaded input (up to three; broadcast dims have
    stride 0). Cached: every step of a training loop asks for the same plans.
    index: the op draws random numbers keyed by the logical index (dropout). The iteration
    order then follows the logical order, so t1 is the logical innermost dim and groups of
    four logical neighbours share one Philox call; a channels-last input becomes a transposed
    tile (t0 = channels), which keeps its loads contiguous.
    """
    shape = tuple(int(s) for s in shape)
    nd = len(shape)
    ins = [tuple(s) for s in in_strides]
    idx = row_major_strides(shape)
    if index:
        order = list(range(nd))
    else:  # outermost first by the output's strides; ties (size-1 dims) keep logical order
        order = sorted(range(nd), key=lambda d: (-abs(out_strides[d]), d))
    lists = [tuple(out_strides), *ins] + ([idx] if index else [])
    sizes, merged = merge_dims(order, shape, lists)
    if not sizes:
        sizes, merged = [1], [[0] for _ in lists]
    if len(sizes) > MAX_DIMS:
        return None
    n = len(sizes)
    t1 = n - 1
    t0 = None
    # The output (or, with index, an input) whose innermost dim is not t1: tile over both
    # (a transpose, e.g. NCHW -> NHWC), so that both sides are read or written contiguously.
    candidates = merged[: 1 + len(ins)] if index else merged[1 : 1 + len(ins)]
    for st in candidates:
        cand = [d for d in range(n) if st[d] != 0]
        if not cand:
            continue
        inner = min(cand, key=lambda d: abs(st[d]))
        if inner != t1 and (st[t1] == 0 or abs(st[inner]) < abs(st[t1])):
            t0 = inner
            break
    transpose = t0 is not None
    if t0 is None and n >= 2:
        t0 = n - 2
    outer = [d for d in range(n) if d not in (t0, t1)]
    # Per program: 32 bytes per thread per operand at 8 warps (16-byte vectors, 2 per thread).
    total = 8 * 32 * max(1, 32 // elem_bytes)
    size1 = sizes[t1]
    size0 = sizes[t0] if t0 is not None else 1
    if transpose:
        block_1 = min(next_pow2(size1), 64)
    else:
        block_1 = min(next_pow2(size1), total)
    block_0 = min(next_pow2(size0), max(1, total // block_1))
    pad = 4 - len(outer)
    full_sizes = (1,) * pad + tuple(sizes[d] for d in outer) + (size0, size1)

    def arrange(st):
        inner = (st[t0] if t0 is not None else 0, st[t1])
        return (0,) * pad + tuple(st[d] for d in outer) + inner

    arranged = [arrange(st) for st in merged]
    zero = (0,) * MAX_DIMS
    out_st = arranged[0]
    in_st = arranged[1 : 1 + len(ins)] + [zero] * (3 - len(ins))
    idx_st = arranged[-1] if index else zero
    tiles = (cdiv(size0, block_0), cdiv(size1, block_1))
    geo = EwGeometry(full_sizes, tiles, in_st[0], in_st[1], in_st[2], out_st, idx_st)
    programs = tiles[0] * tiles[1]
    for s in full_sizes[:4]:
        programs *= s
    warps = max(1, min(8, block_0 * block_1 // 256))
    even = size1 % block_1 == 0 and size0 % block_0 == 0
    rng = RNG_OFF.value
    if index:
        grouped = idx_st[5] == 1 and size1 % 4 == 0 and block_1 % 4 == 0
        rng = RNG_GROUPED.value if grouped else RNG_PER_ELEMENT.value
    return EwPlan(geo, (programs,), block_0, block_1, warps, even, rng)


def launch(
    op, out, inputs: list, plan_: EwPlan, *, alpha=1.0, beta=0.0, p=(0.0, 0.0, 0.0), seed=0
):  # fmt: skip
    """Run elementwise_kernel with a plan made for these tensors' shapes and strides."""
    prepared_launch(op, plan_, len(inputs), beta != 0)(out, inputs, alpha, beta, p, seed)


def prepared_launch(op, plan_: EwPlan, num_in: int, beta_nonzero: bool):
    """launch's kernel for one plan, prepared once: run(out, inputs, alpha, beta, p, seed)
    with num_in inputs, beta != 0 exactly when beta_nonzero."""
    launch = _prepared(op, plan_, num_in, beta_nonzero)

    def run(out, inputs, alpha=1.0, beta=0.0, p=(0.0, 0.0, 0.0), seed=0) -> None:
        a, b, c = (*inputs, out, out, out)[:3]
        launch(
            a, b, c, out, float(alpha), float(beta), float(p[0]), float(p[1]), float(p[2]),
            int(seed),
        )  # fmt: skip

    return run


@functools.lru_cache(maxsize=4096)
def _prepared(op, plan_: EwPlan, num_in: int, beta_nonzero: bool) -> SlotLaunch:
    return SlotLaunch(
        elementwise_kernel, plan_.grid, dict(num_warps=plan_.num_warps),
        ("A", "B", "C", "OUT", "alpha", "beta", "p0", "p1", "p2", "seed"),
        geo=plan_.geo, OP=op, NUM_IN=num_in, RNG=plan_.rng, EVEN=plan_.even,
        BETA_NONZERO=beta_nonzero, BLOCK_0=plan_.block_0, BLOCK_1=plan_.block_1,
    )  # fmt: skip
