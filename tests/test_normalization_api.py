"""Argument validation, dispatch details and torch.compile for the normalization API."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from _norm_helpers import check, make  # noqa: E402

import rtdnn  # noqa: E402
import rtdnn.nn as rnn  # noqa: E402
from rtdnn import reference as R  # noqa: E402
from rtdnn.algos import norm as engine  # noqa: E402
from rtdnn.core import BadParamError, NotSupportedError  # noqa: E402

X = make((2, 3, 4))
C3 = make((3,), seed=1)


def _bn_train(**kw):
    args = dict(x=X)
    args.update(kw)
    x = args.pop("x")
    return rtdnn.batch_norm_forward_training(x, **args)


BN_TRAIN_ERRORS = [
    (dict(x=[1.0]), "x="),
    (dict(x=torch.ones(2, 3, dtype=torch.int32)), "x.dtype"),
    (dict(x=torch.ones(4)), "x.dim"),
    (dict(x=torch.ones(1, 1, 1, 1, 1, 1)), "x.dim"),
    (dict(x=torch.ones(2, 0)), "x.shape"),  # no channels (a batch of 0 is fine)
    (dict(mode="volume"), "mode"),
    (dict(weight=make((4,))), "weight.shape"),
    (dict(bias=make((3, 4))), "bias.shape"),
    (dict(weight=torch.ones(3, dtype=torch.int64)), "weight.dtype"),
    (dict(running_mean=C3), "running_var"),
    (dict(running_mean=C3, running_var=make((4,))), "running_var.shape"),
    (dict(running_mean=make((6,))[::2], running_var=C3.clone()), "running_mean.stride"),
    (dict(momentum="0.1"), "momentum"),
    (dict(momentum=float("nan")), "momentum"),
    (dict(eps=-1e-5), "eps"),
    (dict(eps=True), "eps"),
    (dict(z=make((2, 3, 5))), "z.shape"),
    (dict(z=X.half()), "z.dtype"),
    (dict(activation="gelu"), "activation"),
    (dict(alpha="1"), "alpha"),
    (dict(beta=1.0), "beta"),
    (dict(beta=1.0, out=make((2, 3, 5))), "out.shape"),
    (dict(out=X.double()), "out.dtype"),
    (dict(out=torch.zeros(1, 3, 1).expand(2, 3, 4)), "overlapping"),
    (dict(x=make((1, 3))), "more than one value"),
]


@pytest.mark.parametrize("kwargs, match", BN_TRAIN_ERRORS)
def test_batch_norm_training_validation(kwargs, match):
    with pytest.raises(BadParamError, match=match):
        _bn_train(**kwargs)


def test_repeated_calls_are_validated_too():
    # The second call with the same signature takes the cached path: scalars still checked.
    for _ in range(2):
        with pytest.raises(BadParamError, match="eps"):
            rtdnn.batch_norm_forward_training(X, eps=-1.0)
        with pytest.raises(BadParamError, match="beta"):
            rtdnn.layer_norm_forward(X, 4, beta="0.5", out=torch.empty_like(X))
        with pytest.raises(BadParamError, match="training"):
            rtdnn.batch_norm_backward(X, X, C3, C3, training=1)
    rtdnn.batch_norm_backward(X, X, C3, C3.abs(), training=True)
    with pytest.raises(BadParamError, match="training"):
        rtdnn.batch_norm_backward(X, X, C3, C3.abs(), training=1)


def test_errors_leave_outputs_untouched():
    out = torch.full_like(X, float("nan"))
    with pytest.raises(BadParamError):
        rtdnn.batch_norm_forward_training(X, make((4,)), out=out)
    with pytest.raises(BadParamError):
        rtdnn.layer_norm_forward(X, 5, out=out)
    assert out.isnan().all()


def test_batch_norm_inference_and_backward_validation():
    with pytest.raises(BadParamError, match="running_mean"):
        rtdnn.batch_norm_forward_inference(X, None, None, None, C3)
    with pytest.raises(BadParamError, match="running_var.shape"):
        rtdnn.batch_norm_forward_inference(X, None, None, C3, make((4,)))
    with pytest.raises(BadParamError, match="mode"):
        rtdnn.batch_norm_forward_inference(X, None, None, C3, C3, mode="x")
    per_act = make((3, 4))
    with pytest.raises(BadParamError, match="running_mean.shape"):
        rtdnn.batch_norm_forward_inference(X, None, None, C3, C3, mode="per_activation")
    rtdnn.batch_norm_forward_inference(X, None, None, per_act, per_act.abs(), mode="per_activation")
    _, m, r = rtdnn.batch_norm_forward_training(X)
    with pytest.raises(BadParamError, match="dy.shape"):
        rtdnn.batch_norm_backward(make((2, 3, 5)), X, m, r)
    with pytest.raises(BadParamError, match="dy.dtype"):
        rtdnn.batch_norm_backward(X.half(), X, m, r)
    with pytest.raises(BadParamError, match="saved_mean.shape"):
        rtdnn.batch_norm_backward(X, X, make((4,)), r)
    with pytest.raises(BadParamError, match="saved_invstd"):
        rtdnn.batch_norm_backward(X, X, m, None)
    with pytest.raises(BadParamError, match="training"):
        rtdnn.batch_norm_backward(X, X, m, r, training=1)
    with pytest.raises(BadParamError, match="activation"):
        rtdnn.batch_norm_backward(X, X, m, r, activation="tanh")
    with pytest.raises(BadParamError, match="beta"):
        rtdnn.batch_norm_backward(X, X, m, r, beta=0.5)


def test_layer_and_rms_norm_validation():
    for bad in (5, (3, 5), [], "4", (2, 3, 4, 1)):
        with pytest.raises(BadParamError, match="normalized_shape"):
            rtdnn.layer_norm_forward(X, bad)
    with pytest.raises(BadParamError, match="weight.shape"):
        rtdnn.layer_norm_forward(X, 4, make((3,)))
    with pytest.raises(BadParamError, match="eps"):
        rtdnn.layer_norm_forward(X, 4, eps=-1.0)
    with pytest.raises(BadParamError, match="eps"):
        rtdnn.rms_norm_forward(X, 4, eps="small")
    with pytest.raises(BadParamError, match="x="):
        rtdnn.rms_norm_forward(None, 4)
    _, mean, rstd = rtdnn.layer_norm_forward(X, 4)
    with pytest.raises(BadParamError, match="mean.shape"):
        rtdnn.layer_norm_backward(X, X, 4, mean[0], rstd)
    with pytest.raises(BadParamError, match="rstd.shape"):
        rtdnn.rms_norm_backward(X, X, [3, 4], rstd)
    with pytest.raises(BadParamError, match="param_grads"):
        rtdnn.layer_norm_backward(X, X, 4, mean, rstd, param_grads="yes")
    with pytest.raises(BadParamError, match="dy.shape"):
        rtdnn.layer_norm_backward(X[0], X, 4, mean, rstd)


def test_group_and_instance_norm_validation():
    for bad in (0, -1, 2, True, 1.5):
        with pytest.raises(BadParamError, match="num_groups"):
            rtdnn.group_norm_forward(X, bad)
    with pytest.raises(BadParamError, match="weight.shape"):
        rtdnn.group_norm_forward(X, 3, make((4,)))
    with pytest.raises(BadParamError, match="x.dim"):
        rtdnn.instance_norm_forward(make((2, 3)))
    _, mean, rstd = rtdnn.group_norm_forward(X, 3)
    with pytest.raises(BadParamError, match="mean.shape"):
        rtdnn.group_norm_backward(X, X, 1, mean, rstd)
    with pytest.raises(BadParamError, match="rstd.shape"):
        rtdnn.instance_norm_backward(X, X, mean, rstd[:, :2])


def test_error_classes_derive_from_builtins():
    with pytest.raises(ValueError):
        rtdnn.group_norm_forward(X, 2)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    import rtdnn.core.handle as handle

    monkeypatch.setattr(handle, "INTERPRETED", False)
    engine.clear_plans()  # validated signatures are remembered: forget them
    with pytest.raises(NotSupportedError, match="TRITON_INTERPRET"):
        rtdnn.layer_norm_forward(X, 4)
    engine.clear_plans()


# -- geometry -------------------------------------------------------------------------------


def test_channels_last_batch_norm_merges_to_one_reduced_dim():
    x = make((2, 3, 4, 5), layout="channels_last")
    g = engine.geometry(x.shape, (1,), [x.stride()])
    assert g.rsize == (1, 1, 1, 40) and g.layouts[0].r[3] == 3 and g.layouts[0].k[3] == 1
    x = make((2, 3, 4, 5))
    g = engine.geometry(x.shape, (1,), [x.stride()])
    assert g.rsize == (1, 1, 2, 20) and g.layouts[0].r[3] == 1


def test_geometry_limits():
    with pytest.raises(NotSupportedError, match="2\\*\\*31"):
        engine.geometry((2, 3), (1,), [(2**31, 1)])
    shape = (2,) * 6
    strides = tuple(2 ** (2 * i) for i in range(6))  # no two dims merge
    with pytest.raises(NotSupportedError, match="at most 4"):
        engine.geometry(shape, (0, 1, 2, 3, 4), [strides])


def test_layer_norm_of_unmergeable_view_falls_back_to_a_copy():
    base = make((2, 3, 2, 3, 2, 3, 4))
    x = base[:, ::2, :, ::2, :, ::2]  # six leading dims that do not merge
    y, mean, rstd = rtdnn.layer_norm_forward(x, 4)
    check(y, R.layer_norm_forward(x, 4)[0])


def test_per_activation_batch_norm_channels_last():
    x = make((4, 3, 2, 2), layout="channels_last")
    w = make((3, 2, 2), seed=1)
    y, mean, invstd = rtdnn.batch_norm_forward_training(x, w, mode="per_activation")
    ref = R.batch_norm_forward_training(x, w, mode="per_activation")
    check(y, ref[0])
    assert mean.shape == (3, 2, 2)


# -- torch.compile --------------------------------------------------------------------------


def test_torch_compile_fullgraph_smoke():
    model = torch.nn.Sequential(
        rnn.BatchNorm2d(4), rnn.GroupNorm(2, 4), rnn.InstanceNorm2d(4, affine=True)
    )
    ln, rms = rnn.LayerNorm(9), rnn.RMSNorm(9)

    def f(x, z):
        y = model(x)
        y = rtdnn.batch_norm(y, None, None, None, None, True, z=z, activation="relu")
        return rms(ln(y.flatten(2))).sum()

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    x = make((2, 4, 3, 3)).requires_grad_()
    z = make((2, 4, 3, 3), seed=1).requires_grad_()
    out = compiled(x, z)
    out.backward()
    assert x.grad is not None and z.grad is not None
    assert int(model[0].num_batches_tracked) == 1
    x2 = x.detach().clone().requires_grad_()
    z2 = z.detach().clone().requires_grad_()
    model[0].num_batches_tracked.zero_()
    f(x2, z2).backward()
    check(x.grad, x2.grad)
