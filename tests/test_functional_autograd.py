"""Autograd through rtdnn's top-level functions: gradients against torch's own functions in
float64, the same values and layout as the plain call, out= refused while grad is recorded,
and calls without grad left to the plain primitives (tiny float32 shapes)."""

import inspect
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from conftest import MATH, assert_close  # noqa: E402

import rtdnn  # noqa: E402
from rtdnn import autograd  # noqa: E402


def _leaves(inputs, dtype=None):
    """Fresh leaves that require grad (cast to dtype) for the tensors among inputs."""
    return [
        t.detach().to(dtype or t.dtype).requires_grad_() if isinstance(t, torch.Tensor) else t
        for t in inputs
    ]


def check_against_torch(ours, theirs, *inputs, seed=0):
    """ours(*inputs) in float32 and theirs(*inputs) in float64: outputs, and the gradient of
    sum(y * g) for a random g with respect to every input, within the float32 tolerance. The
    recorded result also equals the plain (no-grad) call bit for bit, in the same layout."""
    mine, ref = _leaves(inputs), _leaves(inputs, torch.float64)
    y, r = ours(*mine), theirs(*ref)
    assert y.requires_grad and y.dtype == torch.float32
    with torch.no_grad():
        plain = ours(*mine)
    assert not plain.requires_grad
    assert torch.equal(y.detach(), plain) and y.stride() == plain.stride()
    assert_close(y.detach(), r.detach())
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed))
    (y * g).sum().backward()
    (r * g.double()).sum().backward()
    for a, b in zip(mine, ref, strict=True):
        if isinstance(a, torch.Tensor):
            assert a.grad is not None
            assert_close(a.grad, b.grad.detach(), torch.float32)


