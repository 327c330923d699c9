"""Validation: every bad argument raises BadParamError (or NotSupportedError) naming the
parameter, before anything is written: a given `out` keeps its prior values."""

from __future__ import annotations

import pytest
import torch

import rtdnn
from rtdnn.algos import ALGORITHMS
from rtdnn.core import ConvDesc, ConvProblem, Direction, TensorDesc

# A valid grouped problem: x (1, 4, 5, 5), w (6, 2, 3, 3), groups 2 -> y (1, 6, 3, 3).
X_SHAPE, W_SHAPE, Y_SHAPE = (1, 4, 5, 5), (6, 2, 3, 3), (1, 6, 3, 3)
GROUPS = 2


def _t(shape, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(7)).to(dtype)


def forward(x=None, w=None, **kw):
    kw.setdefault("groups", GROUPS)
    kw.setdefault("math", "fp32")
    x = _t(X_SHAPE) if x is None else x
    w = _t(W_SHAPE) if w is None else w
    return rtdnn.conv_forward(x, w, **kw)


def backward_data(dy=None, w=None, x_shape=X_SHAPE, **kw):
    kw.setdefault("groups", GROUPS)
    kw.setdefault("math", "fp32")
    dy = _t(Y_SHAPE) if dy is None else dy
    w = _t(W_SHAPE) if w is None else w
    return rtdnn.conv_backward_data(dy, w, x_shape, **kw)


def backward_filter(x=None, dy=None, w_shape=W_SHAPE, **kw):
    kw.setdefault("groups", GROUPS)
    kw.setdefault("math", "fp32")
    x = _t(X_SHAPE) if x is None else x
    dy = _t(Y_SHAPE) if dy is None else dy
    return rtdnn.conv_backward_filter(x, dy, w_shape, **kw)


RESULT_SHAPE = {forward: Y_SHAPE, backward_data: X_SHAPE, backward_filter: W_SHAPE}
DIRECTIONS = [forward, backward_data, backward_filter]
DIRECTION_IDS = ["forward", "backward_data", "backward_filter"]


def assert_rejected(call, name: str, out: torch.Tensor | None = None, error=rtdnn.BadParamError):
    """call(out=out) raises `error` whose message names `name`, and leaves `out` as it was."""
    before = None if out is None else out.clone()
    kwargs = {} if out is None else {"out": out}
    with pytest.raises(error) as info:
        call(**kwargs)
    assert name in str(info.value), f"{name!r} not named in: {info.value}"
    if out is not None:
        assert torch.equal(out, before), "out was modified although the call was rejected"
    return info.value


def valid_out(fn, dtype=torch.float32):
    return _t(RESULT_SHAPE[fn], dtype) * 3 + 1


# -- the same mistake in every direction -----------------------------------------------------

# (id, parameter named in the message, {direction: kwargs}); kwargs are passed to the helpers.
COMMON_CASES = [
    ("negative padding", "padding", dict(padding=-1)),
    ("negative padding in one dim", "padding", dict(padding=(0, -2))),
    ("stride 0", "stride", dict(stride=0)),
    ("stride with a zero entry", "stride", dict(stride=(1, 0))),
    ("stride of wrong length", "stride", dict(stride=(1, 1, 1))),
    ("stride not an int", "stride", dict(stride=1.5)),
    ("dilation 0", "dilation", dict(dilation=0)),
    ("groups 0", "groups", dict(groups=0)),
    ("groups a bool", "groups", dict(groups=True)),
    ("padding of wrong length", "padding", dict(padding=[1])),
    ("dilation of wrong length", "dilation", dict(dilation=(1, 1, 1))),
    ("groups not dividing C", "groups", dict(groups=3)),  # C=4, K=6
    ("unknown mode", "mode", dict(mode="correlation")),
    ("unknown algo", "algo", dict(algo="NO_SUCH_ALGO")),
    ("bad math mode", "math", dict(math="fp16")),
    ("negative workspace_limit", "workspace_limit", dict(workspace_limit=-1)),
    ("alpha not a number", "alpha", dict(alpha="1")),
    ("beta not a number", "beta", dict(beta=None)),
]


