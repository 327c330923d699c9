"""Bad input never gives a silent wrong answer: a sweep over every public function.

For each name in rtdnn.__all__ (a function added without a case here fails the first test):
  * an `out` that overlaps an input is refused (BadParamError naming out and the input), and
    nothing is written; where the op is elementwise and says so, `out` may be exactly an
    input and the result is then the same as out of place;
  * alpha, beta and every other real coefficient refuse NaN and infinities;
  * eps <= 0 and momentum outside [0, 1] are refused where the function takes them;
  * class targets outside [0, C) are refused (and the kernel never reads there).
Every refusal is checked to leave `out` and every input bit for bit as they were.
"""

import inspect
import math
from dataclasses import dataclass, field

import pytest
import torch

import rtdnn
import rtdnn.nn as rnn

# Arguments that must refuse NaN and infinities wherever a function takes them.
REAL_PARAMS = (
    "alpha", "beta", "alpha1", "alpha2", "coef", "eps", "momentum", "p", "lrn_alpha",
    "lrn_beta", "lrn_k", "label_smoothing",
)  # fmt: skip

# Public functions that take no argument swept here (the test checks that they still don't).
EXEMPT = {
    "activation_needs": "takes a mode name only",
    "attention_dropout_mask": "draws a mask from a seed and reads no tensor (bad input: "
    "test_attention)",
    "convert": "replaces modules; computes nothing itself",
    "find_conv_algorithms": "ranks algorithms; writes no user tensor",
    "get_conv_algorithm": "chooses an algorithm; writes no user tensor",
    "plan_conv": "plans micro-batches; writes no user tensor (bad input: test_conv_micro_batch)",
    "plan_network": "plans a converted model's convolutions; writes no user tensor (bad input: "
    "test_plan_integration)",
    "set_tensor": "writes a value (inf and NaN are values one may store) and reads no tensor",
}


def t(*shape, positive=False):
    v = torch.randn(shape)
    return v.abs() + 0.5 if positive else v


@dataclass
class Case:
    """A valid call: `args` by parameter name; `out_shape` of the written tensor (None if the
    function takes no out); `in_place`: the inputs that out may be exactly (elementwise ops);
    `out_param`: the name of the written tensor."""

    args: dict
    out_shape: tuple | None = None
    in_place: tuple = ()
    out_param: str = "out"
    extra: dict = field(default_factory=dict)


