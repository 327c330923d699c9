"""Shared setup and helpers for the tests.

The kernels run in Triton's interpreter on the CPU: TRITON_INTERPRET must be set before triton
(and so rtdnn) is first imported, which is why it is the first thing this file does. The GPU
test modules (test_*_gpu.py) need compiled kernels instead: run them on a GPU machine with
RTDNN_GPU_TESTS=1, which leaves the interpreter off (see README).
"""

import os

GPU_RUN = os.environ.get("RTDNN_GPU_TESTS") == "1"
if not GPU_RUN:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# No test reads or writes the user's tuning database, nor do the processes tests start;
# each test gets a fresh one in memory (see fresh_tuning_database).
os.environ["RTDNN_TUNING_DB"] = "off"

import dataclasses  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

import rtdnn  # noqa: E402
from rtdnn import reference, select  # noqa: E402
from rtdnn.algos import norm as engine  # noqa: E402
from rtdnn.core import INTERPRETED  # noqa: E402


def gpu_only(*extra) -> list:
    """The marks of a GPU test module (test_*_gpu.py), then `extra`: skipped without a CUDA
    device and when kernels are interpreted, by rtdnn (TRITON_INTERPRET=1 when this file
    imported it, which it sets unless RTDNN_GPU_TESTS=1) or as a CPU test module imported
    earlier asked (TRITON_INTERPRET=1 now). Call it at the module's import."""
    interpreted = INTERPRETED or os.environ.get("TRITON_INTERPRET") == "1"
    return [
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        pytest.mark.skipif(
            interpreted, reason="kernels are interpreted: run with RTDNN_GPU_TESTS=1, see README"
        ),
        pytest.mark.gpu,
        *extra,
    ]


#: The mark of the TMA kernels' GPU modules: a GPU of the Hopper generation or later.
NEEDS_TMA = pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 9,
    reason="TMA needs compute capability 9 or more",
)

# Relative error (||out - ref|| / ||ref||, see reference.rel_error) allowed per storage dtype,
# against a float64 reference computed from the very same (already rounded) inputs.
#   float32 with math="fp32": strict IEEE float32 products and accumulation.
#   float16: float32 accumulation; the error is dominated by rounding the result to float16
#            (2**-11 relative per element).
#   bfloat16: float32 accumulation, result rounded to bfloat16 (2**-8). Not in DTYPES, to keep
#            interpreter runs short: test_bf16_cpu.py covers it (the interpreter's bf16 tl.dot
#            is wrong, so the GEMM kernel upcasts its tiles there).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}

#: Every test dtype, and the math mode that goes with it.
DTYPES = (torch.float32, torch.float16)
MATH = "fp32"

LAYOUTS = ("contiguous", "channels_last", "strided")


# In CI, property tests draw the same examples on every run, so a result never depends on luck;
# locally they explore new examples each time.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")


def pytest_configure(config):
    if not INTERPRETED and not GPU_RUN:
        raise pytest.UsageError(
            "rtdnn was imported before TRITON_INTERPRET=1 was set: the CPU tests cannot run"
        )


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE[dtype]


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None):
    """out matches the float64 reference within the dtype's tolerance (NaN never matches)."""
    dtype = out.dtype if dtype is None else dtype
    assert tuple(out.shape) == tuple(ref.shape), (tuple(out.shape), tuple(ref.shape))
    err = reference.rel_error(out, ref)
    assert err <= tolerance(dtype), f"relative error {err:.3e} > {tolerance(dtype):.0e}"


# -- tensors in a given memory layout -----------------------------------------------------


def _strided_base_shape(shape) -> list[int]:
    """A bigger tensor that `strided` views: one extra channel, every other element of the
    last dim. The view has a non-zero storage offset and no unit stride."""
    return [shape[0], shape[1] + 1, *shape[2:-1], 2 * shape[-1]]


def _strided_view(base: torch.Tensor) -> torch.Tensor:
    return base[:, 1:, ..., ::2]


