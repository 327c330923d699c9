"""rtdnn.nn.MultiheadAttention against torch.nn.MultiheadAttention with the same weights in
float64: outputs, attention weights, and the gradients of the inputs and every parameter, for
both layouts, unbatched input, kdim/vdim, no bias, add_bias_kv, add_zero_attn, every kind of
mask, is_causal, need_weights and average_attn_weights; state_dict round trips, rtdnn.convert,
dropout, and bad input.

Tiny shapes: the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close

import rtdnn

# The interpreter warns about NaN in masked-off lanes.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

E, H, N, L, S = 32, 2, 2, 7, 9


def modules(**kw) -> tuple[torch.nn.MultiheadAttention, rtdnn.nn.MultiheadAttention]:
    """torch's module in float64 (biases made non-zero) and rtdnn's in float32, same weights."""
    ref = torch.nn.MultiheadAttention(E, H, **kw).double()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "bias" in name:
                p.normal_()
    mod = rtdnn.nn.MultiheadAttention(E, H, **kw)
    mod.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    return ref, mod


def seq_shape(length: int, dim: int, batch_first: bool, batched: bool = True):
    if not batched:
        return (length, dim)
    return (N, length, dim) if batch_first else (length, N, dim)


def bool_mask(*shape) -> torch.Tensor:
    """True = masked out; key 0 always open, so no query loses all its keys."""
    mask = torch.rand(shape) < 0.35
    mask[..., 0] = False
    return mask


def float_mask(*shape) -> torch.Tensor:
    mask = torch.randn(shape)
    mask[torch.rand(shape) < 0.3] = float("-inf")
    mask[..., 0] = 0.0
    return mask


def check(ref, mod, query, key, value, **kw):
    """Forward and backward of both modules (key and value may be query itself); compare."""
    same_k, same_v = key is query, value is key
    q = query.detach().requires_grad_()
    k = q if same_k else key.detach().requires_grad_()
    v = k if same_v else value.detach().requires_grad_()
    q64 = query.detach().double().requires_grad_()
    k64 = q64 if same_k else key.detach().double().requires_grad_()
    v64 = k64 if same_v else value.detach().double().requires_grad_()
    kw64 = {
        name: val.double() if isinstance(val, torch.Tensor) and val.is_floating_point() else val
        for name, val in kw.items()
    }
    out, weights = mod(q, k, v, **kw)
    out_ref, weights_ref = ref(q64, k64, v64, **kw64)
    assert_close(out.detach(), out_ref.detach(), torch.float32)
    assert (weights is None) == (weights_ref is None)
    g = torch.randn(out_ref.shape, dtype=torch.float64)
    loss_ref = (out_ref * g).sum()
    loss = (out * g.float()).sum()
    if weights is not None:
        assert weights.dtype == torch.float32
        assert_close(weights.detach(), weights_ref.detach(), torch.float32)
        gw = torch.randn(weights_ref.shape, dtype=torch.float64)
        loss_ref = loss_ref + (weights_ref * gw).sum()
        loss = loss + (weights * gw.float()).sum()
    loss_ref.backward()
    loss.backward()
    for name, got, want in (("query", q, q64), ("key", k, k64), ("value", v, v64)):
        assert_close(got.grad, want.grad, torch.float32), name
    params = dict(mod.named_parameters())
    for name, p in ref.named_parameters():
        assert params[name].grad is not None, name
        assert_close(params[name].grad, p.grad, torch.float32)
    return out, weights


@pytest.mark.parametrize("batch_first", [False, True])
def test_self_attention_both_layouts(batch_first):
    torch.manual_seed(0)
    ref, mod = modules(batch_first=batch_first)
    x = torch.randn(seq_shape(L, E, batch_first))
    out, weights = check(ref, mod, x, x, x)
    assert out.shape == seq_shape(L, E, batch_first) and weights.shape == (N, L, L)


@pytest.mark.parametrize("batch_first", [False, True])
def test_cross_attention_kdim_vdim_no_bias(batch_first):
    torch.manual_seed(1)
    ref, mod = modules(batch_first=batch_first, kdim=24, vdim=16, bias=False)
    assert "q_proj_weight" in mod.state_dict() and mod.in_proj_weight is None
    q = torch.randn(seq_shape(L, E, batch_first))
    k = torch.randn(seq_shape(S, 24, batch_first))
    v = torch.randn(seq_shape(S, 16, batch_first))
    check(ref, mod, q, k, v, key_padding_mask=bool_mask(N, S))


def test_key_is_value_packed_projection():
    torch.manual_seed(2)
    ref, mod = modules()
    q, kv = torch.randn(L, N, E), torch.randn(S, N, E)
    check(ref, mod, q, kv, kv, attn_mask=bool_mask(L, S))


def test_unbatched_with_both_masks():
    torch.manual_seed(3)
    ref, mod = modules(batch_first=True)  # batch_first is ignored for unbatched input
    q, k, v = torch.randn(L, E), torch.randn(S, E), torch.randn(S, E)
    out, weights = check(
        ref, mod, q, k, v, key_padding_mask=bool_mask(S), attn_mask=bool_mask(H, L, S)
    )
    assert out.shape == (L, E) and weights.shape == (L, S)


MASKS = {
    "kpm bool": dict(key_padding_mask=lambda: bool_mask(N, S)),
    "kpm float": dict(key_padding_mask=lambda: float_mask(N, S)),
    "2-D bool": dict(attn_mask=lambda: bool_mask(L, S)),
    "2-D float": dict(attn_mask=lambda: float_mask(L, S)),
    "3-D bool": dict(attn_mask=lambda: bool_mask(N * H, L, S)),
    "3-D float": dict(attn_mask=lambda: float_mask(N * H, L, S)),
    "kpm bool + 3-D bool": dict(
        key_padding_mask=lambda: bool_mask(N, S), attn_mask=lambda: bool_mask(N * H, L, S)
    ),
    "kpm float + 2-D float": dict(
        key_padding_mask=lambda: float_mask(N, S), attn_mask=lambda: float_mask(L, S)
    ),
}


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("masks", list(MASKS))
def test_masks(masks, need_weights):
    torch.manual_seed(4)
    ref, mod = modules()
    kw = {name: make() for name, make in MASKS[masks].items()}
    q, kv = torch.randn(L, N, E), torch.randn(S, N, E)
    check(ref, mod, q, kv, kv, need_weights=need_weights, **kw)


@pytest.mark.filterwarnings("ignore:Support for mismatched")
def test_mixed_bool_and_float_masks():
    """torch adds a boolean key_padding_mask (as 0 / -inf) to a float attn_mask."""
    torch.manual_seed(5)
    ref, mod = modules(batch_first=True)
    x = torch.randn(N, L, E)
    check(ref, mod, x, x, x, key_padding_mask=bool_mask(N, L), attn_mask=float_mask(L, L))


@pytest.mark.filterwarnings("ignore:Support for mismatched")
@pytest.mark.parametrize("add_bias_kv, add_zero_attn", [(True, False), (False, True), (True, True)])
def test_bias_kv_and_zero_attn(add_bias_kv, add_zero_attn):
    """One more key (and value) for each; the masks get an open column for it."""
    torch.manual_seed(6)
    ref, mod = modules(add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
    q, kv = torch.randn(L, N, E), torch.randn(S, N, E)
    _, weights = check(
        ref, mod, q, kv, kv, key_padding_mask=bool_mask(N, S), attn_mask=float_mask(L, S)
    )
    assert weights.shape == (N, L, S + add_bias_kv + add_zero_attn)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("with_kpm", [False, True])
def test_is_causal(need_weights, with_kpm):
    """is_causal is torch's hint that attn_mask is the causal mask: without weights or padding
    the attention runs causal without the mask, otherwise with it."""
    torch.manual_seed(7)
    ref, mod = modules(batch_first=True)
    x = torch.randn(N, L, E)
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    kpm = bool_mask(N, L) if with_kpm else None
    check(
        ref, mod, x, x, x, attn_mask=causal, is_causal=True, key_padding_mask=kpm,
        need_weights=need_weights,
    )  # fmt: skip


def test_weights_per_head():
    torch.manual_seed(8)
    ref, mod = modules(batch_first=True)
    q, kv = torch.randn(N, L, E), torch.randn(N, S, E)
    _, weights = check(
        ref, mod, q, kv, kv, average_attn_weights=False, key_padding_mask=bool_mask(N, S)
    )
    assert weights.shape == (N, H, L, S)


def test_dropout_in_training_only_and_in_the_weights_too():
    """Eval mode matches torch's module with dropout set. In training the attention drops with a
    seed drawn from torch's default generator: the same torch seed repeats the call, the output
    does not depend on need_weights, and the weights returned are the eval-mode weights times
    the keep mask rtdnn.attention_dropout_mask gives for that seed, over 1 - p."""
    p = 0.25
    torch.manual_seed(9)
    ref, mod = modules(dropout=p)
    ref.eval()
    mod.eval()
    x = torch.randn(L, N, E)
    check(ref, mod, x, x, x)
    _, plain = mod(x, x, x, average_attn_weights=False)
    mod.train()
    torch.manual_seed(3)
    out, weights = mod(x, x, x, average_attn_weights=False)
    torch.manual_seed(3)
    seed = int(torch.randint(0, 2**31 - 1, (), dtype=torch.int64))  # the draw the call made
    torch.manual_seed(3)
    fast, none = mod(x, x, x, need_weights=False)
    assert none is None and torch.equal(fast, out)
    keep = rtdnn.attention_dropout_mask((N, H, L, L), p, seed, "cpu")
    assert_close(weights.detach(), plain.detach() * keep / (1 - p), torch.float32)
    assert not torch.equal(out, mod(x, x, x, need_weights=False)[0])  # a fresh seed


@pytest.mark.parametrize("kdim", [None, 24])
def test_state_dict_round_trip(kdim):
    ref = torch.nn.MultiheadAttention(E, H, kdim=kdim, vdim=kdim, add_bias_kv=True)
    mod = rtdnn.nn.MultiheadAttention(E, H, kdim=kdim, vdim=kdim, add_bias_kv=True)
    assert list(mod.state_dict()) == list(ref.state_dict())
    mod.load_state_dict(ref.state_dict())
    back = torch.nn.MultiheadAttention(E, H, kdim=kdim, vdim=kdim, add_bias_kv=True)
    back.load_state_dict(mod.state_dict())
    for name, t in ref.state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(E, H, batch_first=True)
        self.norm = torch.nn.LayerNorm(E)

    def forward(self, x):
        return self.norm(x + self.attn(x, x, x, need_weights=False)[0])


def test_convert_swaps_it():
    torch.manual_seed(10)
    model = Block()
    converted, report = rtdnn.convert(model)
    assert type(converted.attn) is rtdnn.nn.MultiheadAttention
    assert ("attn", "MultiheadAttention") in report.replaced
    # out_proj belongs to the attention (its forward never calls it): not reported alone.
    assert not any(path.startswith("attn.") for path, *_ in report.replaced + report.kept)
    assert "MultiheadAttention" in str(report)
    x = torch.randn(N, L, E)
    assert_close(converted(x).detach(), model.double()(x.double()).detach(), torch.float32)


def test_convert_transformer_encoder_layer_trains_the_same():
    """torch's encoder layer calls its self_attn (need_weights=False, the padding mask and
    the causal hint) in training; converted, every module in it is rtdnn's."""
    torch.manual_seed(12)
    layer = torch.nn.TransformerEncoderLayer(E, H, dim_feedforward=48, dropout=0.0)
    converted, report = rtdnn.convert(layer)
    assert not report.kept, report.kept
    assert type(converted.self_attn) is rtdnn.nn.MultiheadAttention
    x = torch.randn(L, N, E)
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    kpm = bool_mask(N, L)
    ref_x = x.double().requires_grad_()
    x.requires_grad_()
    out = converted(x, src_mask=causal, src_key_padding_mask=kpm, is_causal=True)
    ref = layer.double()(ref_x, src_mask=causal, src_key_padding_mask=kpm, is_causal=True)
    assert_close(out.detach(), ref.detach(), torch.float32)
    g = torch.randn(ref.shape, dtype=torch.float64)
    (out * g.float()).sum().backward()
    (ref * g).sum().backward()
    assert_close(x.grad, ref_x.grad, torch.float32)
    params = dict(converted.named_parameters())
    for name, p in layer.named_parameters():
        assert_close(params[name].grad, p.grad, torch.float32)


