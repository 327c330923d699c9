"""Recurrent networks against torch.nn's RNN, LSTM and GRU computed in float64 from the same
(float32) weights and inputs: outputs, final states and the gradients of the input, the initial
states and every weight, for every mode, 1 to 3 layers, both directions, batch_first, bias off,
proj_size, packed and padded variable lengths, with and without initial states; dropout; the
modules, rtdnn.convert and bad input. Tiny sizes: every step is a few interpreted launches."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from conftest import assert_close
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import rtdnn
import rtdnn.nn as rnn

TORCH = {
    "rnn_tanh": (torch.nn.RNN, dict(nonlinearity="tanh")),
    "rnn_relu": (torch.nn.RNN, dict(nonlinearity="relu")),
    "lstm": (torch.nn.LSTM, {}),
    "gru": (torch.nn.GRU, {}),
}
MODES = tuple(TORCH)
RNN_OPS = importlib.import_module("rtdnn.ops.rnn")


@pytest.fixture(autouse=True, params=["persistent", "per_step"])
def recurrence(request, monkeypatch):
    """Every test runs both ways of running the time steps (ops/rnn.py's PERSISTENT): one
    persistent launch per layer and direction, or launches per step."""
    monkeypatch.setattr(RNN_OPS, "PERSISTENT", request.param == "persistent")


def make_module(mode: str, input_size: int = 3, hidden: int = 4, **kw) -> torch.nn.RNNBase:
    cls, extra = TORCH[mode]
    torch.manual_seed(0)
    return cls(input_size, hidden, **extra, **kw)


def states(mode, layers_dirs, batch, hidden, proj=0, gen=None):
    """Random (h0, c0) for lstm, h0 otherwise; no batch dim when batch is None."""
    lead = (layers_dirs,) if batch is None else (layers_dirs, batch)
    h0 = torch.randn(*lead, proj or hidden, generator=gen)
    return (h0, torch.randn(*lead, hidden, generator=gen)) if mode == "lstm" else h0


def _tensors(hx) -> list:
    return [] if hx is None else list(hx) if isinstance(hx, tuple) else [hx]


def _leaf(t, dtype):
    return t.detach().to(dtype).requires_grad_()


def run(module, x, hx, dtype, *, lengths=None, packed=False, batch_first=False):
    """The module on (x, hx) in `dtype`, its outputs flattened, and the leaves to differentiate:
    the input, the initial states and every weight."""
    x = _leaf(x, dtype)
    hx_leaves = [_leaf(t, dtype) for t in _tensors(hx)]
    hx_in = None if hx is None else tuple(hx_leaves) if isinstance(hx, tuple) else hx_leaves[0]
    inp = x
    if lengths is not None:
        inp = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    out, hidden = module(inp, hx_in)
    if isinstance(out, PackedSequence):
        assert packed
        out = out.data
    outs = [out, *(hidden if isinstance(hidden, tuple) else (hidden,))]
    return outs, [x, *hx_leaves, *module._flat_weights]


def check_against_torch(mode, *, T=3, B=2, In=3, H=4, initial=True, lengths=None, **kw):
    """rtdnn.nn's module (converted from torch's) against torch's in float64: every output
    and the gradient of every input, state and weight."""
    base = make_module(mode, In, H, **kw)
    ours, _ = rtdnn.convert(base)
    assert type(ours).__module__ == "rtdnn.nn.rnn"
    ref = copy.deepcopy(base).double()
    gen = torch.Generator().manual_seed(1)
    dirs = 2 if kw.get("bidirectional") else 1
    bf = kw.get("batch_first", False)
    x = torch.randn((B, T, In) if bf else (T, B, In), generator=gen)
    hx = states(mode, kw.get("num_layers", 1) * dirs, B, H, kw.get("proj_size", 0), gen)
    hx = hx if initial else None
    opts = dict(lengths=lengths, packed=lengths is not None, batch_first=bf)
    got, got_leaves = run(ours, x, hx, torch.float32, **opts)
    want, want_leaves = run(ref, x, hx, torch.float64, **opts)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        assert_close(g, w.detach())
    weights = [torch.randn(w.shape, generator=gen, dtype=torch.float64) for w in want]
    sum((g * w.float()).sum() for g, w in zip(got, weights, strict=True)).backward()
    sum((g * w).sum() for g, w in zip(want, weights, strict=True)).backward()
    names = ["input", *(["h0", "c0"] if mode == "lstm" else ["h0"])[: len(_tensors(hx))]]
    names += [n for n, _ in ours.named_parameters()]
    for name, g, w in zip(names, got_leaves, want_leaves, strict=True):
        assert g.grad is not None, name
        assert torch.isfinite(g.grad).all(), name
        assert_close(g.grad, w.grad, torch.float32), name


# -- every mode against torch --------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_one_layer(mode):
    check_against_torch(mode)


@pytest.mark.parametrize("mode", MODES)
def test_two_layers_bidirectional(mode):
    check_against_torch(mode, num_layers=2, bidirectional=True, T=2)


def test_lstm_projection():
    check_against_torch("lstm", proj_size=2, bidirectional=True)


@pytest.mark.slow
def test_lstm_projection_two_layers():
    check_against_torch("lstm", proj_size=3, num_layers=2, bidirectional=True)


@pytest.mark.parametrize("mode", ["gru", "rnn_relu"])
def test_batch_first_without_bias_or_initial_state(mode):
    check_against_torch(mode, batch_first=True, bias=False, initial=False, bidirectional=True)


@pytest.mark.parametrize("mode", ["lstm", "rnn_tanh"])
def test_packed_variable_lengths(mode):
    """Unsorted lengths through pack_padded_sequence(enforce_sorted=False): PackedSequence in,
    PackedSequence out, final states in the caller's batch order."""
    check_against_torch(mode, B=3, T=4, lengths=[2, 4, 1], bidirectional=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_three_layers_packed_batch_first(mode):
    check_against_torch(
        mode, num_layers=3, bidirectional=True, batch_first=True, B=3, T=4, lengths=[3, 1, 4]
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["rnn_relu", "gru"])
def test_two_layers_packed_without_initial_state(mode):
    check_against_torch(mode, num_layers=2, B=3, lengths=[1, 3, 2], initial=False)


def test_unbatched_input():
    base = make_module("lstm", bidirectional=True)
    ours, _ = rtdnn.convert(base)
    ref = copy.deepcopy(base).double()
    x = torch.randn(3, 3)
    h0, c0 = states("lstm", 2, None, 4)
    out, (h, c) = ours(x, (h0, c0))
    ref_out, (ref_h, ref_c) = ref(x.double(), (h0.double(), c0.double()))
    assert out.shape == (3, 8) and h.shape == (2, 4)
    for g, w in ((out, ref_out), (h, ref_h), (c, ref_c)):
        assert_close(g.detach(), w.detach())


# -- the functional API --------------------------------------------------------------------


def _weights(module):
    return [w.detach() for w in module._flat_weights]


def test_functional_padded_lengths_match_packing():
    """Padded input + lengths: the output is padded back to the input's length with zeros,
    and equals torch's on the packed sequence."""
    base = make_module("gru", bidirectional=True, batch_first=True)
    x = torch.randn(3, 4, 3, requires_grad=True)
    h0 = torch.randn(2, 3, 4, requires_grad=True)
    lengths = [2, 4, 3]
    out, h_n = rtdnn.rnn(
        x, h0, base._flat_weights, mode="gru", bidirectional=True, batch_first=True,
        lengths=lengths, enforce_sorted=False, math="fp32",
    )  # fmt: skip
    ref = copy.deepcopy(base).double()
    xd, hd = _leaf(x, torch.float64), _leaf(h0, torch.float64)
    packed = pack_padded_sequence(xd, lengths, batch_first=True, enforce_sorted=False)
    ref_packed, ref_h = ref(packed, hd)
    ref_out = pad_packed_sequence(ref_packed, batch_first=True, total_length=4)[0]
    assert out.shape == (3, 4, 8)
    assert torch.equal(out[0, 2:], torch.zeros(2, 8))
    assert_close(out.detach(), ref_out.detach())
    assert_close(h_n.detach(), ref_h.detach())
    (out.sum() + h_n.sum()).backward()
    (ref_out.sum() + ref_h.sum()).backward()
    assert_close(x.grad, xd.grad, torch.float32)
    assert_close(h0.grad, hd.grad, torch.float32)
    for a, b in zip(base._flat_weights, ref._flat_weights, strict=True):
        assert_close(a.grad, b.grad, torch.float32)


def test_functional_plain_and_differentiable_agree():
    """rtdnn.rnn without gradients is rtdnn.ops.rnn; the returned tuple is flat."""
    base = make_module("lstm")
    x = torch.randn(3, 2, 3)
    with torch.no_grad():
        a = rtdnn.rnn(x, None, base._flat_weights, mode="lstm")
    b = rtdnn.ops.rnn(x, None, _weights(base), mode="lstm")
    assert len(a) == len(b) == 3
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u, v)


