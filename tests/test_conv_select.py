"""Algorithm selection: get_conv_algorithm (heuristic, preference, workspace limit) and
find_conv_algorithms (runs every supported algorithm), and algo="auto" afterwards."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import MATH, assert_close, make_tensor
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import rtdnn
from rtdnn import reference, select
from rtdnn.algos import ALGORITHMS
from rtdnn.core import (
    ConvDesc,
    ConvProblem,
    Direction,
    TensorDesc,
    conv_output_shape,
    empty_like_layout,
)

DIRECTIONS = ["forward", "backward_data", "backward_filter"]
SUPPORTED = {
    "forward": {
        "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "IMPLICIT_GEMM_SPLIT_K", "DIRECT",
    },
    "backward_data": {
        "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "IMPLICIT_GEMM_SPLIT_K", "DIRECT",
    },
    "backward_filter": {
        "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "IMPLICIT_GEMM_SPLIT_K", "DIRECT",
    },
}  # fmt: skip
# find's problem below has stride 1 and dilation 1, which the FFT algorithms support too.
FFT_ALGOS = {"FFT", "FFT_TILING"}


def problem(direction: str, x, w, *, stride=1, padding=0, dilation=1, groups=1) -> ConvProblem:
    """The ConvProblem that get/find describe for x and w in `direction`."""
    conv = ConvDesc.create(
        x.dim() - 2, stride, padding, dilation, groups, "cross_correlation", MATH
    )
    y = empty_like_layout(conv_output_shape(x.shape, w.shape, conv), x)
    return ConvProblem.create(
        Direction(direction), TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), conv, "cpu"
    )


def workspace(name: str, p: ConvProblem) -> int:
    return ALGORITHMS[name].workspace_bytes(p)


# get_conv_algorithm runs nothing, so its problems may be large (the tensors are never read).
@st.composite
def geometries(draw):
    nd = draw(st.integers(1, 3))
    groups = draw(st.sampled_from([1, 2, 4]))
    c = groups * draw(st.integers(1, 8))
    k = groups * draw(st.integers(1, 8))
    size = st.integers(1, {1: 4096, 2: 64, 3: 16}[nd])
    in_size = [draw(size) for _ in range(nd)]
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    stride = draw(st.integers(1, 2))
    padding = draw(st.integers(0, 2))
    assume(
        all((i + 2 * padding - r) // stride + 1 >= 1 for i, r in zip(in_size, kernel, strict=True))
    )
    x = torch.empty(draw(st.integers(1, 4)), c, *in_size)
    w = torch.empty(k, c // groups, *kernel)
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    return x.to(dtype), w.to(dtype), dict(stride=stride, padding=padding, groups=groups)


@settings(max_examples=60, deadline=None)
@given(geo=geometries(), direction=st.sampled_from(DIRECTIONS), frac=st.floats(0, 0.999))
def test_get_respects_workspace_limit_below_gemm(geo, direction, frac):
    x, w, conv = geo
    p = problem(direction, x, w, **conv)
    need = workspace("GEMM", p)
    limit = int(need * frac)
    assume(limit < need)
    name = rtdnn.get_conv_algorithm(
        x, w, direction=direction, math=MATH, workspace_limit=limit, **conv
    )
    assert name != "GEMM"
    assert workspace(name, p) <= limit
    assert ALGORITHMS[name].supports(p) is None


@settings(max_examples=40, deadline=None)
@given(geo=geometries(), direction=st.sampled_from(DIRECTIONS))
def test_get_no_workspace_preference(geo, direction):
    x, w, conv = geo
    p = problem(direction, x, w, **conv)
    name = rtdnn.get_conv_algorithm(
        x, w, direction=direction, math=MATH, preference="no_workspace", **conv
    )
    assert workspace(name, p) == 0
    assert ALGORITHMS[name].supports(p) is None


def test_get_prefers_split_k_when_it_splits_but_not_without_workspace():
    """4096 output pixels: split-K's heuristic pick needs a workspace; no_workspace and a
    zero limit must fall back to an algorithm without one. (16 channels: too many per group
    for DIRECT.)"""
    x, w = torch.empty(2, 16, 2048), torch.empty(16, 16, 1)
    p = problem("backward_filter", x, w)
    assert workspace("IMPLICIT_GEMM_SPLIT_K", p) > 0
    get = lambda **kw: rtdnn.get_conv_algorithm(x, w, direction="backward_filter", **kw)
    assert get() == "IMPLICIT_GEMM_SPLIT_K"
    assert get(preference="no_workspace") == "IMPLICIT_GEMM"
    assert get(workspace_limit=0) == "IMPLICIT_GEMM"
    assert get(workspace_limit=workspace("IMPLICIT_GEMM_SPLIT_K", p)) == "IMPLICIT_GEMM_SPLIT_K"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_get_returns_a_supported_algorithm(direction):
    x, w = torch.empty(1, 4, 6, 6), torch.empty(8, 2, 3, 3)
    name = rtdnn.get_conv_algorithm(x, w, direction=direction, groups=2)
    assert name in SUPPORTED[direction]


# -- find -----------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_find_runs_every_supported_algorithm(direction, gen):
    conv = dict(stride=1, padding=1, groups=2)
    x = make_tensor((1, 4, 4, 3), torch.float32, generator=gen)
    w = make_tensor((4, 2, 2, 2), torch.float32, generator=gen)
    x0, w0 = x.clone(), w.clone()
    p = problem(direction, x, w, **conv)

    results = rtdnn.find_conv_algorithms(x, w, direction=direction, math=MATH, **conv)

    assert {r.algo for r in results} == SUPPORTED[direction] | FFT_ALGOS
    assert len(results) == len(SUPPORTED[direction] | FFT_ALGOS)
    for r in results:
        assert isinstance(r, rtdnn.AlgoPerf)
        assert r.status == "ok", r
        assert math.isfinite(r.time_ms) and r.time_ms > 0, r
        assert r.workspace_bytes == workspace(r.algo, p), r
        assert isinstance(r.deterministic, bool)
    times = [r.time_ms for r in results]
    assert times == sorted(times), "not fastest first"
    assert torch.equal(x, x0) and torch.equal(w, w0), "find modified the caller's tensors"

    # Measured times take precedence over the heuristic...
    assert rtdnn.get_conv_algorithm(x, w, direction=direction, math=MATH, **conv) == (
        results[0].algo
    )
    # ...but never over the workspace limit.
    limit = workspace("GEMM", p) - 1
    limited = rtdnn.get_conv_algorithm(
        x, w, direction=direction, math=MATH, workspace_limit=limit, **conv
    )
    assert limited != "GEMM" and workspace(limited, p) <= limit
    assert (
        workspace(
            rtdnn.get_conv_algorithm(
                x, w, direction=direction, math=MATH, preference="no_workspace", **conv
            ),
            p,
        )
        == 0
    )

    # algo="auto" now runs the measured choice, and computes the right thing.
    y_shape = tuple(p.y.shape)
    if direction == "forward":
        out = rtdnn.conv_forward(x, w, algo="auto", math=MATH, **conv)
        expected = reference.conv_forward(x, w, **conv)
    elif direction == "backward_data":
        dy = make_tensor(y_shape, torch.float32, generator=gen)
        out = rtdnn.conv_backward_data(dy, w, x.shape, algo="auto", math=MATH, **conv)
        expected = reference.conv_backward_data(dy, w, x.shape, **conv)
    else:
        dy = make_tensor(y_shape, torch.float32, generator=gen)
        out = rtdnn.conv_backward_filter(x, dy, w.shape, algo="auto", math=MATH, **conv)
        expected = reference.conv_backward_filter(x, dy, w.shape, **conv)
    assert_close(out, expected)


def test_auto_with_workspace_limit_runs_and_is_correct(gen):
    x = make_tensor((1, 3, 5, 5), torch.float32, generator=gen)
    w = make_tensor((2, 3, 3, 3), torch.float32, generator=gen)
    for limit in (0, workspace("GEMM", problem("forward", x, w)) - 1):
        y = rtdnn.conv_forward(x, w, algo="auto", workspace_limit=limit, math=MATH)
        assert_close(y, reference.conv_forward(x, w))


def test_named_algorithm_with_enough_workspace(gen):
    """algo="GEMM" with a limit of exactly its need is accepted."""
    x = make_tensor((1, 3, 5, 5), torch.float32, generator=gen)
    w = make_tensor((2, 3, 3, 3), torch.float32, generator=gen)
    need = workspace("GEMM", problem("forward", x, w))
    y = rtdnn.conv_forward(x, w, algo="GEMM", workspace_limit=need, math=MATH)
    assert_close(y, reference.conv_forward(x, w))


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_measured_gemm_still_obeys_workspace_limit(direction, gen, monkeypatch):
    """Make find measure GEMM as the fastest (a fake timer that still runs every algorithm):
    get then returns GEMM, except under a limit below GEMM's workspace or no_workspace."""
    monkeypatch.setattr(select, "_measured", {})  # keep other tests' measurements apart
    x = make_tensor((1, 2, 3, 3), torch.float32, generator=gen)
    w = make_tensor((2, 2, 2, 2), torch.float32, generator=gen)
    p = problem(direction, x, w)
    order = iter([a.name for a in ALGORITHMS.values() if a.supports(p) is None])

    def fake_time_ms(fn, device):
        fn()
        return 0.5 if next(order) == "GEMM" else 2.0

    monkeypatch.setattr(select, "_time_ms", fake_time_ms)
    results = rtdnn.find_conv_algorithms(x, w, direction=direction, math=MATH)
    assert results[0].algo == "GEMM" and results[0].time_ms == 0.5, results

    get = lambda **kw: rtdnn.get_conv_algorithm(x, w, direction=direction, math=MATH, **kw)
    need = workspace("GEMM", p)
    assert get() == "GEMM"
    assert get(workspace_limit=need) == "GEMM"
    below = get(workspace_limit=need - 1)
    assert below != "GEMM" and workspace(below, p) <= need - 1
    assert workspace(get(preference="no_workspace"), p) == 0

    # algo="auto" under the same limit runs (without GEMM) and is right.
    if direction == "forward":
        y = rtdnn.conv_forward(x, w, algo="auto", workspace_limit=need - 1, math=MATH)
        assert_close(y, reference.conv_forward(x, w))


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_gemm_refuses_a_column_matrix_past_32_bit_offsets(direction):
    """GEMM's column matrix (output pixels x taps x channels) can pass 2**31 - 1 elements
    where x does not (an 11x11 stride-4 stem at batch 2048): its 32-bit offsets would wrap, so
    it says so, and selection passes it over; half the batch fits."""
    x = torch.zeros(1, 1, 1, 1).expand(2048, 3, 227, 227)  # never read
    w = torch.zeros(96, 3, 11, 11)
    p = problem(direction, x, w, stride=4)
    reason = ALGORITHMS["GEMM"].supports(p)
    assert reason is not None and "column matrix" in reason and "2**31 - 1" in reason
    assert select.choose(p).name != "GEMM"
    assert ALGORITHMS["GEMM"].supports(problem(direction, x[:1024], w, stride=4)) is None