def empty_in_layout(shape, dtype, layout: str, fill: float = math.nan) -> torch.Tensor:
    """A tensor of `shape` in `layout` whose every storage element (gaps included) is `fill`."""
    shape = list(shape)
    if layout == "contiguous":
        return torch.full(shape, fill, dtype=dtype)
    if layout == "channels_last":
        physical = [shape[0], *shape[2:], shape[1]]
        return torch.full(physical, fill, dtype=dtype).movedim(-1, 1)
    if layout == "strided":
        return _strided_view(torch.full(_strided_base_shape(shape), fill, dtype=dtype))
    raise ValueError(layout)


def make_tensor(shape, dtype, layout: str = "contiguous", generator=None) -> torch.Tensor:
    """Standard-normal values (rounded to `dtype`) in `layout`:

    contiguous     plain row-major
    channels_last  channel dim innermost (movedim(1, -1).contiguous().movedim(-1, 1))
    strided        a view of every other element of a bigger tensor, offset by one channel;
                   the elements between are NaN, so reading them poisons the result
    """
    values = torch.randn(list(shape), generator=generator, dtype=torch.float32).to(dtype)
    if layout == "contiguous":
        return values.contiguous()
    if layout == "channels_last":
        return values.movedim(1, -1).contiguous().movedim(-1, 1)
    t = empty_in_layout(shape, dtype, layout)
    t.copy_(values)
    return t


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor with t's shape, strides and dtype, all of whose storage is NaN.

    Pass it as `out` with beta == 0: any element the op fails to write stays NaN.
    """
    if any(s < 0 for s in t.stride()):
        raise ValueError("negative strides are not supported here")
    size = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return torch.full((size,), math.nan, dtype=t.dtype).as_strided(t.shape, t.stride())


def poisoned(shape, dtype, layout: str = "contiguous") -> torch.Tensor:
    """NaN everywhere, in `layout`."""
    return empty_in_layout(shape, dtype, layout)


def whole_storage(t: torch.Tensor) -> torch.Tensor:
    """Every element of t's storage as a 1-D tensor (gaps of a strided view included)."""
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())


def assert_gaps_untouched(out: torch.Tensor) -> None:
    """The storage around a strided `out` was NaN and must still be: only the view is written."""
    storage = whole_storage(out)
    gaps = storage.numel() - out.numel()
    assert int(torch.isnan(out).sum()) == 0, "NaN left in the output"
    assert int(torch.isnan(storage).sum()) == gaps, "an element outside the view was written"


def is_channels_last(t: torch.Tensor) -> bool:
    """The channel dim is innermost in memory (size-1 dims do not count)."""
    return t.movedim(1, -1).is_contiguous()


def assert_layout_follows(result: torch.Tensor, source: torch.Tensor, layout: str) -> None:
    """A freshly allocated result keeps `source`'s memory format: channels-last in,
    channels-last out; anything else gives a contiguous result.

    A channels-last tensor whose channel dim or whose every spatial dim has size 1 (so that
    torch's .contiguous() left it as it was) is also plain contiguous: either result is right.
    """
    if layout == "channels_last" and not source.is_contiguous():
        assert is_channels_last(result), f"channels-last lost: strides {result.stride()}"
    elif layout == "channels_last":
        assert is_channels_last(result) or result.is_contiguous(), result.stride()
    else:
        assert result.is_contiguous(), f"expected contiguous, got strides {result.stride()}"


# -- convolution arithmetic ----------------------------------------------------------------


def out_size(in_size, kernel, stride, padding, dilation) -> tuple[int, ...]:
    return tuple(
        (i + 2 * p - d * (r - 1) - 1) // s + 1
        for i, r, s, p, d in zip(in_size, kernel, stride, padding, dilation, strict=True)
    )


def conv_reference(direction: str, x, w, dy, bias=None, **kw) -> torch.Tensor:
    """The float64 reference of one convolution direction ("forward", "backward_data" or
    "backward_filter") of x (N, C, ...), w (K, C / groups, ...) and dy (N, K, ...); bias
    applies to forward only; kw: the convolution parameters, alpha, beta and out."""
    if direction == "forward":
        return reference.conv_forward(x, w, bias, **kw)
    if direction == "backward_data":
        return reference.conv_backward_data(dy, w, x.shape, **kw)
    return reference.conv_backward_filter(x, dy, w.shape, **kw)


