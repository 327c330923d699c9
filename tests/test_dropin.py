"""Drop-in parity with torch.nn: unbatched inputs where torch takes them, empty batches (empty
results, zero parameter gradients, no kernel launch) through the functional API, the modules
and autograd, float64 kept in torch by rtdnn.convert, the error types torch raises, what the
functional API takes that the modules take (padding="same", 1-D softmax), and training under
DistributedDataParallel (two gloo processes)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton.runtime.interpreter
import triton.runtime.jit
from conftest import assert_close, poisoned

import rtdnn


def convert(module: nn.Module) -> nn.Module:
    converted, report = rtdnn.convert(module)
    assert not any(reason != "no rtdnn implementation" for _, _, reason in report.kept)
    return converted


@pytest.fixture
def no_launch(monkeypatch):
    """Fail the test if any Triton kernel is launched (interpreted or compiled)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr(triton.runtime.interpreter.InterpretedFunction, "run", refuse)
    monkeypatch.setattr(triton.runtime.jit.JITFunction, "run", refuse)


def _params(m: nn.Module) -> list[torch.Tensor]:
    return [p for p in m.parameters() if p.requires_grad]


def _compare_with_torch(module: nn.Module, x: torch.Tensor, *, exact_zero_grads=False):
    """The converted module matches torch's in float64 on x: output and every gradient."""
    ref = copy.deepcopy(module).double()
    ours = convert(module)
    x1 = x.clone().requires_grad_(True)
    x2 = x.double().requires_grad_(True)
    y, y_ref = ours(x1), ref(x2)
    assert y.shape == y_ref.shape
    g = torch.randn(y.shape)
    y.backward(g)
    y_ref.backward(g.double())
    if y.numel():
        assert_close(y, y_ref.detach())
        assert_close(x1.grad, x2.grad)
    else:
        assert x1.grad.shape == x.shape
    for p, p_ref in zip(_params(ours), _params(ref), strict=True):
        if exact_zero_grads:
            assert torch.equal(p.grad, torch.zeros_like(p)), "an empty batch gives zero grads"
        else:
            assert_close(p.grad, p_ref.grad)
    return y


# -- unbatched inputs ------------------------------------------------------------------------

UNBATCHED = {
    "Conv1d": (lambda: nn.Conv1d(3, 4, 3, padding=1), (3, 7)),
    "Conv2d": (lambda: nn.Conv2d(3, 4, 3, stride=2), (3, 7, 6)),
    "Conv2d_same": (lambda: nn.Conv2d(3, 4, (2, 3), padding="same"), (3, 5, 6)),
    "Conv3d": (lambda: nn.Conv3d(2, 3, 2), (2, 3, 4, 3)),
    "MaxPool1d": (lambda: nn.MaxPool1d(2), (3, 6)),
    "MaxPool2d": (lambda: nn.MaxPool2d(2, padding=1), (3, 5, 4)),
    "AvgPool2d": (lambda: nn.AvgPool2d(3, stride=2), (3, 7, 6)),
    "AvgPool3d": (lambda: nn.AvgPool3d(2), (2, 4, 4, 2)),
    "AdaptiveAvgPool2d": (lambda: nn.AdaptiveAvgPool2d((2, 3)), (3, 5, 7)),
    "Linear": (lambda: nn.Linear(5, 3), (5,)),
    "InstanceNorm1d": (lambda: nn.InstanceNorm1d(3, affine=True), (3, 6)),
    "LocalResponseNorm": (lambda: nn.LocalResponseNorm(3), (4, 5, 2)),
    "ReLU_0d": (lambda: nn.ReLU(), ()),
    "GELU_3d": (lambda: nn.GELU(), (2, 3, 4)),
    "Softmax_1d": (lambda: nn.Softmax(0), (6,)),
    "LogSoftmax_1d": (lambda: nn.LogSoftmax(-1), (6,)),
}


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("case", sorted(UNBATCHED))
def test_unbatched_input_as_torch(case):
    torch.manual_seed(0)
    make, shape = UNBATCHED[case]
    x = torch.randn(shape)
    if case == "ReLU_0d":
        x = x.abs()  # the gradient at a positive number, not at a sign chosen by the seed
    y = _compare_with_torch(make(), x)
    assert y.dim() == make()(x).dim()  # no batch dim added


