"""The forward convolution's activation (cuDNN's ConvolutionBiasActivationForward):
y = relu(alpha * conv(x, w) + bias + beta * out), fused in the GEMM algorithms' epilogue and a
pass of its own after the others, against the float64 reference."""

import pytest
import torch
from conftest import assert_close, make_tensor, poisoned

import rtdnn
from rtdnn import reference
from rtdnn.core import BadParamError

CONV = dict(stride=1, padding=1, dilation=1, groups=1)


def _operands(shape_x, shape_w, dtype=torch.float32):
    x = make_tensor(shape_x, dtype, layout="channels_last")
    w = make_tensor(shape_w, dtype)
    bias = make_tensor((shape_w[0],), dtype)
    return x, w, bias


@pytest.mark.parametrize(
    "algo",
    ["IMPLICIT_GEMM", "IMPLICIT_GEMM_SPLIT_K", "IMPLICIT_PRECOMP_GEMM", "GEMM",
     "WINOGRAD_NONFUSED", "FFT", "DIRECT"],
)  # fmt: skip
@pytest.mark.parametrize("beta", [0.0, 0.7])
def test_relu_after_bias_and_beta(algo, beta):
    torch.manual_seed(0)
    x, w, bias = _operands((2, 4, 5, 6), (6, 4, 3, 3))
    shape = (2, 6, 5, 6)
    out = poisoned(shape, torch.float32) if beta == 0 else make_tensor(shape, torch.float32)
    ref = reference.conv_forward(
        x, w, bias, alpha=0.5, beta=beta, out=out, activation="relu", **CONV
    )
    y = rtdnn.ops.conv_forward(
        x, w, bias, alpha=0.5, beta=beta, out=out, algo=algo, math="fp32", activation="relu",
        **CONV,
    )  # fmt: skip
    assert y is out
    pre = reference.conv_forward(x, w, bias, alpha=0.5, beta=beta, out=out, **CONV)
    assert (pre < 0).any()  # the activation has something to clip
    assert_close(y, ref)


def test_pointwise_and_unbatched_and_auto():
    torch.manual_seed(1)
    x, w, bias = _operands((3, 8, 4, 4), (5, 8, 1, 1))
    y = rtdnn.conv_forward(x, w, bias, activation="relu")
    assert_close(y, reference.conv_forward(x, w, bias, activation="relu"))
    y1 = rtdnn.conv_forward(x[0], w, bias, activation="relu")
    assert_close(y1, reference.conv_forward(x[:1], w, bias, activation="relu")[0])


def test_identity_and_none_are_the_plain_convolution():
    torch.manual_seed(2)
    x, w, bias = _operands((2, 3, 4, 4), (4, 3, 3, 3))
    plain = rtdnn.conv_forward(x, w, bias, padding=1)
    for activation in (None, "identity"):
        assert torch.equal(rtdnn.conv_forward(x, w, bias, padding=1, activation=activation), plain)


def test_recorded_call_gives_relus_gradient():
    """With autograd recording, the custom op runs the same fused forward, and its backward
    masks dy where the output is zero: the gradients are those of relu(conv)."""
    torch.manual_seed(3)
    x, w, bias = _operands((2, 3, 5, 5), (4, 3, 3, 3))
    x.requires_grad_()
    w.requires_grad_()
    y = rtdnn.conv_forward(x, w, bias, padding=1, activation="relu")
    dy = make_tensor(tuple(y.shape), torch.float32)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = torch.relu(torch.nn.functional.conv2d(x64, w64, bias.double(), padding=1))
    rdx, rdw = torch.autograd.grad(ref, (x64, w64), dy.double())
    assert_close(y, ref)
    assert_close(dx, rdx)
    assert_close(dw, rdw)


def test_unknown_activation_is_refused_naming_it():
    x, w, bias = _operands((1, 2, 3, 3), (2, 2, 1, 1))
    out = poisoned((1, 2, 3, 3), torch.float32)
    with pytest.raises(BadParamError, match="activation"):
        rtdnn.conv_forward(x, w, bias, out=out, activation="gelu")
    assert out.isnan().all()
    with pytest.raises(BadParamError, match="activation"):  # a batch of 0 is no exception
        rtdnn.conv_forward(x[:0], w, bias, activation="gelu")
    with pytest.raises(BadParamError, match="activation"):
        rtdnn.conv_forward(x.requires_grad_(), w, bias, activation="gelu")


@pytest.mark.parametrize("algo", ["IMPLICIT_GEMM", "DIRECT"])
@pytest.mark.parametrize("dims", [1, 3])
def test_one_and_three_spatial_dims(algo, dims):
    torch.manual_seed(4)
    x = make_tensor((2, 3, *(4,) * dims), torch.float32)
    w = make_tensor((4, 3, *(3,) * dims), torch.float32)
    out = poisoned((2, 4, *(4,) * dims), torch.float32)
    y = rtdnn.ops.conv_forward(x, w, padding=1, out=out, algo=algo, activation="relu")
    assert_close(y, reference.conv_forward(x, w, padding=1, activation="relu"))


def test_micro_batches_apply_it_to_every_part():
    torch.manual_seed(5)
    x, w, bias = _operands((4, 3, 4, 4), (4, 3, 3, 3))
    y = rtdnn.ops.conv_forward(
        x, w, bias, padding=1, activation="relu", micro_batch="powerOfTwo", workspace_limit=0
    )
    assert_close(y, reference.conv_forward(x, w, bias, padding=1, activation="relu"))