def test_float16():
    torch.manual_seed(13)
    ref, mod = modules(batch_first=True)
    mod.half()  # the reference gets the very same rounded weights
    ref.load_state_dict({k: v.double() for k, v in mod.state_dict().items()})
    x = torch.randn(N, L, E).half()
    masks = dict(key_padding_mask=bool_mask(N, L), attn_mask=bool_mask(L, L))
    out, weights = mod(x, x, x, **masks)
    x64 = x.double()
    out_ref, weights_ref = ref(x64, x64, x64, **masks)
    assert out.dtype == weights.dtype == torch.float16
    assert_close(out.detach(), out_ref.detach())
    assert_close(weights.detach(), weights_ref.detach())


def test_convert_keeps_float64():
    _, report = rtdnn.convert(Block().double())
    assert ("attn", "MultiheadAttention") in [(p, c) for p, c, _ in report.kept]


def _bad(mod, *args, match, **kw):
    with pytest.raises(rtdnn.Error, match=match):
        mod(*args, **kw)


def test_bad_input():
    _, mod = modules()
    x, kv = torch.randn(L, N, E), torch.randn(S, N, E)
    _bad(mod, x.double(), x.double(), x.double(), match=r"query\.dtype")
    _bad(mod, x.half(), x.half(), x.half(), match=r"query\.dtype.*parameters")
    _bad(mod, x, kv.half(), kv.half(), match=r"key\.dtype")
    _bad(mod, x[0, 0], x[0, 0], x[0, 0], match=r"query\.dim\(\)")
    _bad(mod, x, kv[0], kv[0], match=r"key\.dim\(\)")
    _bad(mod, x[..., :16], kv, kv, match=r"query\.shape.*embed_dim")
    _bad(mod, x, kv[..., :16], kv, match=r"key\.shape.*kdim")
    _bad(mod, x, kv, kv[:5], match=r"value\.shape")
    _bad(mod, x, kv[:, :1], kv[:, :1], match=r"key\.shape.*batch")
    _bad(mod, x, kv, kv, key_padding_mask=bool_mask(N, L), match=r"key_padding_mask\.shape")
    _bad(mod, x, kv, kv, attn_mask=bool_mask(L, L), match=r"attn_mask\.shape")
    _bad(mod, x, kv, kv, attn_mask=bool_mask(H, L, S), match=r"attn_mask\.shape")
    _bad(mod, x, kv, kv, attn_mask=torch.zeros(L, S, dtype=torch.int32), match=r"attn_mask\.dtype")
    _bad(mod, x, kv, kv, attn_mask=float_mask(L, S).double(), match=r"attn_mask\.dtype")
    _bad(mod, x, kv, kv, is_causal=True, match=r"is_causal")
    _bad(mod, x, kv[:0], kv[:0], match=r"key\.shape.*zero-sized")
    grad_mask = float_mask(L, S).requires_grad_()
    _bad(mod, x, kv, kv, attn_mask=grad_mask, match=r"attn_mask\.requires_grad")


def test_query_with_every_key_masked():
    """Its output is out_proj's bias (zero attention), as torch's need_weights=False path
    gives; its weights are NaN, as torch's."""
    torch.manual_seed(11)
    ref, mod = modules()
    q, kv = torch.randn(L, N, E), torch.randn(S, N, E)
    mask = bool_mask(L, S)
    mask[2] = True
    out, _ = mod(q, kv, kv, attn_mask=mask, need_weights=False)
    out_ref, _ = ref(q.double(), kv.double(), kv.double(), attn_mask=mask, need_weights=False)
    assert_close(out.detach(), out_ref.detach(), torch.float32)
    assert_close(out[2].detach(), mod.out_proj.bias.detach().expand(N, E).double())
    _, weights = mod(q, kv, kv, attn_mask=mask, average_attn_weights=False)
    assert weights[:, :, 2].isnan().all() and not weights[:, :, :2].isnan().any()