def test_strided_weights_input_and_states():
    """Views with gaps (every other element) give the same result as contiguous copies."""
    base = make_module("gru")
    x = torch.randn(3, 2, 6)[..., ::2]
    h0 = torch.randn(1, 2, 8)[..., ::2]
    strided = [torch.randn(*w.shape[:-1], 2 * w.shape[-1])[..., ::2] for w in base._flat_weights]
    for w, v in zip(strided, base._flat_weights, strict=True):
        w.copy_(v.detach())
    got = rtdnn.ops.rnn(x, h0, strided, mode="gru", math="fp32")
    want = rtdnn.ops.rnn(x.contiguous(), h0.contiguous(), _weights(base), mode="gru", math="fp32")
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_only_the_final_state_carries_the_loss():
    """A classifier reads h_n alone: the gradient still reaches the input and weights."""
    base = make_module("rnn_tanh")
    ours, _ = rtdnn.convert(base)
    x = torch.randn(3, 2, 3, requires_grad=True)
    _, h = ours(x)
    h.sum().backward()
    ref = copy.deepcopy(base).double()
    xd = _leaf(x, torch.float64)
    ref(xd)[1].sum().backward()
    assert_close(x.grad, xd.grad, torch.float32)
    assert_close(ours.weight_hh_l0.grad, ref.weight_hh_l0.grad, torch.float32)