def test_unbatched_cross_entropy():
    torch.manual_seed(0)
    x, t = torch.randn(5), torch.tensor(3)
    for reduction in ("mean", "sum", "none"):
        loss_fn = nn.CrossEntropyLoss(reduction=reduction, label_smoothing=0.1)
        x1, x2 = x.clone().requires_grad_(True), x.double().requires_grad_(True)
        ours, theirs = convert(loss_fn)(x1, t), loss_fn(x2, t)
        assert ours.shape == theirs.shape == ()
        ours.backward()
        theirs.backward()
        assert_close(ours, theirs.detach())
        assert_close(x1.grad, x2.grad)


# -- empty batches through the modules and autograd ------------------------------------------

EMPTY_MODULES = {
    "Conv1d": (lambda: nn.Conv1d(3, 4, 3), (0, 3, 5)),
    "Conv2d": (lambda: nn.Conv2d(3, 4, 3, padding=1), (0, 3, 5, 5)),
    "Conv3d": (lambda: nn.Conv3d(2, 3, 2), (0, 2, 3, 3, 3)),
    "Linear": (lambda: nn.Linear(3, 4), (0, 3)),
    "Linear_3d": (lambda: nn.Linear(3, 4), (2, 0, 3)),
    "BatchNorm2d": (lambda: nn.BatchNorm2d(3), (0, 3, 4, 4)),
    "GroupNorm": (lambda: nn.GroupNorm(1, 4), (0, 4, 3)),
    # (torch's own InstanceNorm with affine=True fails on an empty batch)
    "InstanceNorm2d": (lambda: nn.InstanceNorm2d(3), (0, 3, 4, 4)),
    "LayerNorm": (lambda: nn.LayerNorm(4), (0, 4)),
    "RMSNorm": (lambda: nn.RMSNorm(4), (2, 0, 4)),
    "MaxPool2d": (lambda: nn.MaxPool2d(2), (0, 3, 4, 4)),
    "AvgPool1d": (lambda: nn.AvgPool1d(2), (0, 3, 4)),
    "AdaptiveAvgPool2d": (lambda: nn.AdaptiveAvgPool2d(2), (0, 3, 4, 4)),
    "AdaptiveAvgPool2d_global": (lambda: nn.AdaptiveAvgPool2d(1), (0, 3, 4, 4)),
    "LocalResponseNorm": (lambda: nn.LocalResponseNorm(2), (0, 3, 4, 4)),
    "ReLU": (lambda: nn.ReLU(), (0, 3)),
    "SiLU": (lambda: nn.SiLU(), (2, 0, 3)),
    "Softmax": (lambda: nn.Softmax(1), (0, 3)),
    "Softmax_empty_classes": (lambda: nn.Softmax(1), (2, 0)),
    "Dropout": (lambda: nn.Dropout(0.5), (0, 3)),
}


@pytest.mark.parametrize("case", sorted(EMPTY_MODULES))
def test_empty_batch_through_modules(case, no_launch):
    torch.manual_seed(0)
    make, shape = EMPTY_MODULES[case]
    y = _compare_with_torch(make(), torch.randn(shape), exact_zero_grads=True)
    assert y.numel() == 0


def test_empty_batch_keeps_channels_last(no_launch):
    x = torch.randn(0, 3, 5, 5).to(memory_format=torch.channels_last)
    y = convert(nn.Conv2d(3, 4, 3))(x)
    assert y.shape == (0, 4, 3, 3)
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_empty_batch_norm_training_leaves_running_statistics(no_launch):
    bn = convert(nn.BatchNorm2d(3))
    bn.running_mean.fill_(0.5)
    bn.running_var.fill_(2.0)
    bn(torch.randn(0, 3, 2, 2))
    # torch's rule: no statistics from no values; the step is still counted
    assert torch.equal(bn.running_mean, torch.full((3,), 0.5))
    assert torch.equal(bn.running_var, torch.full((3,), 2.0))
    assert int(bn.num_batches_tracked) == 1


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_empty_batch_cross_entropy_as_torch(reduction, no_launch):
    x = torch.randn(0, 5, requires_grad=True)
    t = torch.zeros(0, dtype=torch.int64)
    weight = torch.rand(5) + 0.5
    ours = convert(nn.CrossEntropyLoss(weight=weight, reduction=reduction))(x, t)
    theirs = nn.CrossEntropyLoss(weight=weight, reduction=reduction)(x, t)
    assert ours.shape == theirs.shape
    assert torch.equal(ours.isnan(), theirs.isnan())  # mean over nothing: NaN, as torch
    assert torch.equal(ours.nan_to_num(), theirs.nan_to_num())
    ours.sum().backward()
    assert x.grad.shape == x.shape


