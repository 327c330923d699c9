"""Determinism: `deterministic=True` (or torch.use_deterministic_algorithms(True) when it is
None) keeps algo="auto" away from algorithms that are not deterministic, measured ones
included, and refuses to run one by name.

Every shipped algorithm is deterministic, so a stand-in that is not (the implicit GEMM under
another name and flag) is registered for the duration of each test."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import MATH, assert_close, make_tensor

import rtdnn
from rtdnn import reference, select
from rtdnn.algos import ALGORITHMS
from rtdnn.algos.implicit_gemm import ImplicitGemm
from rtdnn.ops import conv as conv_ops

STAND_IN = "NONDETERMINISTIC_STAND_IN"
DIRECTIONS = ["forward", "backward_data", "backward_filter"]


class NonDeterministic(ImplicitGemm):
    """The implicit GEMM, claiming results that may differ from run to run; counts its runs."""

    name = STAND_IN

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def deterministic(self, p) -> bool:
        return False

    def runner(self, p, t, workspace):
        inner = super().runner(p, t, workspace)

        def counted(*args):
            self.runs += 1
            inner(*args)

        return counted


@pytest.fixture
def stand_in(monkeypatch) -> NonDeterministic:
    """The stand-in registered, with measurements and prepared calls kept apart from other
    tests (both may name it)."""
    a = NonDeterministic()
    monkeypatch.setitem(ALGORITHMS, STAND_IN, a)
    monkeypatch.setattr(select, "_measured", {})
    monkeypatch.setattr(conv_ops, "_prepared", {})
    return a


@pytest.fixture
def torch_deterministic():
    """torch.use_deterministic_algorithms(True) for the test, restored afterwards."""
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before, warn_only=warn_only)


def _stand_in_fastest(monkeypatch, a: NonDeterministic) -> None:
    """Find's timer, replaced: every algorithm still runs, the stand-in measures fastest."""

    def fake_time_ms(fn, device):
        before = a.runs
        fn()
        return 0.5 if a.runs > before else 2.0

    monkeypatch.setattr(select, "_time_ms", fake_time_ms)


def _operands(direction, gen):
    """(x, w, call(**kw) running `direction` with those kw, its float64 reference)."""
    x = make_tensor((1, 2, 4, 4), torch.float32, generator=gen)
    w = make_tensor((3, 2, 2, 2), torch.float32, generator=gen)
    dy = make_tensor((1, 3, 3, 3), torch.float32, generator=gen)
    if direction == "forward":
        return x, w, lambda **kw: rtdnn.conv_forward(x, w, **kw), reference.conv_forward(x, w)
    if direction == "backward_data":
        call = lambda **kw: rtdnn.conv_backward_data(dy, w, x.shape, **kw)
        return x, w, call, reference.conv_backward_data(dy, w, x.shape)
    call = lambda **kw: rtdnn.conv_backward_filter(x, dy, w.shape, **kw)
    return x, w, call, reference.conv_backward_filter(x, dy, w.shape)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_auto_never_chooses_a_measured_non_deterministic_algorithm(
    direction, gen, monkeypatch, stand_in
):
    x, w, call, ref = _operands(direction, gen)
    _stand_in_fastest(monkeypatch, stand_in)
    results = rtdnn.find_conv_algorithms(x, w, direction=direction, math=MATH)
    assert results[0].algo == STAND_IN and results[0].deterministic is False, results
    assert all(r.deterministic for r in results[1:]), results

    get = lambda **kw: rtdnn.get_conv_algorithm(x, w, direction=direction, math=MATH, **kw)
    assert get(deterministic=False) == STAND_IN
    chosen = get(deterministic=True)
    assert chosen != STAND_IN and chosen in {r.algo for r in results}

    runs = stand_in.runs
    assert_close(call(math=MATH, deterministic=True), ref)
    assert stand_in.runs == runs, "auto ran the non-deterministic algorithm"
    assert_close(call(math=MATH, deterministic=False), ref)
    assert stand_in.runs == runs + 1, "auto did not run the measured fastest"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_auto_follows_torch_use_deterministic_algorithms(
    direction, gen, monkeypatch, stand_in, torch_deterministic
):
    x, w, call, ref = _operands(direction, gen)
    _stand_in_fastest(monkeypatch, stand_in)
    rtdnn.find_conv_algorithms(x, w, direction=direction, math=MATH, deterministic=False)
    assert rtdnn.get_conv_algorithm(x, w, direction=direction, math=MATH) != STAND_IN
    runs = stand_in.runs
    assert_close(call(math=MATH), ref)
    assert stand_in.runs == runs
    # An explicit False overrides PyTorch's setting.
    assert_close(call(math=MATH, deterministic=False), ref)
    assert stand_in.runs == runs + 1


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_forcing_a_non_deterministic_algorithm_is_refused(direction, gen, stand_in):
    x, w, call, ref = _operands(direction, gen)
    out = torch.full(ref.shape, math.nan)
    with pytest.raises(rtdnn.BadParamError) as e:
        call(algo=STAND_IN, math=MATH, deterministic=True, out=out)
    for word in ("algo", STAND_IN, "deterministic"):
        assert word in str(e.value), str(e.value)
    assert out.isnan().all(), "written although refused"
    assert stand_in.runs == 0
    # Without the request it runs, and is right.
    assert_close(call(algo=STAND_IN, math=MATH, deterministic=False), ref)
    assert stand_in.runs == 1