def test_heuristic_picks_gemm_for_backward_data_of_few_channels_on_a_gpu(monkeypatch):
    """Backward-data of an RGB stem or a 1-channel layer on a GPU runs as GEMM, within the
    workspace limit and 1/32 of the device's memory; forward, wider layers, grouped ones, a
    larger workspace and the CPU keep the implicit GEMM."""
    from dataclasses import replace

    from rtdnn.algos import gemm, geometry, implicit_gemm

    # No GPU here: nothing stored to ask the database for; an H100's 132 multiprocessors and
    # 80 GB.
    monkeypatch.setattr(select, "_known", lambda p: [])
    for module in (geometry, implicit_gemm):
        monkeypatch.setattr(module, "parallel_slots", lambda device: 264)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(gemm, "device_memory_bytes", lambda index: 80 << 30)
    gpu = lambda direction, x, w, **conv: replace(problem(direction, x, w, **conv), device="cuda")  # noqa: E731
    stem = torch.empty(64, 3, 224, 224), torch.empty(64, 3, 7, 7)
    p = gpu("backward_data", *stem, stride=2, padding=3)
    assert select.choose(p).name == "GEMM"
    need = workspace("GEMM", p)
    assert select.choose(p, workspace_limit=need - 1).name != "GEMM"
    assert select.choose(p, "no_workspace").name == "IMPLICIT_GEMM"
    one_channel = gpu(
        "backward_data", torch.empty(32, 1, 161, 700), torch.empty(32, 1, 5, 20), stride=2
    )
    assert select.choose(one_channel).name == "GEMM"
    others = [
        gpu("forward", *stem, stride=2, padding=3),
        gpu("backward_data", torch.empty(8, 16, 56, 56), torch.empty(32, 16, 3, 3), padding=1),
        gpu("backward_data", torch.empty(8, 8, 56, 56), torch.empty(32, 2, 3, 3), groups=4),
        problem("backward_data", *stem, stride=2, padding=3),  # the CPU
    ]
    for q in others:
        assert select.choose(q).name != "GEMM", q
    # AlexNet's stem at batch 256: 1.05 GiB of workspace, within 1/32 of 80 GB, not of 16 GB.
    alexnet = gpu(
        "backward_data", torch.empty(256, 3, 227, 227), torch.empty(96, 3, 11, 11), stride=4
    )
    assert select.choose(alexnet).name == "GEMM"
    monkeypatch.setattr(gemm, "device_memory_bytes", lambda index: 16 << 30)
    assert select.choose(alexnet).name != "GEMM"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_auto_runs_without_workspace_when_its_choice_cannot_be_allocated(
    direction, gen, monkeypatch
):
    """auto picks GEMM (measured fastest); its workspace cannot be allocated: the call runs
    the algorithm that needs none and is right, and so do a call that fails at the same time
    and later calls of the signature. A forced GEMM fails as asked, naming the allocation."""
    from rtdnn.core import AllocFailedError
    from rtdnn.ops import conv as conv_ops

    monkeypatch.setattr(select, "_measured", {})
    monkeypatch.setattr(conv_ops, "_prepared", {})
    x = make_tensor((2, 3, 5, 6), torch.float32, generator=gen)
    w = make_tensor((4, 3, 3, 3), torch.float32, generator=gen)
    dy = make_tensor((2, 4, 3, 4), torch.float32, generator=gen)
    p = problem(direction, x, w)
    gemm = ALGORITHMS["GEMM"]
    select._measured[p] = [select.AlgoPerf("GEMM", 0.5, gemm.workspace_bytes(p), True)]
    assert rtdnn.get_conv_algorithm(x, w, direction=direction, math=MATH) == "GEMM"

    refused, inner = [], []

    def no_memory(nbytes, device):
        if nbytes:
            refused.append(nbytes)
            if len(refused) == 1:
                # Another thread's call of the signature, failing while this one fails: both
                # must run the fallback.
                inner.append(run(algo="auto"))
            raise AllocFailedError(f"workspace of {nbytes} bytes could not be allocated")
        return None

    monkeypatch.setattr(conv_ops, "stream_workspace", no_memory)
    run = {
        "forward": lambda **kw: rtdnn.conv_forward(x, w, math=MATH, **kw),
        "backward_data": lambda **kw: rtdnn.conv_backward_data(dy, w, x.shape, math=MATH, **kw),
        "backward_filter": lambda **kw: rtdnn.conv_backward_filter(x, dy, w.shape, math=MATH, **kw),
    }[direction]
    ref = {
        "forward": lambda: reference.conv_forward(x, w),
        "backward_data": lambda: reference.conv_backward_data(dy, w, x.shape),
        "backward_filter": lambda: reference.conv_backward_filter(x, dy, w.shape),
    }[direction]()
    for _ in range(2):
        assert_close(run(algo="auto"), ref)
    assert_close(inner[0], ref)
    # Asked by the two overlapping calls; later calls of the signature ran without asking.
    assert refused == [gemm.workspace_bytes(p)] * 2
    with pytest.raises(AllocFailedError, match="could not be allocated"):
        run(algo="GEMM")


