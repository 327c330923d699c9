"""Property tests: random small convolutions in every direction against the float64 reference.

Each example draws the geometry (1 to 3 spatial dims, groups including depthwise, kernel,
stride, padding larger than the kernel, dilation, mode), the memory layout of every operand,
the dtype, alpha/beta and the algorithm. Shapes stay tiny because the kernels run in Triton's
interpreter, whose cost grows with (programs x reduction steps); `assume` drops the few draws
that would be too slow.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from conftest import (
    DTYPES,
    LAYOUTS,
    MATH,
    assert_close,
    assert_gaps_untouched,
    assert_layout_follows,
    make_tensor,
    out_size,
    poisoned,
)
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import rtdnn
from rtdnn import reference

# Examples per direction; RTDNN_PROPERTY_SCALE=10 runs ten times more (a longer bug hunt).
SCALE = float(os.environ.get("RTDNN_PROPERTY_SCALE", "1"))


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


MAX_IN = {1: 12, 2: 7, 3: 4}  # largest input size per spatial dim
MAX_COST = 48  # interpreter work budget per call, in (program x reduction step) units


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Case:
    n: int
    c: int
    k: int
    groups: int
    in_size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    mode: str

    @property
    def out_size(self) -> tuple[int, ...]:
        return out_size(self.in_size, self.kernel, self.stride, self.padding, self.dilation)

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (self.n, self.c, *self.in_size)

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.k, self.c // self.groups, *self.kernel)

    @property
    def y_shape(self) -> tuple[int, ...]:
        return (self.n, self.k, *self.out_size)

    def cost(self, direction: str) -> int:
        """Rough interpreter work with the 32x32x16 CPU tile, for every direction."""
        g, cg, kg = self.groups, self.c // self.groups, self.k // self.groups
        taps = math.prod(self.kernel)
        out_px = self.n * math.prod(self.out_size)
        in_px = self.n * math.prod(self.in_size)
        if direction == "forward":
            return g * _cdiv(out_px, 32) * _cdiv(kg, 32) * taps * _cdiv(cg, 16)
        if direction == "backward_data":
            return g * _cdiv(in_px, 32) * _cdiv(cg, 32) * taps * _cdiv(kg, 16)
        return g * taps * _cdiv(kg, 32) * _cdiv(cg, 32) * _cdiv(out_px, 16)

    def kwargs(self) -> dict:
        """The convolution parameters, as an int where every dim agrees (both forms are API)."""

        def arg(t):
            return t[0] if len(set(t)) == 1 else list(t)

        return dict(
            stride=arg(self.stride),
            padding=arg(self.padding),
            dilation=arg(self.dilation),
            groups=self.groups,
            mode=self.mode,
        )


@st.composite
def cases(draw, direction: str) -> Case:
    nd = draw(st.sampled_from([1, 2, 3]))
    c = draw(st.integers(1, 6))
    groups = draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
    k = groups * draw(st.integers(1, 6 // groups))
    dims = st.lists
    in_size = tuple(draw(dims(st.integers(1, MAX_IN[nd]), min_size=nd, max_size=nd)))
    kernel = tuple(draw(dims(st.integers(1, 3), min_size=nd, max_size=nd)))
    stride = tuple(draw(dims(st.integers(1, 3), min_size=nd, max_size=nd)))
    padding = tuple(draw(dims(st.integers(0, 3), min_size=nd, max_size=nd)))
    dilation = tuple(draw(dims(st.integers(1, 2), min_size=nd, max_size=nd)))
    case = Case(
        n=draw(st.integers(1, 2)),
        c=c,
        k=k,
        groups=groups,
        in_size=in_size,
        kernel=kernel,
        stride=stride,
        padding=padding,
        dilation=dilation,
        mode=draw(st.sampled_from(["cross_correlation", "convolution"])),
    )
    assume(all(o >= 1 for o in case.out_size))
    assume(case.cost(direction) <= MAX_COST)
    return case


@dataclass(frozen=True)
class Run:
    dtype: torch.dtype
    layouts: tuple[str, str, str]  # (first input, second input, output)
    alpha: float
    beta: float
    pass_out: bool
    algo: str
    seed: int


def runs(algos: list[str]) -> st.SearchStrategy[Run]:
    layout = st.sampled_from(LAYOUTS)

    @st.composite
    def build(draw) -> Run:
        beta = draw(st.sampled_from([0.0, 0.0, 1.0, -0.75]))
        return Run(
            dtype=draw(st.sampled_from(DTYPES)),
            layouts=(draw(layout), draw(layout), draw(layout)),
            alpha=draw(st.sampled_from([1.0, 0.5, -2.0])),
            beta=beta,
            pass_out=beta != 0 or draw(st.booleans()),
            algo=draw(st.sampled_from(algos)),
            seed=draw(st.integers(0, 2**31 - 1)),
        )

    return build()


def _out_arg(run: Run, shape, gen) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(out to pass, a copy of its prior values). beta == 0: NaN-poisoned; else random."""
    if not run.pass_out:
        return None, None
    if run.beta == 0:
        out = poisoned(shape, run.dtype, run.layouts[2])
    else:
        out = make_tensor(shape, run.dtype, run.layouts[2], gen)
    return out, out.clone()