def _cases() -> dict:
    x3, x4 = (2, 3, 4), (1, 2, 4, 4)
    nc = (4, 3, 2, 2)
    se_weights = dict(w1=t(3, 2, 1, 1), b1=t(3), w2=t(2, 3, 1, 1), b2=t(2))
    se_x = t(*x4)
    se_saved = rtdnn.ops.squeeze_excitation_training(se_x, **se_weights)[1]
    return {
        "activation_forward": Case(dict(x=t(*x3), mode="leaky_relu"), x3, ("x",)),
        "activation_backward": Case(
            dict(dy=t(*x3), x=t(*x3), y=None, mode="leaky_relu"), x3, ("dy", "x")
        ),
        "adaptive_avg_pool": Case(dict(x=t(*x4), output_size=2), (1, 2, 2, 2)),
        "adaptive_avg_pool_backward": Case(dict(dy=t(1, 2, 2, 2), x_shape=x4), x4),
        "affine_grid": Case(dict(theta=t(2, 2, 3), size=(2, 3, 4, 5))),
        "add_tensor": Case(dict(a=t(*x3), c=t(*x3)), x3, ("a",), out_param="c"),
        "batch_norm": Case(
            dict(
                x=t(*nc),
                running_mean=t(3),
                running_var=t(3, positive=True),
                weight=t(3),
                bias=t(3),
                training=True,
                momentum=0.1,
                eps=1e-5,
            )
        ),  # fmt: skip
        "batch_norm_backward": Case(
            dict(
                dy=t(*nc),
                x=t(*nc),
                saved_mean=t(3),
                saved_invstd=t(3, positive=True),
                weight=t(3),
                bias=t(3),
            ),
            nc,
        ),  # fmt: skip
        "batch_norm_forward_inference": Case(
            dict(
                x=t(*nc),
                weight=t(3),
                bias=t(3),
                running_mean=t(3),
                running_var=t(3, positive=True),
                eps=1e-5,
            ),
            nc,
            ("x",),
        ),  # fmt: skip
        "batch_norm_forward_training": Case(
            dict(
                x=t(*nc),
                weight=t(3),
                bias=t(3),
                running_mean=t(3),
                running_var=t(3, positive=True),
                momentum=0.1,
                eps=1e-5,
            ),
            nc,
        ),  # fmt: skip
        "conv_backward_bias": Case(dict(dy=t(*x4)), (2,)),
        "conv_backward_data": Case(dict(dy=t(*x4), w=t(2, 2, 3, 3), x_shape=x4, padding=1), x4),
        "conv_backward_filter": Case(
            dict(x=t(*x4), dy=t(*x4), w_shape=(2, 2, 3, 3), padding=1), (2, 2, 3, 3)
        ),
        "conv_forward": Case(dict(x=t(*x4), w=t(2, 2, 3, 3), bias=t(2), padding=1), x4),
        "cross_entropy": Case(
            dict(logits=t(4, 3), target=torch.tensor([0, 2, 1, 1]), label_smoothing=0.1)
        ),
        "ctc_loss": Case(
            dict(
                log_probs=t(4, 2, 3).log_softmax(-1),
                targets=torch.tensor([[1, 2], [2, 2]]),
                input_lengths=(4, 3),
                target_lengths=(2, 1),
            )
        ),
        "dropout_backward": Case(dict(dy=t(*x3), p=0.5, seed=1), x3, ("dy",)),
        "dropout_forward": Case(dict(x=t(*x3), p=0.5, seed=1), x3, ("x",)),
        "grid_sample": Case(dict(input=t(1, 2, 3, 4), grid=t(1, 2, 2, 2))),
        "group_norm": Case(dict(x=t(2, 4, 3), num_groups=2, weight=t(4), bias=t(4), eps=1e-5)),
        "group_norm_backward": Case(
            dict(
                dy=t(2, 4, 3),
                x=t(2, 4, 3),
                num_groups=2,
                mean=t(2, 2),
                rstd=t(2, 2, positive=True),
                weight=t(4),
            ),
            (2, 4, 3),
        ),  # fmt: skip
        "group_norm_forward": Case(
            dict(x=t(2, 4, 3), num_groups=2, weight=t(4), bias=t(4), eps=1e-5), (2, 4, 3)
        ),
        "instance_norm": Case(
            dict(
                x=t(*x3), running_mean=t(3), running_var=t(3, positive=True), momentum=0.1, eps=1e-5
            )
        ),  # fmt: skip
        "instance_norm_backward": Case(
            dict(dy=t(*x3), x=t(*x3), mean=t(2, 3), rstd=t(2, 3, positive=True), weight=t(3)),
            x3,
        ),
        "instance_norm_forward": Case(dict(x=t(*x3), weight=t(3), bias=t(3), eps=1e-5), x3),
        "layer_norm": Case(dict(x=t(*x3), normalized_shape=[4], weight=t(4), bias=t(4), eps=1e-5)),
        "layer_norm_backward": Case(
            dict(
                dy=t(*x3),
                x=t(*x3),
                normalized_shape=4,
                mean=t(2, 3),
                rstd=t(2, 3, positive=True),
                weight=t(4),
            ),
            x3,
        ),  # fmt: skip
        "layer_norm_forward": Case(
            dict(x=t(*x3), normalized_shape=4, weight=t(4), bias=t(4), eps=1e-5), x3
        ),
        "linear": Case(dict(x=t(3, 16), w=t(5, 16), bias=t(5)), (3, 5)),
        "linear_backward_bias": Case(dict(dy=t(3, 5)), (5,)),
        "linear_backward_data": Case(dict(dy=t(3, 5), w=t(5, 16)), (3, 16)),
        "linear_backward_weight": Case(dict(x=t(3, 16), dy=t(3, 5)), (5, 16)),
        "lrn_backward": Case(dict(dy=t(1, 4, 3, 3), x=t(1, 4, 3, 3), y=None, size=3), (1, 4, 3, 3)),
        "lrn_forward": Case(dict(x=t(1, 4, 3, 3), size=3), (1, 4, 3, 3)),
        "op_tensor": Case(dict(a=t(*x3), b=t(*x3), op="add"), x3, ("a", "b")),
        "pooling_backward": Case(
            dict(dy=t(1, 2, 2, 2), x=t(*x4), y=None, mode="max", window=2), x4
        ),
        "pooling_forward": Case(dict(x=t(*x4), mode="max", window=2), (1, 2, 2, 2)),
        "reduce_tensor": Case(dict(x=t(*x3), op="add", dims=1), (2, 1, 4)),
        "rms_norm": Case(dict(x=t(*x3), normalized_shape=[4], weight=t(4), eps=1e-5)),
        "rms_norm_backward": Case(
            dict(dy=t(*x3), x=t(*x3), normalized_shape=4, rstd=t(2, 3, positive=True), weight=t(4)),
            x3,
        ),  # fmt: skip
        "rms_norm_forward": Case(dict(x=t(*x3), normalized_shape=4, weight=t(4), eps=1e-5), x3),
        "rnn": Case(
            dict(
                input=t(3, 2, 3),
                hx=t(1, 2, 4),
                weights=[t(12, 3), t(12, 4), t(12), t(12)],
                mode="gru",
            )
        ),  # fmt: skip
        "scale_tensor": Case(dict(y=t(*x3), alpha=2.0)),
        "scaled_dot_product_attention": Case(
            dict(query=t(1, 2, 3, 16), key=t(1, 2, 5, 16), value=t(1, 2, 5, 16), is_causal=True)
        ),
        "softmax_backward": Case(dict(y=t(*x3), dy=t(*x3)), x3),
        "squeeze_excitation": Case(dict(x=t(*x4), **se_weights)),
        "squeeze_excitation_backward": Case(dict(dy=t(*x4), x=se_x, saved=se_saved, **se_weights)),
        "softmax_forward": Case(dict(x=t(*x3)), x3),
        "transform_tensor": Case(dict(x=t(*x3)), x3, ("x",)),
    }