@pytest.mark.parametrize("fn", DIRECTIONS, ids=DIRECTION_IDS)
@pytest.mark.parametrize(
    "name, kwargs", [c[1:] for c in COMMON_CASES], ids=[c[0] for c in COMMON_CASES]
)
def test_bad_conv_parameter(fn, name, kwargs):
    assert_rejected(lambda **o: fn(**kwargs, **o), name, valid_out(fn))


@pytest.mark.parametrize("fn", DIRECTIONS, ids=DIRECTION_IDS)
def test_groups_not_dividing_k(fn):
    """C=4 and groups=4 divide each other, but K=6 is not a multiple of 4."""
    w = _t((6, 1, 3, 3))
    call = {
        forward: lambda **o: forward(w=w, groups=4, **o),
        backward_data: lambda **o: backward_data(w=w, groups=4, **o),
        backward_filter: lambda **o: backward_filter(w_shape=(6, 1, 3, 3), groups=4, **o),
    }[fn]
    err = assert_rejected(call, "groups", valid_out(fn))
    assert "K=6" in str(err)


@pytest.mark.parametrize("fn", DIRECTIONS, ids=DIRECTION_IDS)
def test_channel_mismatch(fn):
    """w.shape[1] must be C/groups = 2; 3 is not."""
    w_shape = (6, 3, 3, 3)
    call = {
        forward: lambda **o: forward(w=_t(w_shape), **o),
        backward_data: lambda **o: backward_data(w=_t(w_shape), **o),
        backward_filter: lambda **o: backward_filter(w_shape=w_shape, **o),
    }[fn]
    out = valid_out(fn) if fn is not backward_filter else _t(w_shape)
    assert_rejected(call, "w.shape[1]", out)


@pytest.mark.parametrize("fn", DIRECTIONS, ids=DIRECTION_IDS)
def test_output_size_below_one(fn):
    """A 7x7 filter does not fit a 5x5 input without padding."""
    w_shape = (6, 2, 7, 7)
    call = {
        forward: lambda **o: forward(w=_t(w_shape), **o),
        backward_data: lambda **o: backward_data(w=_t(w_shape), **o),
        backward_filter: lambda **o: backward_filter(w_shape=w_shape, **o),
    }[fn]
    out = valid_out(fn) if fn is not backward_filter else _t(w_shape)
    assert_rejected(call, "output size", out)


@pytest.mark.parametrize("fn", DIRECTIONS, ids=DIRECTION_IDS)
def test_output_size_below_one_from_dilation(fn):
    assert_rejected(lambda **o: fn(dilation=3, **o), "output size", valid_out(fn))


@pytest.mark.parametrize("fn", DIRECTIONS, ids=DIRECTION_IDS)
def test_beta_without_out(fn):
    assert_rejected(lambda: fn(beta=0.5), "beta")


@pytest.mark.parametrize("fn", DIRECTIONS, ids=DIRECTION_IDS)
def test_out_of_wrong_shape(fn):
    shape = list(RESULT_SHAPE[fn])
    shape[-1] += 1
    assert_rejected(fn, "out.shape", _t(shape))


@pytest.mark.parametrize("fn", DIRECTIONS, ids=DIRECTION_IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64], ids=str)
def test_out_of_wrong_dtype(fn, dtype):
    assert_rejected(fn, "out.dtype", valid_out(fn, dtype))


@pytest.mark.parametrize("fn", DIRECTIONS, ids=DIRECTION_IDS)
def test_out_overlapping_itself(fn):
    """A broadcast (expanded) view cannot be written element by element."""
    shape = RESULT_SHAPE[fn]
    out = _t((1, shape[1], *([1] * (len(shape) - 2)))).expand(*shape)
    assert_rejected(fn, "out", out)


def test_forced_algorithm_without_the_direction():
    """A forced algorithm that does not run the direction (fused Winograd has no
    backward-filter) is refused with NotSupportedError, and nothing is written; split-K runs
    every direction."""
    call = lambda **o: backward_filter(algo="WINOGRAD", **o)
    assert_rejected(call, "algo", valid_out(backward_filter), error=rtdnn.NotSupportedError)
    assert forward(algo="IMPLICIT_GEMM_SPLIT_K").dim() == len(W_SHAPE)
    assert backward_data(algo="IMPLICIT_GEMM_SPLIT_K").shape == X_SHAPE
    assert backward_filter(algo="IMPLICIT_GEMM_SPLIT_K").shape == W_SHAPE