def test_gemm_preferred_bound_scales_with_device_memory(monkeypatch):
    """Few-channel backward-data prefers GEMM on a GPU while its workspace is within 1/32 of
    the device's memory (AlexNet's stem at batch 256 needs 1.05 GiB: taken on an 80 GB
    device, not on a 16 GB one)."""
    from rtdnn.algos import gemm

    x = torch.empty(256, 3, 227, 227, device="meta")
    w = torch.empty(64, 3, 11, 11, device="meta")
    conv = ConvDesc.create(2, 4, 2, 1, 1, "cross_correlation", MATH)
    y = empty_like_layout(conv_output_shape(x.shape, w.shape, conv), x)
    descs = (TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y))
    p = ConvProblem.create(Direction.BACKWARD_DATA, *descs, conv, "cuda")
    needed = gemm.Gemm().workspace_bytes(p)
    assert 1 << 30 < needed < 2 << 30
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for memory, preferred in ((80 << 30, True), (16 << 30, False)):
        monkeypatch.setattr(gemm, "device_memory_bytes", lambda index, m=memory: m)
        assert gemm.gemm_preferred(p) is preferred
    cpu = ConvProblem.create(Direction.BACKWARD_DATA, *descs, conv, "cpu")
    assert not gemm.gemm_preferred(cpu)