# -- dropout -------------------------------------------------------------------------------


def test_dropout_is_seeded_and_follows_the_layer_seeds():
    """Layer l's input is dropped with seed + l (rtdnn.dropout_forward's mask): the same
    network computed layer by layer with that mask gives the same output and gradients."""
    base = make_module("lstm", num_layers=2, dropout=0.5)
    w = base._flat_weights
    x = torch.randn(3, 2, 3, requires_grad=True)
    kw = dict(mode="lstm", num_layers=2, dropout=0.5, seed=7, math="fp32")
    out, h_n, c_n = rtdnn.rnn(x, None, w, **kw)
    again = rtdnn.rnn(x, None, w, **kw)
    assert torch.equal(out, again[0])
    assert not torch.equal(out, rtdnn.rnn(x, None, w, **{**kw, "seed": 8})[0])
    no_dropout = rtdnn.rnn(x, None, w, **{**kw, "dropout": 0.0})[0]
    assert torch.equal(no_dropout, rtdnn.rnn(x, None, w, **{**kw, "training": False})[0])
    out.sum().backward()

    # Layer by layer in float64 with torch, the mask taken from rtdnn.dropout_forward(seed + 1).
    ref0 = torch.nn.LSTM(3, 4).double()
    ref1 = torch.nn.LSTM(4, 4).double()
    for ref, first in ((ref0, 0), (ref1, 4)):
        for p, src in zip(ref._flat_weights, w[first : first + 4], strict=True):
            p.data.copy_(src.detach())
    xd = _leaf(x, torch.float64)
    y0 = ref0(xd)[0]
    mask = rtdnn.dropout_forward(torch.ones(y0.shape), 0.5, 8).double()
    assert 0 < int((mask == 0).sum()) < mask.numel()
    y1 = ref1(y0 * mask)[0]
    assert_close(out.detach(), y1.detach())
    y1.sum().backward()
    assert_close(x.grad, xd.grad, torch.float32)
    for a, b in zip(w[:4], ref0._flat_weights, strict=True):
        assert_close(a.grad, b.grad, torch.float32)