def randn(*shape, seed=1, scale=1.0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


# -- convolution and linear -------------------------------------------------------------------


def test_conv_forward():
    check_against_torch(
        lambda x, w, b: rtdnn.conv_forward(x, w, b, stride=2, padding=1, math=MATH),
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
        randn(2, 3, 5, 5), randn(4, 3, 3, 3, seed=2), randn(4, seed=3),
    )  # fmt: skip


@pytest.mark.parametrize("padding", [1, "same"])
def test_conv_forward_unbatched(padding):
    check_against_torch(
        lambda x, w, b: rtdnn.conv_forward(x, w, b, padding=padding, alpha=0.3, math=MATH),
        lambda x, w, b: 0.3 * F.conv2d(x, w, padding=padding) + b.view(-1, 1, 1),
        randn(2, 5, 5), randn(3, 2, 3, 3, seed=2), randn(3, seed=3),
    )  # fmt: skip


@pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")  # torch's, on its copy
@pytest.mark.parametrize("padding", ["same", "valid"])
def test_conv_forward_named_padding(padding):
    # An even kernel: "same" pads one more on the right, which must carry the gradient too.
    check_against_torch(
        lambda x, w: rtdnn.conv_forward(x, w, padding=padding, dilation=(1, 2), math=MATH),
        lambda x, w: F.conv2d(x, w, padding=padding, dilation=(1, 2)),
        randn(1, 2, 5, 6), randn(3, 2, 2, 3, seed=2),
    )  # fmt: skip


def test_conv_forward_alpha_scales_the_convolution_not_the_bias():
    x, w, b = randn(1, 2, 4, 4), randn(3, 2, 3, 3, seed=2), randn(3, seed=3)
    mine = _leaves([x, w, b])
    y = rtdnn.conv_forward(*mine, padding=1, alpha=0.5, math=MATH, algo="auto")
    ref = _leaves([x, w, b], torch.float64)
    r = 0.5 * F.conv2d(ref[0], ref[1], padding=1) + ref[2].view(1, -1, 1, 1)
    assert_close(y.detach(), r.detach())
    y.sum().backward()
    r.sum().backward()
    for a, b_ in zip(mine, ref, strict=True):
        assert_close(a.grad, b_.grad, torch.float32)


def test_conv_forward_alpha_is_the_plain_calls():
    # alpha = 0.3 is no power of two: scaling the input instead of the convolution would round
    # differently. check_against_torch asserts the plain call's result bit for bit.
    check_against_torch(
        lambda x, w, b: rtdnn.conv_forward(x, w, b, padding=1, alpha=0.3, math=MATH),
        lambda x, w, b: 0.3 * F.conv2d(x, w, padding=1) + b.view(1, -1, 1, 1),
        randn(1, 2, 4, 4), randn(3, 2, 3, 3, seed=2), randn(3, seed=3),
    )  # fmt: skip


def test_conv_forward_float16_large_alpha_stays_finite():
    # alpha * x overflows float16 (3e4 * 3 > 65504); alpha * conv(x, w) does not.
    x, w, b = randn(1, 2, 4, 4, scale=3.0), randn(3, 2, 3, 3, seed=2, scale=0.01), randn(3, seed=3)
    mine = _leaves([x, w, b], torch.float16)
    y = rtdnn.conv_forward(*mine, padding=1, alpha=3e4, math=MATH)
    with torch.no_grad():
        plain = rtdnn.conv_forward(*mine, padding=1, alpha=3e4, math=MATH)
    assert torch.isfinite(plain).all() and torch.equal(y.detach(), plain)
    ref = _leaves([t.half() for t in (x, w, b)], torch.float64)
    r = 3e4 * F.conv2d(ref[0], ref[1], padding=1) + ref[2].view(1, -1, 1, 1)
    assert_close(y.detach(), r.detach())
    g = randn(*y.shape, seed=4, scale=1e-4)
    (y * g.half()).sum().backward()
    (r * g.half().double()).sum().backward()
    for a, b_ in zip(mine, ref, strict=True):
        assert torch.isfinite(a.grad).all()
        assert_close(a.grad, b_.grad.detach())


def test_linear_with_relu():
    # Values away from 0, where ReLU's derivative is ambiguous.
    check_against_torch(
        lambda x, w, b: rtdnn.linear(x, w, b, activation="relu", math=MATH),
        lambda x, w, b: F.relu(F.linear(x, w, b)),
        randn(2, 3, 16), randn(8, 16, seed=2), randn(8, seed=3),
    )  # fmt: skip


def test_linear_alpha():
    check_against_torch(
        lambda x, w: rtdnn.linear(x, w, alpha=-2.0, math=MATH),
        lambda x, w: -2.0 * F.linear(x, w),
        randn(3, 16), randn(4, 16, seed=2),
    )  # fmt: skip


def test_linear_alpha_is_the_plain_calls():
    # alpha scales the product, not the bias, bit for bit as the plain call (0.3: no power of 2).
    check_against_torch(
        lambda x, w, b: rtdnn.linear(x, w, b, activation="relu", alpha=0.3, math=MATH),
        lambda x, w, b: F.relu(0.3 * F.linear(x, w) + b),
        randn(3, 16), randn(4, 16, seed=2), randn(4, seed=3),
    )  # fmt: skip


# -- loss ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
    target = torch.tensor([0, 4, 2, 1, 3, 4])
    weight = torch.tensor([1.0, 0.5, 2.0, 1.0, 0.3])
    kw = dict(label_smoothing=0.1, reduction=reduction)
    check_against_torch(
        lambda x: rtdnn.cross_entropy(x, target, weight, **kw),
        lambda x: F.cross_entropy(x, target, weight.double(), **kw),
        randn(6, 5),
    )


def test_cross_entropy_refuses_grad_for_the_class_weights():
    x, w = randn(2, 3).requires_grad_(), torch.ones(3, requires_grad=True)
    with pytest.raises(rtdnn.NotSupportedError, match="weight"):
        rtdnn.cross_entropy(x, torch.tensor([0, 2]), w)


# -- pooling ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, theirs",
    [
        ("max", lambda x: F.max_pool2d(x, 3, stride=2, padding=1)),
        ("avg_include_pad", lambda x: F.avg_pool2d(x, 3, stride=2, padding=1)),
        ("avg_exclude_pad",
         lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False)),
    ],
)  # fmt: skip
def test_pooling_forward(mode, theirs):
    check_against_torch(
        lambda x: rtdnn.pooling_forward(x, mode, 3, stride=2, padding=1), theirs, randn(2, 3, 5, 6)
    )


def test_adaptive_avg_pool():
    check_against_torch(
        lambda x: rtdnn.adaptive_avg_pool(x, (3, None), alpha=2.0),
        lambda x: 2.0 * F.adaptive_avg_pool2d(x, (3, 5)),
        randn(2, 3, 7, 5),
    )


# -- activations, softmax, LRN ----------------------------------------------------------------

ACTIVATIONS = [
    ("relu", None, F.relu),
    ("sigmoid", None, torch.sigmoid),
    ("tanh", None, torch.tanh),
    ("elu", 0.7, lambda x: F.elu(x, 0.7)),
    ("leaky_relu", 0.1, lambda x: F.leaky_relu(x, 0.1)),
    ("hardtanh", (-0.5, 0.8), lambda x: F.hardtanh(x, -0.5, 0.8)),
    ("clipped_relu", 0.6, lambda x: F.hardtanh(x, 0.0, 0.6)),
    ("swish", 1.0, F.silu),
    ("gelu", None, F.gelu),
    ("gelu_tanh", None, lambda x: F.gelu(x, approximate="tanh")),
]