# -- empty inputs through the functional API -------------------------------------------------


def test_empty_conv_every_direction(no_launch):
    x, w, dy = torch.randn(0, 3, 5, 5), torch.randn(4, 3, 3, 3), torch.randn(0, 4, 3, 3)
    assert rtdnn.conv_forward(x, w, torch.randn(4)).shape == (0, 4, 3, 3)
    assert rtdnn.conv_backward_data(dy, w, x.shape).shape == x.shape
    dw = rtdnn.conv_backward_filter(x, dy, w.shape)
    assert torch.equal(dw, torch.zeros(4, 3, 3, 3))
    assert torch.equal(rtdnn.conv_backward_bias(dy), torch.zeros(4))
    # out = alpha * 0 + beta * out; with beta = 0 a NaN in `out` does not survive
    out = poisoned((4, 3, 3, 3), torch.float32)
    assert torch.equal(rtdnn.conv_backward_filter(x, dy, w.shape, out=out), torch.zeros_like(w))
    out = torch.full((4,), 3.0)
    rtdnn.conv_backward_bias(dy, beta=0.5, out=out)
    assert torch.equal(out, torch.full((4,), 1.5))


def test_empty_conv_checks_shapes(no_launch):
    x, w = torch.randn(0, 3, 5, 5), torch.randn(4, 3, 3, 3)
    with pytest.raises(rtdnn.BadParamError, match="dy.shape"):
        rtdnn.conv_backward_filter(x, torch.randn(0, 4, 2, 2), w.shape)
    with pytest.raises(rtdnn.BadParamError, match="w.shape"):
        rtdnn.conv_forward(x, torch.randn(4, 2, 3, 3))
    with pytest.raises(rtdnn.BadParamError, match="shape"):
        rtdnn.conv_forward(torch.randn(2, 3, 0, 5), w)  # only the batch may be empty


def test_empty_linear(no_launch):
    x, w, dy = torch.randn(0, 3), torch.randn(4, 3), torch.randn(0, 4)
    assert rtdnn.linear(x, w, torch.randn(4), activation="relu").shape == (0, 4)
    assert rtdnn.linear_backward_data(dy, w).shape == (0, 3)
    assert torch.equal(rtdnn.linear_backward_weight(x, dy), torch.zeros(4, 3))
    assert torch.equal(rtdnn.linear_backward_bias(dy), torch.zeros(4))


def test_empty_memory_bound_ops(no_launch):
    x = torch.randn(0, 3, 4, 4)
    for fn in (
        lambda: rtdnn.pooling_forward(x, "max", 2),
        lambda: rtdnn.pooling_backward(torch.randn(0, 3, 2, 2), x, None, "avg_include_pad", 2),
        lambda: rtdnn.adaptive_avg_pool(x, 3),
        lambda: rtdnn.adaptive_avg_pool_backward(torch.randn(0, 3, 3, 3), x.shape),
        lambda: rtdnn.activation_forward(x, "gelu"),
        lambda: rtdnn.activation_backward(x, x, x, "tanh"),
        lambda: rtdnn.softmax_forward(x, mode="instance"),
        lambda: rtdnn.softmax_backward(x, x),
        lambda: rtdnn.lrn_forward(x, 3),
        lambda: rtdnn.lrn_backward(x, x, None, 3),
        lambda: rtdnn.dropout_forward(x, 0.5, 7),
        lambda: rtdnn.dropout_backward(x, 0.5, 7),
        lambda: rtdnn.op_tensor(x, torch.randn(1, 3, 1, 1), "add"),
        lambda: rtdnn.transform_tensor(x, memory_format=torch.channels_last),
        lambda: rtdnn.add_tensor(torch.randn(1, 3, 1, 1), x.clone()),
        lambda: rtdnn.scale_tensor(x.clone(), 2.0),
        lambda: rtdnn.set_tensor(x.clone(), 1.0),
        lambda: rtdnn.reduce_tensor(x, "max", (2, 3)),  # the reduced dims are not empty
    ):
        y = fn()
        assert y.numel() == 0 and y.shape[1] == 3