def test_module_dropout_draws_from_torch_seed():
    m = rnn.GRU(3, 4, num_layers=2, dropout=0.5)
    x = torch.randn(2, 2, 3)
    torch.manual_seed(3)
    a = m(x)[0]
    torch.manual_seed(3)
    assert torch.equal(a, m(x)[0])
    m.eval()
    b = m(x)[0]
    m.dropout = 0.0
    assert torch.equal(b, m(x)[0])


def test_dropout_one_drops_every_inner_input():
    """p = 1 zeroes the second layer's input in rtdnn and in torch alike."""
    check_against_torch("gru", num_layers=2, dropout=1.0, T=2)


# -- modules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls,kw",
    [(rnn.RNN, dict(nonlinearity="relu")), (rnn.LSTM, dict(proj_size=2)), (rnn.GRU, {})],
)
def test_module_is_a_drop_in(cls, kw):
    torch.manual_seed(0)
    ours = cls(3, 4, num_layers=2, bidirectional=True, **kw)
    torch.manual_seed(0)
    theirs = cls.__mro__[1](3, 4, num_layers=2, bidirectional=True, **kw)
    assert isinstance(ours, cls.__mro__[1])
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for (n, a), (m, b) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert n == m and torch.equal(a, b)
    x = torch.randn(2, 2, 3)
    got, want = ours(x), theirs(x)
    assert type(got) is type(want) and type(got[1]) is type(want[1])
    assert_close(got[0].detach(), want[0].detach().double())


def test_convert_swaps_and_keeps_float64():
    model = torch.nn.Sequential(torch.nn.LSTM(3, 4), torch.nn.GRU(4, 4), torch.nn.RNN(4, 4))
    converted, report = rtdnn.convert(model)
    assert [type(m) for m in converted] == [rnn.LSTM, rnn.GRU, rnn.RNN]
    assert report.counts() == {"LSTM": 1, "GRU": 1, "RNN": 1}
    assert converted.state_dict().keys() == model.state_dict().keys()
    kept, report = rtdnn.convert(torch.nn.GRU(3, 4).double())
    assert type(kept) is torch.nn.GRU and report.kept


def test_float64_input_is_refused_by_the_module():
    with pytest.raises(rtdnn.NotSupportedError, match="input.dtype"):
        rnn.LSTM(3, 4).double()(torch.randn(2, 1, 3, dtype=torch.float64))


@pytest.mark.slow
def test_float16_matches_within_its_tolerance():
    base = make_module("lstm", bidirectional=True)
    ours, _ = rtdnn.convert(base)
    ours.half()
    ref = copy.deepcopy(ours).double()
    x = torch.randn(3, 2, 3).half()
    out, (h, c) = ours(x)
    assert out.dtype == torch.float16 and c.dtype == torch.float16
    ref_out, (ref_h, ref_c) = torch.nn.LSTM.forward(ref, x.double())
    for g, w in ((out, ref_out), (h, ref_h), (c, ref_c)):
        assert_close(g.detach(), w.detach())


@pytest.mark.slow
def test_torch_compile():
    base = make_module("gru")
    ours, _ = rtdnn.convert(base)
    x = torch.randn(2, 2, 3, requires_grad=True)
    compiled = torch.compile(lambda x: ours(x)[0].sum())
    loss = compiled(x)
    loss.backward()
    ref = copy.deepcopy(base).double()
    xd = _leaf(x, torch.float64)
    ref_loss = ref(xd)[0].sum()
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) < 1e-5 * abs(ref_loss.item()) + 1e-6
    assert_close(x.grad, xd.grad, torch.float32)