@pytest.mark.parametrize("mode, coef, theirs", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_forward(mode, coef, theirs):
    check_against_torch(
        lambda x: rtdnn.activation_forward(x, mode, coef=coef, alpha=1.5),
        lambda x: 1.5 * theirs(x),
        randn(2, 3, 4),
    )


@pytest.mark.parametrize(
    "algo, mode, shape, theirs",
    [
        ("accurate", "channel", (3, 5), lambda x: F.softmax(x, 1)),
        ("log", "channel", (2, 4, 3), lambda x: F.log_softmax(x, 1)),
        ("accurate", "instance", (2, 3, 2, 2),
         lambda x: F.softmax(x.flatten(1), 1).view_as(x)),
    ],
)  # fmt: skip
def test_softmax_forward(algo, mode, shape, theirs):
    check_against_torch(
        lambda x: rtdnn.softmax_forward(x, algo=algo, mode=mode), theirs, randn(*shape)
    )


def test_lrn_forward():
    check_against_torch(
        lambda x: rtdnn.lrn_forward(x, 3, lrn_alpha=0.5, lrn_beta=0.75, lrn_k=2.0),
        lambda x: F.local_response_norm(x, 3, alpha=0.5, beta=0.75, k=2.0),
        randn(2, 6, 3, 3),
    )


def test_dropout_forward_gradient_is_its_own_mask():
    x = randn(4, 33).requires_grad_()
    y = rtdnn.dropout_forward(x, 0.3, seed=7)
    with torch.no_grad():
        plain = rtdnn.dropout_forward(x, 0.3, seed=7)
    assert y.requires_grad and torch.equal(y.detach(), plain)
    g = randn(4, 33, seed=5)
    y.backward(g)
    mask = rtdnn.dropout_backward(g, 0.3, 7)
    assert torch.equal(x.grad, mask)
    kept = mask != 0
    assert 0 < kept.sum() < kept.numel()
    torch.testing.assert_close(x.grad[kept], g[kept] / 0.7)


# -- tensor ops ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op, theirs",
    [
        ("add", lambda a, b: 2.0 * a - 0.5 * b),
        ("mul", lambda a, b: (2.0 * a) * (-0.5 * b)),
        ("max", lambda a, b: torch.maximum(2.0 * a, -0.5 * b)),
    ],
)
def test_op_tensor_with_broadcast(op, theirs):
    check_against_torch(
        lambda a, b: rtdnn.op_tensor(a, b, op, alpha1=2.0, alpha2=-0.5),
        theirs,
        randn(2, 3, 2, 2), randn(1, 3, 1, 1, seed=2),
    )  # fmt: skip


@pytest.mark.parametrize(
    "op, dims, theirs",
    [
        ("add", (0, 2), lambda x: x.sum((0, 2))),
        ("avg", 1, lambda x: x.mean(1)),
        ("norm2", None, lambda x: x.norm()),
    ],
)
def test_reduce_tensor(op, dims, theirs):
    check_against_torch(
        lambda x: rtdnn.reduce_tensor(x, op, dims, keepdim=False), theirs, randn(3, 4, 5)
    )


def _with_zeros(shape, zeros):
    """randn(*shape) with zeros at the given indices."""
    x = randn(*shape)
    for i in zeros:
        x[i] = 0.0
    return x


@pytest.mark.parametrize(
    "op, dims, x, theirs",
    [
        # Slices (rows) with no zero, one zero and two zeros: torch's prod gradient, no NaN.
        ("mul", 1, _with_zeros((3, 4), [(1, 2), (2, 0), (2, 3)]), lambda x: x.prod(1)),
        ("mul", None, _with_zeros((2, 3), [(0, 1)]), lambda x: x.prod()),
        ("mul", None, _with_zeros((2, 3), [(0, 1), (1, 1)]), lambda x: x.prod()),
        # Ties (repeated values) share the gradient evenly, as torch.amax / amin.
        ("max", (0, 2), randn(3, 4, 2).round(), lambda x: x.amax((0, 2))),
        ("min", 1, randn(3, 4).round(), lambda x: x.amin(1)),
        ("amax", 1, randn(3, 4).round(), lambda x: x.abs().amax(1)),
        ("amax", 1, _with_zeros((2, 3), [(1, 0), (1, 1), (1, 2)]), lambda x: x.abs().amax(1)),
        ("norm1", 1, _with_zeros((3, 4), [(0, 1)]), lambda x: x.abs().sum(1)),
        # An all-zero slice: gradient 0 there, as torch.linalg.vector_norm.
        ("norm2", 1, _with_zeros((3, 4), [(1, j) for j in range(4)]), lambda x: x.norm(dim=1)),
        ("avg", (0, 1), randn(3, 4, 2), lambda x: x.mean((0, 1))),
    ],
)
def test_reduce_tensor_gradients_at_zeros_and_ties(op, dims, x, theirs):
    check_against_torch(lambda x: rtdnn.reduce_tensor(x, op, dims, keepdim=False), theirs, x)