@pytest.mark.parametrize("fn", DIRECTIONS, ids=DIRECTION_IDS)
def test_workspace_limit_below_gemm_need(fn):
    need = _gemm_workspace(fn)
    assert need > 0
    err = assert_rejected(
        lambda **o: fn(algo="GEMM", workspace_limit=need - 1, **o), "workspace_limit", valid_out(fn)
    )
    assert str(need) in str(err)


def _gemm_workspace(fn) -> int:
    direction = {forward: "forward", backward_data: "backward_data"}.get(fn, "backward_filter")
    conv = ConvDesc.create(2, 1, 0, 1, GROUPS, "cross_correlation", "fp32")
    p = ConvProblem.create(
        Direction(direction), TensorDesc.of(_t(X_SHAPE)), TensorDesc.of(_t(W_SHAPE)),
        TensorDesc.of(_t(Y_SHAPE)), conv, "cpu",
    )  # fmt: skip
    return ALGORITHMS["GEMM"].workspace_bytes(p)


# -- tensor arguments ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64, torch.bool], ids=str)
def test_forward_unsupported_dtype(dtype):
    x, w = _t(X_SHAPE).to(dtype), _t(W_SHAPE).to(dtype)
    assert_rejected(lambda **o: forward(x, w, **o), "x.dtype", valid_out(forward))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32], ids=str)
def test_backward_unsupported_dtype(dtype):
    dy, w = _t(Y_SHAPE).to(dtype), _t(W_SHAPE).to(dtype)
    assert_rejected(lambda **o: backward_data(dy, w, **o), "dy.dtype", valid_out(backward_data))
    x = _t(X_SHAPE).to(dtype)
    assert_rejected(lambda **o: backward_filter(x, dy, **o), "x.dtype", valid_out(backward_filter))


def test_mismatched_dtypes():
    half = lambda s: _t(s, torch.float16)
    assert_rejected(lambda **o: forward(w=half(W_SHAPE), **o), "w.dtype", valid_out(forward))
    assert_rejected(
        lambda **o: backward_data(w=half(W_SHAPE), **o), "w.dtype", valid_out(backward_data)
    )
    assert_rejected(
        lambda **o: backward_filter(dy=half(Y_SHAPE), **o), "dy.dtype", valid_out(backward_filter)
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="mismatched devices need a CUDA device")
def test_mismatched_devices():
    w = _t(W_SHAPE).cuda()
    assert_rejected(lambda **o: forward(w=w, **o), "w.device", valid_out(forward))


@pytest.mark.parametrize("shape", [(4, 5), (1, 4, 5, 5, 5, 5)], ids=["2-dim", "6-dim"])
def test_wrong_ndim(shape):
    x = _t(shape)
    assert_rejected(lambda **o: forward(x=x, **o), "x.dim()", valid_out(forward))
    assert_rejected(lambda **o: backward_data(dy=x, **o), "dy.dim()", valid_out(backward_data))
    assert_rejected(lambda **o: backward_filter(x=x, **o), "x.dim()", valid_out(backward_filter))


def test_w_ndim_differs_from_x():
    # The filter's rank sets the data's: the mismatch is reported on x (or dy).
    w = _t(W_SHAPE[:-1])
    assert_rejected(lambda **o: forward(w=w, **o), "x.dim()=4", valid_out(forward))
    assert_rejected(lambda **o: backward_data(w=w, **o), "dy.dim()=4", valid_out(backward_data))
    dy = _t(Y_SHAPE[:-1])
    assert_rejected(lambda **o: backward_filter(dy=dy, **o), "dy.dim()", valid_out(backward_filter))


def test_not_a_tensor():
    x = _t(X_SHAPE).numpy()
    assert_rejected(lambda **o: forward(x=x, **o), "x", valid_out(forward))