def test_empty_pooling_refuses_empty_channels():
    with pytest.raises(rtdnn.BadParamError, match="x.shape"):
        rtdnn.pooling_forward(torch.randn(2, 0, 4, 4), "max", 2)


@pytest.mark.parametrize("op", ["add", "mul", "avg", "norm1", "norm2"])
def test_reduction_over_nothing_is_torchs(op, no_launch):
    x = torch.randn(0, 3)
    ref = {"add": torch.sum, "mul": torch.prod, "avg": torch.mean}.get(op, torch.sum)(x, 0)
    ours = rtdnn.reduce_tensor(x, op, 0, keepdim=False)
    assert torch.equal(ours.isnan(), ref.isnan())
    assert torch.equal(ours.nan_to_num(), ref.nan_to_num())
    out = torch.full((1, 3), 4.0)
    rtdnn.reduce_tensor(x, "add", 0, alpha=2.0, beta=0.25, out=out)
    assert torch.equal(out, torch.full((1, 3), 1.0))


@pytest.mark.parametrize("op", ["min", "max", "amax"])
def test_reduction_picking_from_nothing_raises(op):
    with pytest.raises(rtdnn.BadParamError, match="x.shape"):
        rtdnn.reduce_tensor(torch.randn(0, 3), op, 0)


def test_empty_normalizations(no_launch):
    x, w, b = torch.randn(0, 4, 3), torch.rand(4) + 0.5, torch.randn(4)
    rm, rv = torch.zeros(4), torch.ones(4)
    y, mean, invstd = rtdnn.batch_norm_forward_training(x, w, b, running_mean=rm, running_var=rv)
    assert y.shape == x.shape and mean.shape == invstd.shape == (4,)
    assert torch.equal(rm, torch.zeros(4)) and torch.equal(rv, torch.ones(4))
    assert rtdnn.batch_norm_forward_inference(x, w, b, rm, rv).shape == x.shape
    dx, dw, db, dz = rtdnn.batch_norm_backward(x, x, mean, invstd, w, b)
    assert dx.shape == x.shape and dz is None
    assert torch.equal(dw, torch.zeros(4)) and torch.equal(db, torch.zeros(4))
    y, mean, rstd = rtdnn.group_norm_forward(x, 2, w, b)
    assert y.shape == x.shape and mean.shape == (0, 2)
    dx, dw, db = rtdnn.group_norm_backward(x, x, 2, mean, rstd, w)
    assert dx.shape == x.shape and torch.equal(dw, torch.zeros(4)) and torch.equal(db, dw)
    y, mean, rstd = rtdnn.instance_norm_forward(x, w, b)
    assert y.shape == x.shape and mean.shape == (0, 4)
    y, mean, rstd = rtdnn.layer_norm_forward(x, 3)
    dx, dw, db = rtdnn.layer_norm_backward(x, x, 3, mean, rstd, torch.ones(3))
    assert dx.shape == x.shape and torch.equal(dw, torch.zeros(3)) and torch.equal(db, dw)
    y, rstd = rtdnn.rms_norm_forward(x, 3)
    assert y.shape == x.shape and rstd.shape == (0, 4)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_empty_cross_entropy_functional(reduction, no_launch):
    x, t = torch.randn(0, 5), torch.zeros(0, dtype=torch.int64)
    loss = rtdnn.cross_entropy(x, t, reduction=reduction)
    ref = F.cross_entropy(x, t, reduction=reduction)
    assert loss.shape == ref.shape
    assert torch.equal(loss.isnan(), ref.isnan())


# -- float64 ---------------------------------------------------------------------------------


def test_convert_keeps_float64_modules_and_says_why():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 2)).double()
    converted, report = rtdnn.convert(model)
    assert not report.replaced
    reasons = {path: reason for path, _, reason in report.kept}
    assert "float64" in reasons["0"] and "float64" in reasons["1"] and "float64" in reasons["3"]
    assert "float64" in str(report)
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    assert torch.equal(converted(x), model(x))


def test_convert_keeps_float64_modules_of_a_converted_model():
    converted, _ = rtdnn.convert(nn.Sequential(nn.Linear(3, 2), nn.Tanh()))
    again, report = rtdnn.convert(converted.double())
    assert type(again[0]) is nn.Linear and type(again[1]) is nn.Tanh
    assert len(report.kept) == 2