def test_reduce_tensor_with_indices():
    x = randn(3, 5).requires_grad_()
    y, idx = rtdnn.reduce_tensor(x, "max", 1, keepdim=False, indices=True)
    ref, ref_idx = x.detach().max(1)
    assert torch.equal(y.detach(), ref) and torch.equal(idx, ref_idx) and not idx.requires_grad
    y.sum().backward()
    assert torch.equal(x.grad, F.one_hot(ref_idx, 5).float())


@pytest.mark.parametrize("op, theirs", [("max", torch.max), ("min", torch.min)])
def test_reduce_tensor_with_indices_routes_ties_to_the_index(op, theirs):
    # As torch.max(x, dim): with indices the gradient goes to the chosen element, ties or not.
    x = randn(4, 5).round()
    x[0, 1:3] = x[0, 3] = 7.0 if op == "max" else -7.0  # a three-way tie in row 0
    mine, ref = _leaves([x]), _leaves([x], torch.float64)
    y, idx = rtdnn.reduce_tensor(mine[0], op, 1, keepdim=False, indices=True)
    r, ref_idx = theirs(ref[0], 1)
    assert torch.equal(idx, ref_idx) and idx[0] == 1
    with torch.no_grad():
        assert torch.equal(y.detach(), rtdnn.reduce_tensor(x, op, 1, keepdim=False))
    g = randn(4, seed=5)
    (y * g).sum().backward()
    (r * g.double()).sum().backward()
    assert torch.equal(mine[0].grad, ref[0].grad.float())


def test_reduce_tensor_amax_with_indices_over_several_dims():
    x = randn(2, 3, 4, 3).to(memory_format=torch.channels_last).requires_grad_()
    y, idx = rtdnn.reduce_tensor(x, "amax", (1, 3), indices=True)
    with torch.no_grad():
        plain, plain_idx = rtdnn.reduce_tensor(x, "amax", (1, 3), indices=True)
    assert torch.equal(y.detach(), plain) and y.stride() == plain.stride()
    assert torch.equal(idx, plain_idx)
    y.sum().backward()
    # One element per (n, h) slice takes the gradient: sign(x) at the chosen position.
    flat = x.detach().permute(0, 2, 1, 3).reshape(2, 4, 9)
    hit = F.one_hot(idx.reshape(2, 4), 9).float() * flat.sign()
    assert torch.equal(x.grad, hit.reshape(2, 4, 3, 3).permute(0, 2, 1, 3))


# The wrappers whose custom op takes alpha: the plain call scales in float32 inside the kernel,
# so scaling the rounded output instead would differ in float16 (and overflow early).
ALPHA_CALLS = {
    "activation_tanh": (lambda x, a: rtdnn.activation_forward(x, "tanh", alpha=a), torch.tanh),
    "activation_elu": (
        lambda x, a: rtdnn.activation_forward(x, "elu", coef=0.7, alpha=a),
        lambda x: F.elu(x, 0.7),
    ),
    "softmax": (lambda x, a: rtdnn.softmax_forward(x, alpha=a), lambda x: x.softmax(1)),
    "log_softmax": (
        lambda x, a: rtdnn.softmax_forward(x, mode="channel", algo="log", alpha=a),
        lambda x: x.log_softmax(1),
    ),
    "pooling": (
        lambda x, a: rtdnn.pooling_forward(x, "avg_include_pad", 3, padding=1, alpha=a),
        lambda x: F.avg_pool2d(x, 3, stride=3, padding=1),
    ),
    "adaptive_avg_pool": (
        lambda x, a: rtdnn.adaptive_avg_pool(x, 2, alpha=a),
        lambda x: F.adaptive_avg_pool2d(x, 2),
    ),
    "lrn": (
        lambda x, a: rtdnn.lrn_forward(x, 3, lrn_alpha=0.5, alpha=a),
        lambda x: F.local_response_norm(x, 3, alpha=0.5, beta=0.75, k=1.0),
    ),
    "reduce_mul": (
        lambda x, a: rtdnn.reduce_tensor(x, "mul", (2, 3), alpha=a),
        lambda x: x.prod(3, keepdim=True).prod(2, keepdim=True),
    ),
    "reduce_norm2": (
        lambda x, a: rtdnn.reduce_tensor(x, "norm2", 1, alpha=a),
        lambda x: x.norm(dim=1, keepdim=True),
    ),
    "reduce_avg": (
        lambda x, a: rtdnn.reduce_tensor(x, "avg", (0, 2), alpha=a),
        lambda x: x.mean((0, 2), keepdim=True),
    ),
}