def case(name: str) -> Case:
    torch.manual_seed(0)
    return _cases()[name]


FUNCTIONS = [n for n in rtdnn.__all__ if not isinstance(getattr(rtdnn, n), type)]
CASE_NAMES = sorted(_cases())


def params(name: str) -> set:
    return set(inspect.signature(getattr(rtdnn, name)).parameters)


def with_param(*wanted: str) -> list:
    return [(n, p) for n in CASE_NAMES for p in wanted if p in params(n)]


def tensors(args: dict) -> dict:
    return {k: v for k, v in args.items() if isinstance(v, torch.Tensor)}


def snapshot(args: dict) -> dict:
    return {k: v.clone() for k, v in tensors(args).items()}


def assert_unchanged(args: dict, before: dict) -> None:
    """Bit for bit (NaN poison included)."""
    for k, v in before.items():
        now = args[k]
        assert torch.equal(now.view(torch.uint8), v.view(torch.uint8)), f"{k} was written"


def poisoned(shape) -> torch.Tensor:
    return torch.full(shape, math.nan)


def refused(fn, args: dict, *names: str) -> None:
    """fn(**args) raises BadParamError whose message names every one of `names`, and leaves
    every tensor argument as it was."""
    before = snapshot(args)
    with pytest.raises(rtdnn.BadParamError) as e:
        fn(**args)
    for n in names:
        assert n in str(e.value), f"{n!r} not named in: {e.value}"
    assert_unchanged(args, before)