def test_float32_modules_in_a_float64_model_are_converted():
    model = nn.Sequential(nn.Linear(3, 2).double(), nn.Linear(2, 2))
    _, report = rtdnn.convert(model)
    assert [p for p, _ in report.replaced] == ["1"]


@pytest.mark.parametrize(
    "module",
    [nn.Conv2d(3, 4, 3), nn.Linear(3, 4), nn.ReLU(), nn.MaxPool2d(2), nn.BatchNorm2d(3),
     nn.LayerNorm(4), nn.Softmax(1), nn.Dropout()],
    ids=lambda m: type(m).__name__,
)  # fmt: skip
def test_float64_input_to_an_rtdnn_module_is_refused_by_name(module):
    converted = convert(module)
    with pytest.raises(rtdnn.NotSupportedError, match="input.dtype") as info:
        converted(torch.randn(2, 3, 4, 4, dtype=torch.float64))
    assert "float64" in str(info.value) and type(module).__name__ in str(info.value)


# -- the error types torch raises ------------------------------------------------------------

MISTAKES = {
    "conv_channels": (lambda: nn.Conv2d(3, 4, 3), (1, 2, 5, 5), "input.shape[1]"),
    "conv_channels_unbatched": (lambda: nn.Conv2d(3, 4, 3), (2, 5, 5), "input.shape[0]"),
    "conv_rank": (lambda: nn.Conv2d(3, 4, 3), (3, 5), "input.dim()"),
    "conv1d_rank": (lambda: nn.Conv1d(3, 4, 3), (1, 3, 5, 5), "input.dim()"),
    "maxpool_rank": (lambda: nn.MaxPool2d(2), (4, 4), "input.dim()"),
    "adaptive_rank": (lambda: nn.AdaptiveAvgPool2d(2), (4, 4), "input.dim()"),
    "linear_features": (lambda: nn.Linear(3, 4), (2, 5), "input.shape"),
    "layer_norm_shape": (lambda: nn.LayerNorm(4), (2, 5), "normalized_shape"),
    "batch_norm_rank": (lambda: nn.BatchNorm2d(3), (3, 4, 4), "4D"),
    "lrn_rank": (lambda: nn.LocalResponseNorm(2), (3, 4), "input.dim()"),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_errors_are_of_the_type_torch_raises(case):
    make, shape, name = MISTAKES[case]
    x = torch.randn(shape)
    with pytest.raises(Exception) as theirs:
        make()(x)
    with pytest.raises(type(theirs.value)) as ours:
        convert(make())(x)
    assert name in str(ours.value)


def test_bad_param_error_is_a_value_and_a_runtime_error():
    assert issubclass(rtdnn.BadParamError, ValueError)
    assert issubclass(rtdnn.BadParamError, RuntimeError)


# -- the functional API takes what the module takes ------------------------------------------


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize(
    ("kernel", "dilation"), [((3, 3), 1), ((2, 4), 1), ((3, 2), (2, 1)), ((4, 1), 2)]
)
@pytest.mark.parametrize("padding", ["same", "valid"])
def test_conv_forward_named_padding(kernel, dilation, padding):
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 7, 6), torch.randn(4, 3, *kernel), torch.randn(4)
    y = rtdnn.conv_forward(x, w, b, padding=padding, dilation=dilation, math="fp32")
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=padding, dilation=dilation)
    assert_close(y, ref)


def test_conv_forward_named_padding_errors():
    x, w = torch.randn(1, 3, 5, 5), torch.randn(4, 3, 3, 3)
    with pytest.raises(rtdnn.BadParamError, match="stride"):
        rtdnn.conv_forward(x, w, padding="same", stride=2)
    with pytest.raises(rtdnn.BadParamError, match="padding"):
        rtdnn.conv_forward(x, w, padding="full")


@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_conv_forward_same_padding_into_out():
    torch.manual_seed(0)
    x, w = torch.randn(1, 2, 5, 4), torch.randn(3, 2, 2, 2)
    out = poisoned((1, 3, 5, 4), torch.float32)
    y = rtdnn.conv_forward(x, w, padding="same", out=out, math="fp32")
    assert y is out
    assert_close(out, F.conv2d(x.double(), w.double(), padding="same"))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("grad", [False, True], ids=["plain", "autograd"])