@pytest.mark.parametrize(
    "c,k,size,kernel,stride,channels_last,capability,preferred",
    [
        (512, 512, 7, 3, 1, True, (9, 0), True),  # ResNet-50 l4.x.conv2: 3136 pixels
        (1024, 2048, 14, 1, 2, True, (9, 0), True),  # l4.0.down, a 1x1 stride-2 projection
        (256, 256, 14, 3, 1, True, (9, 0), False),  # 256 output channels: the implicit GEMM
        (256, 512, 56, 1, 2, True, (9, 0), False),  # a projection at 50176 pixels
        (512, 512, 28, 3, 1, True, (9, 0), True),  # VGG-16's 3x3 at 50176 pixels
        (1024, 512, 14, 1, 1, True, (9, 0), False),  # 1x1 stride 1: already on the TMA GEMM
        (512, 512, 7, 3, 1, False, (9, 0), False),  # NCHW: no TMA GEMM for its product
        (512, 512, 7, 3, 1, True, (8, 0), False),  # before Hopper: no TMA GEMM
    ],
)
def test_gemm_preferred_for_late_filter_gradients(
    monkeypatch, c, k, size, kernel, stride, channels_last, capability, preferred
):
    """Backward-filter of late layers (many output channels, few pixels) prefers GEMM where
    the TMA GEMM takes its column matrix's product (algos.gemm.PREFER_BACKWARD_FILTER_FROM_K);
    forward never does."""
    from rtdnn.algos import gemm, geometry

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.empty(64, c, size, size, device="meta", dtype=torch.bfloat16, memory_format=fmt)
    w = torch.empty(k, c, kernel, kernel, device="meta", dtype=torch.bfloat16)
    w = w.contiguous(memory_format=fmt)
    conv = ConvDesc.create(2, stride, kernel // 2, 1, 1, "cross_correlation", MATH)
    y = empty_like_layout(conv_output_shape(x.shape, w.shape, conv), x)
    descs = (TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: capability)
    monkeypatch.setattr(gemm, "device_memory_bytes", lambda index: 80 << 30)
    monkeypatch.setattr(geometry, "multiprocessor_count", lambda index: 132)
    p = ConvProblem.create(Direction.BACKWARD_FILTER, *descs, conv, "cuda")
    assert gemm.gemm_preferred(p) is preferred
    forward = ConvProblem.create(Direction.FORWARD, *descs, conv, "cuda")
    assert not gemm.gemm_preferred(forward)


def _strict_problem(direction, x_shape, w_shape, padding, device="cuda", math_mode="fp32"):
    x = torch.empty(x_shape, device="meta")
    w = torch.empty(w_shape, device="meta")
    conv = ConvDesc.create(len(x_shape) - 2, 1, padding, 1, 1, "cross_correlation", math_mode)
    y = empty_like_layout(conv_output_shape(x.shape, w.shape, conv), x)
    descs = (TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y))
    return ConvProblem.create(direction, *descs, conv, device)