def test_forcing_under_torch_use_deterministic_algorithms_is_refused(
    gen, stand_in, torch_deterministic
):
    x, w, call, ref = _operands("forward", gen)
    with pytest.raises(rtdnn.BadParamError, match="algo"):
        call(algo=STAND_IN, math=MATH)
    assert stand_in.runs == 0
    assert_close(call(algo=STAND_IN, math=MATH, deterministic=False), ref)


def test_find_when_deterministic_lists_only_deterministic_algorithms(gen, monkeypatch, stand_in):
    """Every algorithm is still measured (the results serve later calls that allow the
    others); only those auto may choose are listed."""
    x, w, _, _ = _operands("forward", gen)
    _stand_in_fastest(monkeypatch, stand_in)
    results = rtdnn.find_conv_algorithms(x, w, math=MATH, deterministic=True)
    assert stand_in.runs == 1, "the stand-in was not measured"
    assert STAND_IN not in {r.algo for r in results}, results
    assert results and all(r.status == "ok" and r.deterministic for r in results), results
    assert rtdnn.get_conv_algorithm(x, w, math=MATH, deterministic=True) == results[0].algo
    assert rtdnn.get_conv_algorithm(x, w, math=MATH, deterministic=False) == STAND_IN


def test_autograd_and_modules_follow_torch_use_deterministic_algorithms(
    gen, monkeypatch, stand_in, torch_deterministic
):
    """The forward problem of a Conv2d measured with the stand-in fastest: the module (and
    the differentiable function, whose backward runs too) still avoid it."""
    x = make_tensor((1, 2, 4, 4), torch.float32, generator=gen)
    m = rtdnn.nn.Conv2d(2, 3, 2, bias=False)
    w = m.weight.detach()
    _stand_in_fastest(monkeypatch, stand_in)
    rtdnn.find_conv_algorithms(x, w, deterministic=False)  # math as the module's: the default
    assert rtdnn.get_conv_algorithm(x, w, deterministic=False) == STAND_IN
    runs = stand_in.runs
    m(x.requires_grad_()).sum().backward()
    y = rtdnn.conv_forward(x, m.weight)
    y.sum().backward()
    assert stand_in.runs == runs
    with pytest.raises(rtdnn.BadParamError, match="algo"):
        rtdnn.conv_forward(x, m.weight, algo=STAND_IN)
    y = rtdnn.conv_forward(x, m.weight, algo=STAND_IN, deterministic=False)
    assert stand_in.runs == runs + 1
    assert_close(y.detach(), reference.conv_forward(x.detach(), w))


@pytest.mark.parametrize("bad", ["yes", 1, 0.0])
@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w, d: rtdnn.conv_forward(x, w, deterministic=d),
        lambda x, w, d: rtdnn.conv_backward_data(x, w, (1, 2, 5, 5), deterministic=d),
        lambda x, w, d: rtdnn.get_conv_algorithm(x, w, deterministic=d),
        lambda x, w, d: rtdnn.find_conv_algorithms(x, w, deterministic=d),
    ],
    ids=["conv_forward", "conv_backward_data", "get_conv_algorithm", "find_conv_algorithms"],
)
def test_deterministic_must_be_a_bool_or_none(fn, bad):
    x, w = torch.randn(1, 2, 4, 4), torch.randn(2, 2, 2, 2)
    with pytest.raises(rtdnn.BadParamError, match="deterministic"):
        fn(x, w, bad)


def test_micro_batch_plans_skip_non_deterministic_algorithms(gen, monkeypatch, stand_in):
    """A plan of micro-batches under deterministic=True uses no algorithm that is not
    deterministic, though it measured fastest at every size."""
    from rtdnn.algos import supported_algorithms
    from rtdnn.ops import conv_plan
    from rtdnn.select import AlgoPerf

    def find(p, tensors, refresh=False):
        return sorted(
            (AlgoPerf(a.name, 1.0 if a.name == STAND_IN else 5.0, a.workspace_bytes(p),
                      a.deterministic(p)) for a in supported_algorithms(p)),
            key=lambda r: r.time_ms,
        )  # fmt: skip

    monkeypatch.setattr(select, "find", find)
    monkeypatch.setattr(conv_plan, "_plans", {})
    x = make_tensor((3, 2, 4, 4), torch.float32, generator=gen)
    w = make_tensor((3, 2, 2, 2), torch.float32, generator=gen)
    plan = lambda **kw: rtdnn.plan_conv(x, w, math=MATH, policy="powerOfTwo", **kw)
    assert {a for _, a in plan(deterministic=False).micro_batches} == {STAND_IN}
    assert STAND_IN not in {a for _, a in plan(deterministic=True).micro_batches}
    runs = stand_in.runs
    y = rtdnn.conv_forward(x, w, math=MATH, micro_batch="powerOfTwo", deterministic=True)
    assert stand_in.runs == runs
    assert_close(y, reference.conv_forward(x, w))
    rtdnn.conv_forward(x, w, math=MATH, micro_batch="powerOfTwo", deterministic=False)
    assert stand_in.runs > runs