def test_cross_entropy_functional_unbatched(reduction, grad):
    """(C,) logits with a 0-d target, as F.cross_entropy takes them ("none" gives a 0-d loss),
    through the plain op and the differentiable one."""
    torch.manual_seed(0)
    x, t, weight = torch.randn(5), torch.tensor(3), torch.rand(5) + 0.5
    x1, x2 = x.clone().requires_grad_(grad), x.double().requires_grad_(True)
    kw = dict(reduction=reduction, label_smoothing=0.1)
    ours = rtdnn.cross_entropy(x1, t, weight, **kw)
    ref = F.cross_entropy(x2, t, weight.double(), **kw)
    assert ours.shape == ref.shape == ()
    assert_close(ours, ref.detach())
    ref.backward()
    if grad:
        ours.backward()
        assert_close(x1.grad, x2.grad)
    # The plain backward takes the unbatched call too, and gives (C,) back.
    _, lse, w_t = rtdnn.ops.cross_entropy_forward(x, t, weight, **kw)
    dx = rtdnn.ops.cross_entropy_backward(torch.ones(()), x, t, lse, w_t, weight, **kw)
    assert dx.shape == (5,)
    assert_close(dx, x2.grad)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("padding", [1, "same"])
def test_conv_forward_unbatched(padding):
    """Unbatched x (C, *S), as F.conv2d takes it: (K, *O) back, into an unbatched `out` too."""
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 5, 4), torch.randn(3, 2, 3, 2), torch.randn(3)
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=padding)
    y = rtdnn.conv_forward(x, w, b, padding=padding, math="fp32")
    assert y.shape == ref.shape
    assert_close(y, ref)
    out = poisoned(tuple(ref.shape), torch.float32)
    assert rtdnn.ops.conv_forward(x, w, b, padding=padding, out=out, math="fp32") is out
    assert_close(out, ref)
    with pytest.raises(rtdnn.BadParamError, match="out.dim"):
        rtdnn.ops.conv_forward(x, w, b, padding=padding, out=out[None])


def test_conv_forward_rank_mismatch_names_x():
    w = torch.randn(3, 2, 3, 3)
    for x in (torch.randn(1, 1, 2, 5, 5), torch.randn(5, 5)):
        with pytest.raises(rtdnn.BadParamError, match=r"x\.dim\(\)=\d is invalid: expected 4"):
            rtdnn.conv_forward(x, w)
    with pytest.raises(rtdnn.BadParamError, match=r"dy\.dim\(\)=5"):
        rtdnn.conv_backward_data(torch.randn(1, 1, 3, 3, 3), w, (1, 2, 5, 5))


def test_lrn_empty_batch_of_many_dims():
    x = torch.randn(0, 3, 2, 2, 2, 2, requires_grad=True)
    y = rtdnn.nn.LocalResponseNorm(2)(x)
    assert y.shape == nn.LocalResponseNorm(2)(x).shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("algo", ["accurate", "log"])
def test_softmax_one_dim(algo):
    torch.manual_seed(0)
    x = torch.randn(7)
    y = rtdnn.softmax_forward(x, algo=algo)
    ref = (torch.log_softmax if algo == "log" else torch.softmax)(x.double(), 0)
    assert y.shape == (7,)
    assert_close(y, ref)
    dy = torch.randn(7)
    dx = rtdnn.softmax_backward(y, dy, algo=algo)
    x2 = x.double().requires_grad_(True)
    (torch.log_softmax if algo == "log" else torch.softmax)(x2, 0).backward(dy.double())
    assert_close(dx, x2.grad)
    out = poisoned((7,), torch.float32)
    assert rtdnn.softmax_forward(x, algo=algo, out=out) is out
    assert_close(out, ref)


# -- DistributedDataParallel -----------------------------------------------------------------


@pytest.mark.slow
def test_converted_model_trains_under_ddp_with_gloo(tmp_path):
    torch_distributed = pytest.importorskip("torch.distributed")
    if not torch_distributed.is_available() or not torch_distributed.is_gloo_available():
        pytest.skip("torch built without gloo")
    from _ddp import run_and_check

    run_and_check("gloo", str(tmp_path), tol=1e-5)


def test_no_launch_fixture_catches_a_launch(no_launch):
    """The empty-input tests above rely on this fixture noticing a launch."""
    with pytest.raises(AssertionError, match="launched"):
        rtdnn.activation_forward(torch.randn(2, 3), "relu")
    assert math.isfinite(1.0)