ALPHA_CALLS |= {
    "transform_tensor": (
        lambda x, a: rtdnn.transform_tensor(x, memory_format=torch.channels_last, alpha=a),
        lambda x: x,
    ),
    "layer_norm": (lambda x, a: rtdnn.layer_norm_forward(x, 4, alpha=a)[0], None),
    "rms_norm": (lambda x, a: rtdnn.rms_norm_forward(x, (4, 4), alpha=a)[0], None),
    "group_norm": (lambda x, a: rtdnn.group_norm_forward(x, 3, alpha=a)[0], None),
    "instance_norm": (lambda x, a: rtdnn.instance_norm_forward(x, alpha=a)[0], None),
    "batch_norm_training": (lambda x, a: rtdnn.batch_norm_forward_training(x, alpha=a)[0], None),
    "batch_norm_inference": (
        lambda x, a: rtdnn.batch_norm_forward_inference(
            x, None, None, torch.zeros(3), torch.full((3,), 4.0), alpha=a
        ),
        None,
    ),
}


@pytest.mark.parametrize("name", [n for n, (_, theirs) in ALPHA_CALLS.items() if theirs])
def test_alpha_gradients(name):
    ours, theirs = ALPHA_CALLS[name]
    check_against_torch(lambda x: ours(x, 0.3), lambda x: 0.3 * theirs(x), randn(2, 3, 4, 4))


@pytest.mark.parametrize("name", [*ALPHA_CALLS, "dropout"])
def test_alpha_float16_is_the_plain_calls(name):
    ours = ALPHA_CALLS[name][0] if name != "dropout" else (
        lambda x, a: rtdnn.dropout_forward(x, 0.3, 7, alpha=a)
    )  # fmt: skip
    x = randn(2, 3, 4, 4, scale=3.0).half()
    for alpha in (0.3, 3e4):
        with torch.no_grad():
            plain = ours(x, alpha)
        y = ours(x.clone().requires_grad_(), alpha)
        assert torch.equal(y.detach().isnan(), plain.isnan())
        assert torch.equal(y.detach().nan_to_num(), plain.nan_to_num())


def test_transform_tensor_to_float16_with_alpha_is_the_plain_calls():
    x = randn(2, 3, 4, 4, scale=3.0)
    for alpha in (0.3, 3e4):  # 3e4 * x overflows float16 only after the scaling
        with torch.no_grad():
            plain = rtdnn.transform_tensor(x, dtype=torch.float16, alpha=alpha)
        xg = x.clone().requires_grad_()
        y = rtdnn.transform_tensor(xg, dtype=torch.float16, alpha=alpha)
        assert torch.equal(y.detach().nan_to_num(), plain.nan_to_num())
        y.float().sum().backward()
        assert xg.grad.dtype == torch.float32 and torch.equal(xg.grad, torch.full_like(x, alpha))


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (
            lambda x, w, b: rtdnn.layer_norm_forward(x, 3, w, b, alpha=0.3)[0],
            lambda x, w, b: 0.3 * F.layer_norm(x, (3,), w, b),
        ),
        (
            lambda x, w, b: rtdnn.group_norm_forward(x, 1, w, b, alpha=0.3)[0],
            lambda x, w, b: 0.3 * F.group_norm(x, 1, w, b),
        ),
        (
            lambda x, w, b: rtdnn.batch_norm_forward_training(x, w, b, alpha=0.3)[0],
            lambda x, w, b: 0.3 * F.batch_norm(x, None, None, w, b, training=True),
        ),
    ],
)
def test_normalization_alpha_scales_every_gradient(ours, theirs):
    # y = alpha * (normalized x * weight + bias): alpha reaches dx, dweight and dbias.
    check_against_torch(ours, theirs, randn(2, 3, 4, 3), randn(3, seed=2) + 2, randn(3, seed=3))


