"""rtdnn.convert on small ResNet-style and MLP models built here: outputs, gradients,
state_dict round trips, train/eval state, the report."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_close

import rtdnn
from rtdnn.bench.model import ResidualBlock


def small_resnet(classes: int = 5) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        ResidualBlock(8),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Dropout(0.0),
        torch.nn.Linear(8, classes),
    )


def _grads(model):
    return [p.grad.detach() for p in model.parameters()]


def _check_same(model, converted, x, t, train: bool):
    model.train(train)
    converted.train(train)
    with torch.backends.cudnn.flags(allow_tf32=False):
        out_ref = model(x)
        out = converted(x)
        torch.nn.functional.cross_entropy(out_ref, t).backward()
        torch.nn.functional.cross_entropy(out, t).backward()
    assert_close(out, out_ref.detach().double())
    for g, g_ref in zip(_grads(converted), _grads(model), strict=True):
        assert_close(g, g_ref.double())


def test_resnet_block_outputs_and_gradients_train_and_eval():
    torch.manual_seed(0)
    model = small_resnet()
    converted, report = rtdnn.convert(model)
    assert converted is not model
    assert type(model[0]) is torch.nn.Conv2d  # the original is untouched
    replaced = report.counts()
    assert replaced["Conv2d"] == 3 and replaced["BatchNorm2d"] == 3 and replaced["Linear"] == 1
    assert all(path != "6" for path, _ in report.replaced)  # Flatten has no twin
    assert any(name == "Flatten" for _, name, _ in report.kept)
    x, t = torch.randn(2, 3, 12, 12), torch.tensor([1, 3])
    _check_same(model, converted, x, t, train=True)
    # running statistics moved identically
    for a, b in zip(model.buffers(), converted.buffers(), strict=True):
        if a.is_floating_point():
            assert_close(b, a.double())
        else:
            assert torch.equal(a, b)  # num_batches_tracked
    for m in (model, converted):
        m.zero_grad()
    _check_same(model, converted, x, t, train=False)


def test_state_dict_round_trip_and_inplace():
    torch.manual_seed(1)
    model = small_resnet()
    converted, _ = rtdnn.convert(model)
    assert converted.state_dict().keys() == model.state_dict().keys()
    fresh = small_resnet()
    fresh.load_state_dict(converted.state_dict())
    back, _ = rtdnn.convert(small_resnet())
    back.load_state_dict(model.state_dict())
    for a, b in zip(fresh.state_dict().values(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    same = copy.deepcopy(model)
    result, report = rtdnn.convert(same, inplace=True)
    assert result is same and type(same[0]).__module__.startswith("rtdnn")
    assert "replaced" in str(report)


def test_mlp_channels_last_and_subclass_left_alone():
    class MyLinear(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    torch.manual_seed(2)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
        MyLinear(16, 4), torch.nn.LogSoftmax(dim=-1),
    )  # fmt: skip
    converted, report = rtdnn.convert(model)
    assert type(converted[4]) is MyLinear
    assert ("4", "MyLinear", "subclass of a supported module") in report.kept
    x = torch.randn(5, 6)
    with torch.backends.cudnn.flags(allow_tf32=False):
        assert_close(converted(x), model(x).detach().double())
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).eval()
    converted_conv, _ = rtdnn.convert(conv)
    x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    with torch.backends.cudnn.flags(allow_tf32=False):
        y = converted_conv(x)
        assert_close(y, conv(x).detach().double())
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_compiled_converted_model():
    torch.manual_seed(3)
    model = small_resnet().eval()
    converted, _ = rtdnn.convert(model)
    x = torch.randn(1, 3, 8, 8)
    with torch.backends.cudnn.flags(allow_tf32=False):
        out = torch.compile(converted, fullgraph=True, backend="eager")(x)
        assert_close(out, model(x).detach().double())


def test_traced_ops_become_inductor_fallbacks_with_the_default_stride_constraint():
    """Once a trace has met an rtdnn op with Inductor loaded, every rtdnn op has a fallback
    lowering with the stride constraint Inductor gives custom ops by default (eager strides or
    their order, by torch version), so Inductor never takes its implicit-fallback road (whose
    log line, in torch 2.11, formats each argument's whole IR history)."""
    from torch._inductor import lowering
    from torch._library.utils import get_layout_constraint_tag

    from rtdnn.autograd._custom_op import OP_NAMES

    conv = rtdnn.nn.Conv2d(3, 4, 3)
    x = torch.randn(1, 3, 6, 6)
    torch.compile(conv, fullgraph=True, backend="aot_eager")(x)
    assert len(OP_NAMES) >= 40 and "rtdnn::rnn_backward" in OP_NAMES
    for name in OP_NAMES:
        packet = getattr(torch.ops.rtdnn, name.removeprefix("rtdnn::"))
        for overload in packet.overloads():
            op = getattr(packet, overload)
            assert op in lowering.lowerings, name
            tag = get_layout_constraint_tag(op, with_default=True)
            constraint = lowering.tag_to_layout_constraint(tag)
            assert constraint is not None and lowering._maybe_layout_constraints[op] is constraint


@pytest.mark.slow
def test_inductor_compiles_a_converted_residual_network(monkeypatch):
    """torch.compile's default backend (Inductor) on a converted network with a residual
    branch: one graph, the same output as eager, and Inductor never takes its own road for an
    rtdnn op (its implicit fallback, whose log line torch 2.11 formats from each argument's
    whole IR history): rtdnn registers its ops during this compilation, state reset first."""
    from torch._inductor import config, graph, lowering

    from rtdnn.autograd import _custom_op

    monkeypatch.setattr(_custom_op, "_lowered", set())
    for table in (lowering.lowerings, lowering._maybe_layout_constraints):
        for op in [op for op in table if str(op).startswith("rtdnn.")]:
            monkeypatch.delitem(table, op)
    implicit = []
    real = graph.make_fallback
    monkeypatch.setattr(
        graph, "make_fallback", lambda op, *a, **k: implicit.append(str(op)) or real(op, *a, **k)
    )
    torch.manual_seed(5)
    model = small_resnet().eval()
    converted, _ = rtdnn.convert(model, fuse=True)
    x = torch.randn(1, 3, 8, 8).to(memory_format=torch.channels_last)
    # Caches off: Inductor lowers the graph rather than loading what an earlier run stored.
    no_cache = torch._functorch.config.patch(enable_autograd_cache=False)
    with torch.no_grad(), config.patch(fx_graph_cache=False), no_cache:
        out = torch.compile(converted, fullgraph=True)(x)
        assert_close(out, converted(x).double())
    assert _custom_op._lowered == set(_custom_op.OP_NAMES)
    assert not [op for op in implicit if op.startswith("rtdnn.")]


@pytest.mark.slow
def test_inductor_trains_a_converted_network_like_eager():
    """A training step of a converted residual network compiled by Inductor: the parameters'
    gradients and the batch norms' running statistics match the eager step's."""
    torch.manual_seed(6)
    converted, _ = rtdnn.convert(small_resnet(), fuse=True)
    twin = copy.deepcopy(converted)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    target = torch.randint(0, 5, (2,))
    for net in (converted, torch.compile(twin, fullgraph=True)):
        torch.nn.functional.cross_entropy(net(x), target).backward()
    for a, b in zip(converted.parameters(), twin.parameters(), strict=True):
        assert_close(b.grad, a.grad.double())
    for a, b in zip(converted.buffers(), twin.buffers(), strict=True):
        if a.dtype.is_floating_point:
            assert_close(b, a.double())


def test_autocast_casts_conv_and_linear_inputs():
    """Under torch.autocast the converted convolutions and linear layers compute in the autocast
    dtype (float16 here: the interpreter's bfloat16 matmul is wrong), like torch's own."""
    torch.manual_seed(4)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(36, 2)
    )
    converted, _ = rtdnn.convert(model)
    x = torch.randn(2, 3, 5, 5)
    with torch.autocast("cpu", dtype=torch.float16):
        y = converted(x)
        y_ref = model[2](model[1](model[0](x).to(torch.float16).float()).to(torch.float16).float())
    assert y.dtype == torch.float16
    assert_close(y, y_ref.detach().double(), torch.float16)