def run_conv_direction(
    direction: str, x, w, dy, *, algo: str, dtype: torch.dtype, tol: float | None = None,
    math: str = "fp32", layout: str = "contiguous", alpha=1.0, beta=0.0, bias=None, gen=None,
    **conv,
) -> torch.Tensor:  # fmt: skip
    """One convolution direction with `algo`, written into an `out` in `layout` (NaN-poisoned
    when beta == 0, random otherwise), checked against the float64 reference: the result is
    `out`, its relative error at most `tol` (the dtype's TOLERANCE when None), and a strided
    `out` leaves the storage around the view untouched. Returns the result."""
    shape = {"forward": dy.shape, "backward_data": x.shape, "backward_filter": w.shape}[direction]
    out = poisoned(shape, dtype, layout) if beta == 0 else make_tensor(shape, dtype, layout, gen)
    prior = out.clone()
    kw = dict(algo=algo, math=math, alpha=alpha, beta=beta, out=out, **conv)
    if direction == "forward":
        result = rtdnn.conv_forward(x, w, bias, **kw)
    elif direction == "backward_data":
        result = rtdnn.conv_backward_data(dy, w, x.shape, **kw)
    else:
        result = rtdnn.conv_backward_filter(x, dy, w.shape, **kw)
    assert result is out
    ref = conv_reference(direction, x, w, dy, bias, alpha=alpha, beta=beta, out=prior, **conv)
    tol = tolerance(dtype) if tol is None else tol
    err = reference.rel_error(result, ref)
    assert err <= tol, f"{algo} {direction}: relative error {err:.2e} > {tol:.0e}"
    if layout == "strided":
        assert_gaps_untouched(out)
    return result


@pytest.fixture(autouse=True)
def fresh_tuning_database(monkeypatch):
    """Every test starts with an empty tuning database in memory and no measured results, so
    that what one test measures never decides what another runs."""
    monkeypatch.setenv("RTDNN_TUNING_DB", "off")
    select.database.use(None)
    select.forget()
    yield
    select.database.use(None)
    select.forget()


@pytest.fixture
def gen():
    """A seeded generator, so each test sees the same data on every run."""
    return torch.Generator().manual_seed(1234)


__all__ = [
    "DTYPES",
    "LAYOUTS",
    "MATH",
    "TOLERANCE",
    "assert_close",
    "assert_gaps_untouched",
    "assert_layout_follows",
    "conv_reference",
    "empty_in_layout",
    "is_channels_last",
    "make_tensor",
    "out_size",
    "poisoned",
    "poisoned_like",
    "rtdnn",
    "run_conv_direction",
    "tolerance",
    "whole_storage",
]


@pytest.fixture
def tma_launches(monkeypatch) -> list[int]:
    """Records the splits of each TMA GEMM launch (kernels/gemm_tma.py), in order. The path is
    turned on under the interpreter (on a GPU it runs on Hopper and later), and the tile tuner
    and the shipped tile choices off, so that its tiles, the first candidates, run and the
    tuner's trials are not counted."""
    from rtdnn.algos import tiles
    from rtdnn.kernels import launch

    monkeypatch.setattr(tiles, "TMA_GEMM_IN_INTERPRETER", True)
    monkeypatch.setenv("RTDNN_AUTOTUNE", "0")
    monkeypatch.setattr(tiles, "_shipped", None)  # the first candidates, not shipped choices
    splits: list[int] = []
    call = launch.TmaGemmLaunch.__call__

    def recorded(self, *args, **kwargs):
        splits.append(self.splits)
        return call(self, *args, **kwargs)

    monkeypatch.setattr(launch.TmaGemmLaunch, "__call__", recorded)
    return splits


@pytest.fixture
def norm_tile_policy(monkeypatch):
    """Change the normalization engine's CPU tile policy for one test, so that tiny inputs take
    a chosen path; prepared launches are forgotten around it."""

    def use(**changes):
        monkeypatch.setattr(engine, "CPU_POLICY", dataclasses.replace(engine.CPU_POLICY, **changes))
        engine.clear_plans()

    yield use
    engine.clear_plans()