def test_zero_sized_dim_other_than_the_batch():
    """A batch of 0 gives an empty result (tests/test_dropin.py); an empty spatial dim does not."""
    x = _t((2, 4, 0, 5))
    assert_rejected(lambda **o: forward(x=x, **o), "shape")


def test_bias_of_wrong_length():
    assert_rejected(lambda **o: forward(bias=_t((5,)), **o), "bias.shape", valid_out(forward))


def test_bias_of_wrong_dtype_or_ndim():
    assert_rejected(
        lambda **o: forward(bias=_t((6,), torch.float16), **o), "bias.dtype", valid_out(forward)
    )
    assert_rejected(lambda **o: forward(bias=_t((1, 6)), **o), "bias.dim()", valid_out(forward))


def test_backward_data_bad_x_shape():
    assert_rejected(
        lambda **o: backward_data(x_shape=(1, 4, 5), **o), "x_shape", valid_out(backward_data)
    )
    assert_rejected(
        lambda **o: backward_data(x_shape=(1, 4, 5, "a"), **o), "x_shape", valid_out(backward_data)
    )


def test_backward_data_dy_inconsistent_with_x_shape():
    """x (1, 4, 6, 6) gives a 4x4 output; dy is 3x3."""
    out = _t((1, 4, 6, 6))
    assert_rejected(lambda **o: backward_data(x_shape=(1, 4, 6, 6), **o), "dy.shape", out)


def test_backward_filter_bad_w_shape():
    assert_rejected(
        lambda **o: backward_filter(w_shape=(6, 2, 3), **o), "w_shape", valid_out(backward_filter)
    )


def test_backward_filter_dy_inconsistent_with_x():
    dy = _t((1, 6, 4, 4))
    assert_rejected(lambda **o: backward_filter(dy=dy, **o), "dy.shape", valid_out(backward_filter))


# -- conv_backward_bias ----------------------------------------------------------------------


def test_backward_bias_errors():
    dy = _t(Y_SHAPE)
    out = _t((6,))
    assert_rejected(lambda **o: rtdnn.conv_backward_bias(_t((6, 3)), **o), "dy.dim()", out)
    assert_rejected(
        lambda **o: rtdnn.conv_backward_bias(dy.double(), **o), "dy.dtype", out.double()
    )
    assert_rejected(lambda: rtdnn.conv_backward_bias(dy, beta=1.0), "beta")
    assert_rejected(lambda **o: rtdnn.conv_backward_bias(dy, **o), "out.shape", _t((5,)))
    assert_rejected(lambda **o: rtdnn.conv_backward_bias(dy, **o), "out.dtype", out.half())


# -- algorithm queries -----------------------------------------------------------------------


@pytest.mark.parametrize("query", [rtdnn.get_conv_algorithm, rtdnn.find_conv_algorithms])
def test_query_errors(query):
    x, w = _t(X_SHAPE), _t(W_SHAPE)
    assert_rejected(lambda: query(x, w, groups=GROUPS, direction="sideways"), "direction")
    assert_rejected(lambda: query(x, w, groups=GROUPS, mode="fft"), "mode")
    assert_rejected(lambda: query(x, w, groups=GROUPS, math="tf16"), "math")
    assert_rejected(lambda: query(x, w, groups=3), "groups")
    assert_rejected(lambda: query(x, w.half(), groups=GROUPS), "w.dtype")
    assert_rejected(lambda: query(x.double(), w.double(), groups=GROUPS), "x.dtype")


def test_get_conv_algorithm_bad_preference_and_limit():
    x, w = _t(X_SHAPE), _t(W_SHAPE)
    get = rtdnn.get_conv_algorithm
    assert_rejected(lambda: get(x, w, groups=GROUPS, preference="smallest"), "preference")
    assert_rejected(lambda: get(x, w, groups=GROUPS, workspace_limit=-5), "workspace_limit")
    assert_rejected(lambda: get(x, w, groups=GROUPS, workspace_limit=1.5), "workspace_limit")


def test_errors_are_value_errors():
    """BadParamError is also a ValueError; NotSupportedError a NotImplementedError."""
    with pytest.raises(ValueError):
        forward(padding=-1)
    with pytest.raises(NotImplementedError):
        backward_filter(algo="WINOGRAD")