# -- bad input -----------------------------------------------------------------------------


def _call(**changes):
    base = make_module("lstm", num_layers=2)
    args = dict(input=torch.randn(3, 2, 3), hx=None, weights=_weights(base), mode="lstm")
    args.update(num_layers=2)
    args.update(changes)
    return args


def _refused(args, *names, error=rtdnn.BadParamError):
    before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(error) as e:
        rtdnn.rnn(**args)
    for n in names:
        assert n in str(e.value), f"{n!r} not in {e.value}"
    for k, v in before.items():
        assert torch.equal(args[k], v)


def test_valid_call_succeeds():
    out, h, c = rtdnn.rnn(**_call())
    assert out.shape == (3, 2, 4) and h.shape == c.shape == (2, 2, 4)


@pytest.mark.parametrize(
    "changes,names",
    [
        (dict(mode="lstmx"), ("mode", "lstmx")),
        (dict(input=torch.randn(3, 2, 5)), ("weights[0].shape", "input size")),
        (dict(input=torch.randn(3, 3)), ("input.dim()",)),
        (dict(input=torch.randn(3, 2, 3, dtype=torch.float64)), ("input.dtype",)),
        (dict(num_layers=3), ("len(weights)",)),
        (dict(num_layers=0), ("num_layers",)),
        (dict(bidirectional=True), ("len(weights)",)),
        (dict(hx=(torch.randn(2, 3, 4), torch.randn(2, 2, 4))), ("h0.shape", "(2, 2, 4)")),
        (dict(hx=(torch.randn(2, 2, 4), torch.randn(1, 2, 4))), ("c0.shape",)),
        (dict(hx=torch.randn(2, 2, 4)), ("hx", "pair")),
        (dict(lengths=[1, 3]), ("lengths", "decreasing", "enforce_sorted")),
        (dict(lengths=[3, 4], enforce_sorted=False), ("lengths", "[1, 3]")),
        (dict(lengths=[3, 0]), ("lengths", "[1, 3]")),
        (dict(lengths=[3]), ("len(lengths)",)),
        (dict(lengths=torch.tensor([2.0, 1.0])), ("lengths",)),
        (dict(dropout=1.5), ("dropout",)),
        (dict(dropout=float("nan")), ("dropout",)),
        (dict(dropout=0.5, seed=-1), ("seed",)),
        (dict(math="fp16"), ("math",)),
        (dict(batch_first=1), ("batch_first",)),
        (dict(weights=[]), ("weights",)),
    ],
)
def test_bad_input_is_refused_by_name(changes, names):
    _refused(_call(**changes), *names)


def test_bad_weight_shape_and_dtype():
    args = _call()
    args["weights"] = list(args["weights"])
    args["weights"][5] = torch.randn(16, 5)
    _refused(args, "weights[5].shape", "weight_hh_l1")
    args = _call()
    args["weights"] = list(args["weights"])
    args["weights"][2] = args["weights"][2].half()
    _refused(args, "weights[2]", "bias_ih_l0", "dtype")


@pytest.mark.parametrize(
    "sizes,names",
    [([2, 3], ("non-increasing",)), ([2, 2], ("summing", "5")), ([3, 2, 0], ("positive",))],
)
def test_malformed_packed_sequence(sizes, names):
    """A PackedSequence built by hand is checked against its data before any step runs."""
    packed = PackedSequence(torch.randn(5, 3), torch.tensor(sizes), None, None)
    _refused(_call(input=packed), "input.batch_sizes", *names)


def test_lengths_with_a_packed_sequence():
    packed = pack_padded_sequence(torch.randn(3, 2, 3), [3, 2])
    _refused(_call(input=packed, lengths=[3, 2]), "lengths", "PackedSequence")