def test_dropout_alpha_gradient_is_alpha_times_its_mask():
    x = randn(3, 8).requires_grad_()
    y = rtdnn.dropout_forward(x, 0.5, 11, alpha=0.3)
    y.sum().backward()
    with torch.no_grad():
        mask = rtdnn.dropout_forward(torch.ones(3, 8), 0.5, 11)
    assert torch.equal(y.detach(), rtdnn.dropout_forward(x.detach(), 0.5, 11, alpha=0.3))
    assert_close(x.grad, (0.3 * mask).double())


def test_transform_tensor_layout_and_dtype():
    x = randn(2, 3, 4, 4).requires_grad_()
    y = rtdnn.transform_tensor(x, memory_format=torch.channels_last, dtype=torch.float16)
    with torch.no_grad():
        plain = rtdnn.transform_tensor(x, memory_format=torch.channels_last, dtype=torch.float16)
    assert y.requires_grad and y.dtype == torch.float16
    assert torch.equal(y.detach(), plain) and y.stride() == plain.stride()
    g = randn(2, 3, 4, 4, seed=2).half()
    y.backward(g)
    assert x.grad.dtype == torch.float32 and torch.equal(x.grad, g.float())


# -- normalization ------------------------------------------------------------------------------


def test_layer_norm_forward():
    def ours(x, w, b):
        y, mean, rstd = rtdnn.layer_norm_forward(x, 8, w, b, eps=1e-5)
        assert not (mean.requires_grad or rstd.requires_grad)
        return y

    check_against_torch(
        ours, lambda x, w, b: F.layer_norm(x, (8,), w, b, eps=1e-5),
        randn(3, 2, 8), randn(8, seed=2), randn(8, seed=3),
    )  # fmt: skip


def test_rms_norm_forward():
    check_against_torch(
        lambda x, w: rtdnn.rms_norm_forward(x, [8], w, eps=1e-6)[0],
        lambda x, w: F.rms_norm(x, (8,), w, eps=1e-6),
        randn(4, 8), randn(8, seed=2),
    )  # fmt: skip


def test_group_norm_forward():
    check_against_torch(
        lambda x, w, b: rtdnn.group_norm_forward(x, 2, w, b)[0],
        lambda x, w, b: F.group_norm(x, 2, w, b),
        randn(2, 4, 3, 3), randn(4, seed=2), randn(4, seed=3),
    )  # fmt: skip


def test_instance_norm_forward():
    check_against_torch(
        lambda x, w, b: rtdnn.instance_norm_forward(x, w, b, alpha=0.5)[0],
        lambda x, w, b: 0.5 * F.instance_norm(x, weight=w, bias=b),
        randn(2, 3, 4, 4), randn(3, seed=2), randn(3, seed=3),
    )  # fmt: skip


def test_batch_norm_forward_training_with_residual_and_relu():
    rm, rv = torch.zeros(3), torch.ones(3)
    rm_ref, rv_ref = rm.double(), rv.double()

    def ours(x, w, b, z):
        # Called twice by the check (recorded, then plain): the running statistics move twice.
        y, mean, invstd = rtdnn.batch_norm_forward_training(
            x, w, b, running_mean=rm, running_var=rv, momentum=0.1, z=z, activation="relu"
        )
        assert not (mean.requires_grad or invstd.requires_grad)
        return y

    def theirs(x, w, b, z):
        for _ in range(2):
            y = F.relu(F.batch_norm(x, rm_ref, rv_ref, w, b, training=True, momentum=0.1) + z)
        return y

    check_against_torch(
        ours, theirs, randn(4, 3, 3, 3), randn(3, seed=2), randn(3, seed=3),
        randn(4, 3, 3, 3, seed=4),
    )  # fmt: skip
    assert_close(rm, rm_ref)
    assert_close(rv, rv_ref)


def test_batch_norm_forward_inference():
    rm, rv = randn(3, seed=5), randn(3, seed=6).abs() + 0.5
    check_against_torch(
        lambda x, w, b: rtdnn.batch_norm_forward_inference(x, w, b, rm, rv, eps=1e-3),
        lambda x, w, b: F.batch_norm(x, rm.double(), rv.double(), w, b, eps=1e-3),
        randn(4, 3, 2, 2), randn(3, seed=2), randn(3, seed=3),
    )  # fmt: skip