def _check_result(result, out, ref, run: Run, layout_source, source_layout: str) -> None:
    assert result.dtype == run.dtype
    assert_close(result, ref, run.dtype)
    if out is not None:
        assert result is out, "out was given: it must be written in place and returned"
        assert_gaps_untouched(out)
    else:
        assert_layout_follows(result, layout_source, source_layout)


COMMON = dict(deadline=None)


@settings(max_examples=examples(25), **COMMON)
@given(
    case=cases("forward"),
    run=runs(["IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "auto"]),
    bias=st.booleans(),
)
def test_forward_matches_reference(case: Case, run: Run, bias: bool):
    gen = torch.Generator().manual_seed(run.seed)
    x = make_tensor(case.x_shape, run.dtype, run.layouts[0], gen)
    w = make_tensor(case.w_shape, run.dtype, run.layouts[1], gen)
    b = make_tensor((case.k,), run.dtype, "contiguous", gen) if bias else None
    out, prior = _out_arg(run, case.y_shape, gen)
    x0, w0 = x.clone(), w.clone()

    y = rtdnn.conv_forward(
        x, w, b, **case.kwargs(), alpha=run.alpha, beta=run.beta, out=out, algo=run.algo,
        math=MATH,
    )  # fmt: skip

    ref = reference.conv_forward(
        x, w, b, **case.kwargs(), alpha=run.alpha, beta=run.beta, out=prior
    )
    _check_result(y, out, ref, run, x, run.layouts[0])
    assert torch.equal(x, x0) and torch.equal(w, w0), "an input was modified"


@settings(max_examples=examples(25), **COMMON)
@given(
    case=cases("backward_data"),
    run=runs(["IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "auto"]),
)
def test_backward_data_matches_reference(case: Case, run: Run):
    gen = torch.Generator().manual_seed(run.seed)
    dy = make_tensor(case.y_shape, run.dtype, run.layouts[0], gen)
    w = make_tensor(case.w_shape, run.dtype, run.layouts[1], gen)
    out, prior = _out_arg(run, case.x_shape, gen)
    dy0, w0 = dy.clone(), w.clone()

    dx = rtdnn.conv_backward_data(
        dy, w, case.x_shape, **case.kwargs(), alpha=run.alpha, beta=run.beta, out=out,
        algo=run.algo, math=MATH,
    )  # fmt: skip

    ref = reference.conv_backward_data(
        dy, w, case.x_shape, **case.kwargs(), alpha=run.alpha, beta=run.beta, out=prior
    )
    _check_result(dx, out, ref, run, dy, run.layouts[0])
    assert torch.equal(dy, dy0) and torch.equal(w, w0), "an input was modified"


@settings(max_examples=examples(25), **COMMON)
@given(
    case=cases("backward_filter"),
    run=runs(["IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "IMPLICIT_GEMM_SPLIT_K", "auto"]),
)
def test_backward_filter_matches_reference(case: Case, run: Run):
    gen = torch.Generator().manual_seed(run.seed)
    x = make_tensor(case.x_shape, run.dtype, run.layouts[0], gen)
    dy = make_tensor(case.y_shape, run.dtype, run.layouts[1], gen)
    out, prior = _out_arg(run, case.w_shape, gen)
    x0, dy0 = x.clone(), dy.clone()

    dw = rtdnn.conv_backward_filter(
        x, dy, case.w_shape, **case.kwargs(), alpha=run.alpha, beta=run.beta, out=out,
        algo=run.algo, math=MATH,
    )  # fmt: skip

    ref = reference.conv_backward_filter(
        x, dy, case.w_shape, **case.kwargs(), alpha=run.alpha, beta=run.beta, out=prior
    )
    _check_result(dw, out, ref, run, x, run.layouts[0])
    assert torch.equal(x, x0) and torch.equal(dy, dy0), "an input was modified"