def test_fft_preferred_for_large_filters_in_strict_float32(monkeypatch):
    """Large filters in strict float32 try the FFT algorithms first, the plan with fewer
    spectrum values first (algos.fft.fft_preferred); small filters, TF32 and the CPU do not,
    and a whole-image FFT above the workspace bound is left out."""
    from rtdnn.algos import fft, geometry

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fft, "device_memory_bytes", lambda index: 80 << 30)
    monkeypatch.setattr(geometry, "multiprocessor_count", lambda index: 132)
    forward = Direction.FORWARD
    long_1d = _strict_problem(forward, (32, 128, 2048), (128, 128, 63), 31)
    image_2d = _strict_problem(forward, (32, 64, 56, 56), (64, 64, 9, 9), 4)
    assert fft.fft_preferred(long_1d) == ["FFT_TILING", "FFT"]
    assert fft.fft_preferred(image_2d) == ["FFT", "FFT_TILING"]
    small = _strict_problem(forward, (32, 64, 56, 56), (64, 64, 5, 5), 2)
    tf32 = _strict_problem(forward, (32, 64, 56, 56), (64, 64, 9, 9), 4, math_mode="tf32")
    cpu = _strict_problem(forward, (32, 64, 56, 56), (64, 64, 9, 9), 4, device="cpu")
    for p in (small, tf32, cpu):
        assert fft.fft_preferred(p) == []
    backward_filter = _strict_problem(Direction.BACKWARD_FILTER, (32, 64, 4096), (64, 64, 127), 63)
    assert select._heuristic_order(backward_filter)[:2] == ["FFT_TILING", "FFT"]
    # 196 MiB of workspace for the whole image: above the bound on a 4 GiB device.
    monkeypatch.setattr(fft, "device_memory_bytes", lambda index: 4 << 30)
    assert fft.fft_preferred(image_2d) == ["FFT_TILING"]


def test_direct_preferred_for_strict_float32_stem_filter_gradient():
    """In strict float32 on a GPU the weight gradient of an RGB stem tries DIRECT first
    (algos.direct.PREFER_FILTER_GRADIENT_UP_TO_C); TF32, the other directions, wider layers
    and the CPU do not."""
    from rtdnn.algos import direct

    stem = (64, 3, 224, 224), (64, 3, 7, 7), 3
    assert direct.direct_preferred(_strict_problem(Direction.BACKWARD_FILTER, *stem))
    others = [
        _strict_problem(Direction.BACKWARD_FILTER, *stem, math_mode="tf32"),
        _strict_problem(Direction.FORWARD, *stem),
        _strict_problem(Direction.BACKWARD_FILTER, *stem, device="cpu"),
        _strict_problem(Direction.BACKWARD_FILTER, (64, 16, 56, 56), (64, 16, 3, 3), 1),
    ]
    for p in others:
        assert not direct.direct_preferred(p)