# -- mixed with torch, out=, no grad ------------------------------------------------------------


def test_loss_mixing_rtdnn_and_torch_terms_trains_the_rtdnn_weights():
    x, target = randn(2, 3, 4, 4), torch.tensor([1, 0])
    w_conv, w_fc = randn(4, 3, 3, 3, seed=2) * 0.3, randn(2, 64, seed=3) * 0.1

    def loss(conv, cross_entropy, w_conv, w_fc):
        h = conv(x, w_conv)
        logits = F.linear(h.flatten(1), w_fc)  # a torch layer between rtdnn calls
        return cross_entropy(logits, target) + 0.01 * h.square().mean()

    mine, ref = _leaves([w_conv, w_fc]), _leaves([w_conv, w_fc], torch.float64)
    loss(lambda x, w: rtdnn.conv_forward(x, w, padding=1, math=MATH), rtdnn.cross_entropy,
         *mine).backward()  # fmt: skip
    loss(lambda x, w: F.conv2d(x.double(), w, padding=1), F.cross_entropy, *ref).backward()
    for a, b in zip(mine, ref, strict=True):
        assert_close(a.grad, b.grad, torch.float32)


X4 = (2, 4, 3, 3)
# Each call, given the module (rtdnn or rtdnn.ops), an input of shape X4 and out (or None).
CALLS = {
    "conv_forward": lambda m, x, o: m.conv_forward(x, torch.ones(4, 4, 1, 1), out=o),
    "linear": lambda m, x, o: m.linear(x, torch.ones(3, 3), out=o),
    "pooling_forward": lambda m, x, o: m.pooling_forward(x, "max", 1, out=o),
    "adaptive_avg_pool": lambda m, x, o: m.adaptive_avg_pool(x, 3, out=o),
    "activation_forward": lambda m, x, o: m.activation_forward(x, "relu", out=o),
    "softmax_forward": lambda m, x, o: m.softmax_forward(x, out=o),
    "lrn_forward": lambda m, x, o: m.lrn_forward(x, 3, out=o),
    "dropout_forward": lambda m, x, o: m.dropout_forward(x, 0.5, 1, out=o),
    "op_tensor": lambda m, x, o: m.op_tensor(x, x, "add", out=o),
    "reduce_tensor": lambda m, x, o: m.reduce_tensor(x, "max", 3, keepdim=False, out=o),
    "transform_tensor": lambda m, x, o: m.transform_tensor(x, out=o),
    "layer_norm_forward": lambda m, x, o: m.layer_norm_forward(x, 3, out=o),
    "rms_norm_forward": lambda m, x, o: m.rms_norm_forward(x, 3, out=o),
    "group_norm_forward": lambda m, x, o: m.group_norm_forward(x, 2, out=o),
    "instance_norm_forward": lambda m, x, o: m.instance_norm_forward(x, out=o),
    "batch_norm_forward_training": lambda m, x, o: m.batch_norm_forward_training(x, out=o),
    "batch_norm_forward_inference": lambda m, x, o: m.batch_norm_forward_inference(
        x, None, None, torch.zeros(4), torch.ones(4), out=o
    ),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_out_with_grad_raises_and_writes_nothing(name):
    x = randn(*X4).requires_grad_()
    out = torch.full((2, 4, 3, 3), 7.0)
    out = out[..., :1] if name == "linear" else out
    out = out[..., 0] if name == "reduce_tensor" else out
    with pytest.raises(rtdnn.BadParamError, match="automatic differentiation"):
        CALLS[name](rtdnn, x, out)
    assert (out == 7.0).all()


def test_beta_with_grad_raises():
    x = randn(*X4).requires_grad_()
    with pytest.raises(rtdnn.BadParamError, match="beta"):  # as without grad: beta needs out
        rtdnn.activation_forward(x, "relu", beta=1.0)
    out = torch.full(X4, 7.0)
    with pytest.raises(rtdnn.BadParamError, match="automatic differentiation"):
        rtdnn.activation_forward(x, "relu", beta=1.0, out=out)
    assert (out == 7.0).all()


@pytest.mark.parametrize(
    "call",
    [
        lambda x: rtdnn.add_tensor(torch.ones(4, 1, 1), x),
        lambda x: rtdnn.add_tensor(x, torch.ones(*X4)),
        lambda x: rtdnn.scale_tensor(x, 2.0),
        lambda x: rtdnn.set_tensor(x, 0.0),
    ],
    ids=["add_tensor_c", "add_tensor_a", "scale_tensor", "set_tensor"],
)
def test_in_place_functions_refuse_recorded_calls(call):
    x = randn(*X4).requires_grad_()
    before = x.detach().clone()
    with pytest.raises(rtdnn.BadParamError, match="in place"):
        call(x)
    assert torch.equal(x.detach(), before)
    with torch.no_grad():
        call(x)  # allowed without grad, as torch's in-place ops


@pytest.mark.parametrize("name", sorted(CALLS))
def test_calls_without_grad_are_the_plain_primitives(name):
    x = randn(*X4)
    plain = CALLS[name](rtdnn.ops, x, None)
    ours = CALLS[name](rtdnn, x, None)
    x.requires_grad_()
    with torch.no_grad():
        ours_no_grad = CALLS[name](rtdnn, x, None)
    for y in (ours, ours_no_grad):
        for t, p in zip(*(r if isinstance(r, tuple) else (r,) for r in (y, plain)), strict=True):
            assert not t.requires_grad
            assert torch.equal(t, p) and t.stride() == p.stride()


PUBLIC_FORWARD = sorted(CALLS) + ["add_tensor", "cross_entropy", "scale_tensor", "set_tensor"]


@pytest.mark.parametrize("name", PUBLIC_FORWARD)
def test_top_level_functions_keep_the_plain_signatures(name):
    def params(fn):
        sig = inspect.signature(fn)
        return [(p.name, p.kind, p.default) for p in sig.parameters.values()]

    ours = getattr(rtdnn, name)
    assert params(ours) == params(getattr(rtdnn.ops, name))
    assert ours.__name__ == name and ours is not getattr(rtdnn.ops, name)


def test_conv_tuning_arguments_reach_every_direction(monkeypatch):
    seen = {}

    def spy(name):
        plain = getattr(rtdnn.ops, name)

        def call(*args, **kwargs):
            seen[name] = {k: kwargs.get(k) for k in ("algo", "workspace_limit", "math")}
            return plain(*args, **kwargs)

        monkeypatch.setattr(rtdnn.ops, name, call)

    for name in ("conv_forward", "conv_backward_data", "conv_backward_filter"):
        spy(name)
    x, w = randn(1, 2, 4, 4).requires_grad_(), randn(3, 2, 3, 3, seed=2).requires_grad_()
    y = rtdnn.conv_forward(x, w, algo="GEMM", workspace_limit=1 << 20, math=MATH)
    y.sum().backward()
    assert seen["conv_forward"] == {"algo": "GEMM", "workspace_limit": 1 << 20, "math": MATH}
    for name in ("conv_backward_data", "conv_backward_filter"):
        assert seen[name] == {"algo": None, "workspace_limit": 1 << 20, "math": MATH}


def test_custom_ops_with_the_tuning_arguments_pass_opcheck():
    # The dispatcher's road (torch.compile, fake tensors), with and without the trailing
    # arguments the functional API passes.
    x, w, b = randn(2, 3, 5, 5), randn(4, 3, 3, 3, seed=2), randn(4, seed=3)
    conv = ([1, 1], [1, 1], [1, 1], 1, "cross_correlation")
    for args in ((*conv,), (*conv, "auto", None, MATH), (*conv, "auto", None, MATH, 0.3)):
        torch.library.opcheck(autograd.conv_forward.op, (*_leaves([x, w, b]), *args))
    x, w = randn(3, 16), randn(4, 16, seed=2)
    for args in (("relu",), (None, MATH), ("relu", MATH, 0.3)):
        torch.library.opcheck(autograd.linear.op, (*_leaves([x, w]), None, *args))
    # alpha != 1 where the backward recomputes the unscaled output from x.
    (x,) = _leaves([randn(2, 3, 4)])
    torch.library.opcheck(autograd.activation_forward.op, (x, "tanh", [], 0.3))
    torch.library.opcheck(autograd.softmax_forward.op, (x, "accurate", "channel", 0.3))
    torch.library.opcheck(autograd.reduce_tensor.op, (x, "mul", [1], 0.3))


def test_torch_compile_traces_the_functional_api_with_grad():
    x, w = randn(2, 3, 5, 5), randn(4, 3, 3, 3, seed=2)

    def f(x, w):
        y = rtdnn.conv_forward(x, w, padding=1, math=MATH)
        return rtdnn.activation_forward(y, "relu").sum()

    w_compiled, w_eager = _leaves([w, w])
    torch.compile(f, fullgraph=True, backend="aot_eager")(x, w_compiled).backward()
    f(x, w_eager).backward()
    assert torch.equal(w_compiled.grad, w_eager.grad)