# -- every public function is swept -----------------------------------------------------


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_public_function_has_a_case(name):
    swept = set(REAL_PARAMS) | {"out", "target"}
    if name in EXEMPT:
        assert not params(name) & swept, f"{name} now takes {params(name) & swept}: add a case"
    else:
        assert name in CASE_NAMES, f"{name}: add a case to tests/test_bad_input.py"
        if "out" in params(name):
            assert case(name).out_shape is not None, f"{name} takes out: give the case out_shape"


def test_valid_calls_succeed():
    """The cases themselves are valid, so every refusal below is due to the one bad value."""
    for name in CASE_NAMES:
        c = case(name)
        kwargs = dict(c.args)
        if c.out_shape is not None and c.out_param == "out":
            kwargs["out"] = poisoned(c.out_shape)
        getattr(rtdnn, name)(**kwargs)


# -- out overlapping an input ------------------------------------------------------------


def _overlapping(inp: torch.Tensor, out_shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input, out, buffer): a contiguous copy of `inp` at the start of a byte buffer, and an
    out starting one element later, so they share all but one element; the rest is NaN."""
    n_in, n_out = inp.numel(), math.prod(out_shape)
    buf = torch.full((n_in + n_out + 1,), math.nan, dtype=inp.dtype)
    x = buf[:n_in].view(inp.shape)
    x.copy_(inp)
    out = buf[1 : 1 + n_out].view(out_shape)
    return x, out, buf


OVERLAP = [
    (n, k) for n, c in _cases().items() if c.out_shape is not None for k in tensors(c.args)
    if k != c.out_param
]  # fmt: skip


@pytest.mark.parametrize("name,input_name", OVERLAP)
def test_out_partly_overlapping_an_input_is_refused(name, input_name):
    c = case(name)
    args = dict(c.args)
    args[input_name], out, buf = _overlapping(args[input_name], c.out_shape)
    args[c.out_param] = out
    before = buf.clone()
    refused(getattr(rtdnn, name), args, c.out_param, input_name, "overlap")
    assert torch.equal(buf.view(torch.int32), before.view(torch.int32)), "written"


EXACT = [
    (n, k) for n, k in OVERLAP
    if tuple(_cases()[n].args[k].shape) == tuple(_cases()[n].out_shape)
]  # fmt: skip


@pytest.mark.parametrize("name,input_name", EXACT)
def test_out_that_is_an_input(name, input_name):
    """Refused, or computed as out of place for the ops documented as elementwise."""
    c = case(name)
    fn = getattr(rtdnn, name)
    args = dict(c.args)
    if input_name not in c.in_place:
        args[c.out_param] = args[input_name]
        refused(fn, args, c.out_param, input_name, "overlap")
        return
    args[c.out_param] = args[input_name]
    # The same values in separate tensors (beta = 0 ignores out, except for add_tensor's c).
    expected = fn(**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()})
    got = fn(**args)
    assert got is args[input_name] or got.data_ptr() == args[input_name].data_ptr()
    assert torch.equal(got, expected), (got - expected).abs().max()


def test_activation_in_place_keeps_working():
    x = torch.randn(2, 3, 4)
    ref = torch.relu(x)
    y = rtdnn.activation_forward(x, "relu", out=x)
    assert y is x and torch.equal(x, ref)


def test_interleaved_views_are_refused_not_raced():
    """Elementwise ops take out == x exactly, never another view of the same memory."""
    base = torch.randn(8, 4)
    x, out = base[:, :2], base[:, 1:3]
    refused(rtdnn.activation_forward, dict(x=x, mode="relu", out=out), "out", "x")


def test_reported_conv_in_place_case():
    x = torch.randn(1, 16, 5, 5)
    w = torch.randn(16, 16, 3, 3)
    refused(rtdnn.conv_forward, dict(x=x, w=w, padding=1, out=x), "out", "x")


# -- non-finite reals, eps, momentum -------------------------------------------------------


def _call_with(name: str, param: str, value) -> tuple:
    c = case(name)
    args = dict(c.args)
    args[param] = value
    if c.out_shape is not None and c.out_param == "out":
        args["out"] = poisoned(c.out_shape)  # also makes beta != 0 legal
    return getattr(rtdnn, name), args


@pytest.mark.parametrize("name,param", with_param(*REAL_PARAMS))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_reals_are_refused(name, param, value):
    fn, args = _call_with(name, param, value)
    refused(fn, args, param)


@pytest.mark.parametrize("name,param", with_param("eps"))
@pytest.mark.parametrize("value", [0.0, -1e-5])
def test_eps_must_be_positive(name, param, value):
    fn, args = _call_with(name, param, value)
    refused(fn, args, "eps")


@pytest.mark.parametrize("name,param", with_param("momentum"))
@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_momentum_is_a_factor_in_0_1(name, param, value):
    fn, args = _call_with(name, param, value)
    refused(fn, args, "momentum")


@pytest.mark.parametrize("param,value", [("lrn_k", 0.0), ("lrn_alpha", -1e-4), ("lrn_beta", -0.5)])
@pytest.mark.parametrize("name", ["lrn_forward", "lrn_backward"])
def test_lrn_constants_that_make_the_base_non_positive(name, param, value):
    fn, args = _call_with(name, param, value)
    refused(fn, args, param)


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_dropout_probability_range(value):
    fn, args = _call_with("dropout_forward", "p", value)
    refused(fn, args, "p")


@pytest.mark.parametrize(
    "module",
    [
        lambda: rnn.BatchNorm2d(3, eps=0.0),
        lambda: rnn.BatchNorm2d(3, momentum=math.nan),
        lambda: rnn.InstanceNorm2d(3, eps=0.0),
        lambda: rnn.InstanceNorm2d(3, momentum=math.nan, track_running_stats=True),
        lambda: rnn.GroupNorm(1, 3, eps=0.0),
        lambda: rnn.LayerNorm(2, eps=0.0),
        lambda: rnn.RMSNorm(2, eps=-1.0),
    ],
)
def test_modules_that_torch_builds_refuse_at_the_call(module):
    m = module()
    x = torch.randn(2, 3, 2, 2)
    # num_batches_tracked counts the call before it runs, as in torch: not compared.
    state = {k: v.clone() for k, v in m.state_dict().items() if "num_batches" not in k}
    with pytest.raises(rtdnn.BadParamError, match="eps|momentum"):
        m(x)
    for k, v in state.items():
        assert torch.equal(m.state_dict()[k], v), f"{k} changed"


# -- class targets ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [3, -3, 2**32, -(2**40)])
def test_targets_outside_the_classes_are_refused(bad):
    logits = torch.randn(2, 3)
    target = torch.tensor([0, bad])
    with pytest.raises(rtdnn.BadParamError, match=f"target={bad}"):
        rtdnn.cross_entropy(logits, target)
    with pytest.raises(rtdnn.BadParamError, match="target"):
        rnn.CrossEntropyLoss()(logits, target)


def test_ignore_index_may_be_anything():
    logits = torch.randn(3, 3)
    target = torch.tensor([0, -3, 2])
    loss = rtdnn.cross_entropy(logits, target, ignore_index=-3)
    ref = torch.nn.functional.cross_entropy(logits.double(), target, ignore_index=-3)
    assert abs(float(loss) - float(ref)) < 1e-5


def test_the_kernel_never_reads_at_a_bad_target():
    """Called directly (no host check), the row of a bad target is NaN and the others right,
    and the target's weight is read at the clamped index 0: the logits and the class weights
    sit inside NaN buffers, so a read outside [0, C) would show in w_t (or fault)."""
    from rtdnn.kernels.cross_entropy import cross_entropy_fwd_kernel

    buf = torch.full((6 * 8,), math.nan)
    x = buf[8:40].view(4, 8)[:, :4]
    x.copy_(torch.randn(4, 4))
    w_buf = torch.full((12,), math.nan)
    weight = w_buf[4:8]
    weight.copy_(torch.rand(4) + 0.5)
    target = torch.tensor([1, 2**40, -2, 4])
    loss, lse, w_t = (torch.full((4,), math.nan) for _ in range(3))
    cross_entropy_fwd_kernel[(4,)](
        x, target, weight, loss, lse, w_t, 4, x.stride(0), x.stride(1), -100, 0.0,
        HAS_WEIGHT=True, BLOCK=16,
    )  # fmt: skip
    ref = torch.nn.functional.cross_entropy(
        x[:1].double(), target[:1], weight.double(), reduction="none"
    )
    assert abs(float(loss[0]) - float(ref[0])) < 1e-5
    assert float(w_t[0]) == float(weight[1])
    assert torch.isnan(loss[1:]).all()
    assert torch.equal(w_t[1:], weight[0].expand(3)), "a bad target's weight is class 0's"
    assert torch.isfinite(lse).all()


def test_the_backward_skips_the_target_check_only_when_told():
    logits, target = torch.randn(2, 3), torch.tensor([0, 2])
    _, lse, w_t = rtdnn.ops.cross_entropy_forward(logits, target)
    bad = torch.tensor([0, 5])
    with pytest.raises(rtdnn.BadParamError, match="target=5"):
        rtdnn.ops.cross_entropy_backward(torch.ones(()), logits, bad, lse, w_t)
    # Unchecked, the bad row's gradient is NaN (never a read at class 5), the other one right.
    dx = rtdnn.ops.cross_entropy_backward(
        torch.ones(()), logits, bad, lse, w_t, check_targets=False
    )
    assert torch.isnan(dx[1]).all()
    x2 = logits.double().requires_grad_(True)
    torch.nn.functional.cross_entropy(x2[:1], target[:1], reduction="sum").backward()
    assert torch.allclose(dx[0].double(), x2.grad[0] / 2, atol=1e-6)


def test_a_training_step_checks_the_targets_once(monkeypatch):
    """The host check synchronizes on a GPU: autograd's backward does not repeat it."""
    import rtdnn.ops.loss as loss_module

    calls = []
    check = loss_module._check_classes
    monkeypatch.setattr(loss_module, "_check_classes", lambda *a: calls.append(1) or check(*a))
    logits = torch.randn(2, 3, requires_grad=True)
    rtdnn.cross_entropy(logits, torch.tensor([0, 2])).backward()
    assert len(calls) == 1 and logits.grad is not None
    calls.clear()
    rnn.CrossEntropyLoss()(logits, torch.tensor([1, 2])).backward()
    assert len(calls) == 1


