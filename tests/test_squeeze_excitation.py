"""Squeeze-and-excitation (rtdnn.squeeze_excitation, rtdnn.nn.SqueezeExcitation) against the
float64 reference, through Triton's interpreter: outputs and every gradient, every tensor the
op allocates starting as NaN so that an element no kernel wrote fails."""

import os
import sys
import types

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402
import torch  # noqa: E402
from _prims_util import assert_close, make  # noqa: E402

import rtdnn  # noqa: E402
from rtdnn import reference as R  # noqa: E402
from rtdnn.ops.squeeze_excitation import (  # noqa: E402
    MAX_SQUEEZE,
    _calls,
    _Plan,
    squeeze_excitation_training,
)

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


@pytest.fixture
def nan_allocations(monkeypatch):
    """torch.empty, empty_strided and empty_like return NaN-filled floating tensors."""
    for name in ("empty", "empty_strided", "empty_like"):
        original = getattr(torch, name)

        def poisoned(*args, _original=original, **kwargs):
            t = _original(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t

        monkeypatch.setattr(torch, name, poisoned)
    _calls.clear()  # plans made under the patch allocate through it too
    yield
    _calls.clear()


def _weights(c, r, dtype, biases, conv_shaped):
    extra = (1, 1) if conv_shaped else ()
    w1 = (torch.randn(r, c, *extra) / c**0.5).to(dtype).requires_grad_()
    w2 = (torch.randn(c, r, *extra) / r**0.5).to(dtype).requires_grad_()
    b1 = torch.randn(r).to(dtype).requires_grad_() if biases else None
    b2 = torch.randn(c).to(dtype).requires_grad_() if biases else None
    return w1, b1, w2, b2


def check(shape, r, dtype, layout, activation, gate, *, w_dtype=torch.float32, biases=True):
    torch.manual_seed(sum(shape) + r)
    x = make(shape, dtype, layout, scale=2.0).requires_grad_()
    w1, b1, w2, b2 = _weights(shape[1], r, w_dtype, biases, conv_shaped=len(shape) == 4)
    y = rtdnn.squeeze_excitation(x, w1, b1, w2, b2, activation, gate)
    assert y.dtype == x.dtype and y.shape == x.shape
    ref = R.squeeze_excitation(x, w1, b1, w2, b2, activation, gate)
    assert_close(y, ref, dtype, what="y")
    dy = make(shape, dtype, layout)
    inputs = [t for t in (x, w1, b1, w2, b2) if t is not None]
    grads = torch.autograd.grad(y, inputs, dy)
    refs = torch.autograd.grad(ref, inputs, dy.double())
    for name, g, gr, t in zip(("x", "w1", "b1", "w2", "b2"), grads, refs, inputs, strict=False):
        assert g.dtype == t.dtype and g.shape == t.shape, name
        assert_close(g, gr, dtype, what=f"d{name}")


@pytest.mark.parametrize(
    "shape, r, dtype, layout, activation, gate, w_dtype, biases",
    [
        # EfficientNet's block: channels-last, SiLU and sigmoid, float32 weights (autocast)
        ((3, 20, 7, 6), 5, torch.float32, "channels_last", "silu", "sigmoid", F32, True),
        # MobileNetV3's: ReLU and hardsigmoid; channels (33) and R (17) off every tile
        ((2, 33, 4, 9), 17, torch.float16, "contiguous", "relu", "hardsigmoid", F32, True),
        # one sample, one channel, one pixel, R = 1, no biases
        ((1, 1, 1, 1), 1, torch.float32, "contiguous", "silu", "sigmoid", F32, False),
        # 17 samples (two row blocks of 16), one pixel; bfloat16 everywhere
        ((17, 8, 1, 1), 3, torch.bfloat16, "channels_last", "silu", "sigmoid", BF16, True),
        # 1-D input (N, C, L), two channel blocks in the squeeze gradient (C = 70)
        ((2, 70, 3), 40, torch.float32, "contiguous", "relu", "sigmoid", F32, True),
        # R = 130: all of R takes 256 lanes, so the channel blocks of the products (16) differ
        # from those of the pooling and scaling (64), which cover all 70 channels
        ((2, 70, 2, 3), 130, F32, "channels_last", "relu", "hardsigmoid", F32, True),
        # 3-D input
        ((2, 5, 2, 3, 2), 4, torch.float32, "channels_last", "silu", "hardsigmoid", F32, True),
        # spatial dims that are not one run of positions: copied first
        ((2, 6, 3, 5), 4, torch.float32, "strided", "relu", "sigmoid", F32, True),
        ((2, 6, 3, 5), 4, torch.float16, "reversed", "silu", "sigmoid", F16, True),
    ],
)
def test_matches_reference(
    nan_allocations, shape, r, dtype, layout, activation, gate, w_dtype, biases
):
    check(shape, r, dtype, layout, activation, gate, w_dtype=w_dtype, biases=biases)


def test_positions_in_several_slices(nan_allocations):
    """300 positions of 64 channels for one sample: the pooling splits them into 5 slices of
    at most 64 (the last one short), whose partial sums the next kernel adds."""
    plan = _Plan(*[torch.empty(1, 64, 15, 20), *_weights(64, 4, torch.float32, True, True)],
                   "silu", "sigmoid")  # fmt: skip
    assert plan.splits == 5
    check((1, 64, 15, 20), 4, torch.float32, "channels_last", "silu", "sigmoid")


def test_empty_batch():
    x = torch.randn(0, 4, 3, 3, requires_grad=True)
    w1, b1, w2, b2 = _weights(4, 2, torch.float32, True, True)
    y = rtdnn.squeeze_excitation(x, w1, b1, w2, b2, "relu", "sigmoid")
    assert y.shape == x.shape
    grads = torch.autograd.grad(y.sum(), [x, w1, b1, w2, b2])
    assert grads[0].shape == x.shape
    assert all(bool((g == 0).all()) for g in grads[1:])


def test_plain_call_without_gradients():
    """Without inputs that need grad the plain function runs (no autograd graph)."""
    x = torch.randn(2, 4, 3, 3)
    w1, b1, w2, b2 = (t.detach() for t in _weights(4, 2, torch.float32, True, True))
    y = rtdnn.squeeze_excitation(x, w1, b1, w2, b2, "silu", "sigmoid")
    assert not y.requires_grad
    assert_close(y, R.squeeze_excitation(x, w1, b1, w2, b2, "silu", "sigmoid"), torch.float32)


@pytest.mark.parametrize(
    "change, error, name",
    [
        (dict(activation="gelu"), rtdnn.BadParamError, "activation"),
        (dict(gate="tanh"), rtdnn.BadParamError, "gate"),
        (dict(w1=torch.randn(2, 5, 1, 1)), rtdnn.BadParamError, "w1.shape"),
        (dict(w1=torch.randn(2, 4, 3, 3)), rtdnn.BadParamError, "w1.shape"),
        (dict(w2=torch.randn(4, 3)), rtdnn.BadParamError, "w2.shape"),
        (dict(b1=torch.randn(3)), rtdnn.BadParamError, "b1.shape"),
        (dict(b2=torch.randn(4).half()), rtdnn.BadParamError, "b2.dtype"),
        (dict(x=torch.randn(2, 4, 0, 3)), rtdnn.BadParamError, "x.shape"),
        (dict(x=torch.randn(2, 4)), rtdnn.BadParamError, "x.dim()"),
        (dict(x=torch.randn(2, 4, 3, 3).double()), rtdnn.BadParamError, "x.dtype"),
        (
            dict(
                w1=torch.randn(MAX_SQUEEZE + 1, 4),
                w2=torch.randn(4, MAX_SQUEEZE + 1),
                b1=torch.randn(MAX_SQUEEZE + 1),
            ),
            rtdnn.NotSupportedError,
            "w1.shape[0]",
        ),  # fmt: skip
    ],
)
def test_bad_input_names_the_parameter(change, error, name):
    args = dict(
        x=torch.randn(2, 4, 3, 3), w1=torch.randn(2, 4, 1, 1), b1=torch.randn(2),
        w2=torch.randn(4, 2, 1, 1), b2=torch.randn(4), activation="relu", gate="sigmoid",
    )  # fmt: skip
    args.update(change)
    with pytest.raises(error, match=name.replace("[", r"\[").replace("]", r"\]")):
        rtdnn.squeeze_excitation(**args)


def test_backward_checks_its_inputs():
    x = torch.randn(2, 4, 3, 3)
    w1, b1, w2, b2 = (t.detach() for t in _weights(4, 2, torch.float32, True, True))
    _, saved = squeeze_excitation_training(x, w1, b1, w2, b2, "relu", "sigmoid")
    with pytest.raises(rtdnn.BadParamError, match="dy.shape"):
        rtdnn.squeeze_excitation_backward(torch.randn(2, 4, 3, 4), x, saved, w1, b1, w2, b2)
    with pytest.raises(rtdnn.BadParamError, match="saved.shape"):
        rtdnn.squeeze_excitation_backward(torch.randn_like(x), x, saved[1:], w1, b1, w2, b2)


class TorchvisionBlock(torch.nn.Module):
    """torchvision.ops.SqueezeExcitation's forward, written out (torchvision is optional)."""

    def __init__(self, c, r, activation=torch.nn.ReLU, scale_activation=torch.nn.Sigmoid):
        super().__init__()
        self.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc1 = torch.nn.Conv2d(c, r, 1)
        self.fc2 = torch.nn.Conv2d(r, c, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


@pytest.mark.parametrize(
    "activation, scale_activation, fused",
    [
        (torch.nn.SiLU, torch.nn.Sigmoid, True),
        (torch.nn.ReLU, torch.nn.Hardsigmoid, True),
        (torch.nn.GELU, torch.nn.Sigmoid, False),  # not fused: the submodules run one by one
    ],
)
@pytest.mark.parametrize("unbatched", [False, True])
def test_module_matches_torchvision_block(activation, scale_activation, fused, unbatched):
    torch.manual_seed(3)
    block = TorchvisionBlock(6, 3, activation, scale_activation)
    ours = rtdnn.nn.SqueezeExcitation(6, 3, activation, scale_activation)
    ours.load_state_dict(block.state_dict())
    assert (ours._modes() is not None) == fused
    x = torch.randn(*([] if unbatched else [2]), 6, 4, 5).requires_grad_()
    y, ref = ours(x), block(x)
    assert_close(y, ref, torch.float32)
    dy = torch.randn_like(ref)
    grads = torch.autograd.grad(y, [x, *ours.parameters()], dy)
    refs = torch.autograd.grad(ref, [x, *block.parameters()], dy)
    for g, gr in zip(grads, refs, strict=True):
        assert_close(g, gr, torch.float32)


def test_convert_swaps_the_blocks_of_a_registered_library(monkeypatch):
    """rtdnn.convert replaces a foreign library's block (here a stand-in registered under a
    module name, as torchvision.ops.misc.SqueezeExcitation is) by rtdnn's, keeping its
    state_dict, and the converted model computes what the original did."""
    library = types.ModuleType("fake_vision_ops")
    library.SqueezeExcitation = type("SqueezeExcitation", (TorchvisionBlock,), {})
    monkeypatch.setitem(sys.modules, "fake_vision_ops", library)
    monkeypatch.setattr(
        sys.modules["rtdnn.convert"], "FOREIGN_TWINS",
        {"fake_vision_ops.SqueezeExcitation": rtdnn.nn.SqueezeExcitation},
    )  # fmt: skip
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), library.SqueezeExcitation(8, 2))
    converted, report = rtdnn.convert(model, fuse=True)
    assert ("1", "SqueezeExcitation") in report.replaced
    assert type(converted.get_submodule("1")) is rtdnn.nn.SqueezeExcitation
    assert converted.state_dict().keys() == model.state_dict().keys()
    x = torch.randn(2, 3, 6, 6)
    assert_close(converted(x), model(x), torch.float32)