def test_proj_size_checks():
    base = make_module("gru")
    _refused(
        dict(input=torch.randn(2, 1, 3), hx=None, weights=_weights(base), mode="gru", proj_size=2),
        "proj_size", error=rtdnn.NotSupportedError,
    )  # fmt: skip
    base = make_module("lstm")
    _refused(
        dict(input=torch.randn(2, 1, 3), hx=None, weights=_weights(base), mode="lstm", proj_size=4),
        "proj_size", "hidden_size",
    )  # fmt: skip


def test_module_with_unknown_nonlinearity():
    m = rnn.RNN(3, 4)
    m.nonlinearity = "sigmoid"
    with pytest.raises(rtdnn.BadParamError, match="nonlinearity"):
        m(torch.randn(2, 1, 3))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_custom_op_passes_opcheck(mode):
    """Schema, fake kernel, autograd registration and tracing of rtdnn::rnn."""
    from rtdnn import autograd

    base = make_module(mode, bidirectional=True)
    weights = [w.detach().clone().requires_grad_() for w in base._flat_weights]
    x = torch.randn(4, 3, requires_grad=True)  # packed: batch sizes 2, 2
    h0 = torch.randn(2, 2, 4, requires_grad=True)
    c0 = torch.randn(2, 2, 4, requires_grad=True) if mode == "lstm" else None
    args = (x, h0, c0, weights, [2, 2], mode, 1, True, True, 0, 0.0, False, 0, "fp32")
    torch.library.opcheck(autograd.rnn, args)


def test_autocast_runs_in_the_autocast_dtype():
    m = rnn.GRU(3, 4)
    x = torch.randn(2, 2, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, h = m(x)
    assert out.dtype == h.dtype == torch.bfloat16
    ref, ref_h = torch.nn.GRU.forward(copy.deepcopy(m).double(), x.double())
    assert_close(out.float(), ref.detach(), torch.bfloat16)


@pytest.mark.parametrize("allow_tf32", [True, False])
def test_float32_math_follows_cudnns_switch(monkeypatch, allow_tf32):
    """math=None: TF32 products exactly when cuDNN's switch allows them, as torch's cuDNN RNN
    (not the matmul switch, which the linear layers follow)."""
    rnn_ops = importlib.import_module("rtdnn.ops.rnn")  # rtdnn.ops.rnn is also a function
    seen = []
    real = rnn_ops._gemm
    monkeypatch.setattr(rnn_ops, "_gemm", lambda *a: seen.append(a[-1]) or real(*a))
    lstm = torch.nn.LSTM(3, 4)
    x = torch.randn(2, 1, 3)
    with torch.backends.cudnn.flags(allow_tf32=allow_tf32):
        torch.backends.cuda.matmul.allow_tf32 = not allow_tf32
        try:
            rtdnn.ops.rnn(x, None, lstm._flat_weights, mode="lstm")
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
    assert seen and set(seen) == {"tf32" if allow_tf32 else "fp32"}


def test_a_refused_cooperative_launch_falls_back_to_the_steps(monkeypatch):
    """Where CUDA refuses the persistent kernels' cooperative launch (as under MPS limits), the
    call runs the per-step path instead, with the same results, and the device keeps to it."""
    if not RNN_OPS.PERSISTENT:
        pytest.skip("the per-step run of this module's tests")
    launch = RNN_OPS.launch_cached
    refused = []

    def refusing(fn, *args, **kwargs):
        if kwargs.get("cooperative"):
            refused.append(fn)
            raise RuntimeError("Triton Error [CUDA]: too many blocks in cooperative launch")
        return launch(fn, *args, **kwargs)

    monkeypatch.setattr(RNN_OPS, "launch_cached", refusing)
    monkeypatch.setattr(RNN_OPS, "_refused", set())
    check_against_torch("lstm", num_layers=2, bidirectional=True)
    assert len(refused) == 1  # the first refusal marks the device; no persistent try after it
    assert torch.device("cpu") in RNN_OPS._refused