# -- running statistics ----------------------------------------------------------------


@pytest.mark.parametrize("overlap", ["x", "weight", "bias", "out", "each other"])
def test_running_statistics_overlapping_anything_are_refused(overlap):
    """running_mean and running_var are written in place: they may share memory with nothing
    the training forward reads or writes."""
    x = t(4, 3, 2)
    buf = torch.rand(12) + 0.5
    args = dict(weight=t(3, positive=True), bias=t(3), out=torch.zeros(4, 3, 2))
    running_mean, running_var = torch.zeros(3), torch.ones(3)
    if overlap == "x":
        running_mean = x.view(-1)[:3]
    elif overlap == "each other":
        running_var = buf[:3]
        running_mean = buf[2:5]
    elif overlap == "out":
        running_var = args["out"].view(-1)[5:8]
    else:
        args[overlap] = buf[:3]
        running_mean = buf[:3] if overlap == "weight" else buf[1:4]
    before = [v.clone() for v in (x, running_mean, running_var, buf, args["out"])]
    with pytest.raises(
        rtdnn.BadParamError, match="(running_(mean|var) overlaps|overlaps running_)"
    ):
        rtdnn.batch_norm_forward_training(
            x, running_mean=running_mean, running_var=running_var, **args
        )
    for v, b in zip((x, running_mean, running_var, buf, args["out"]), before, strict=True):
        assert torch.equal(v, b)
