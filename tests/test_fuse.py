"""rtdnn.convert(fuse=True): batch norm fused with the ReLU and residual add after it, on a
torchvision-style bottleneck (downsample computed after the last batch norm, `out +=
identity`, one shared in-place ReLU), checked against the unfused PyTorch model."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close

import rtdnn
from rtdnn.algos import norm as engine


class Bottleneck(torch.nn.Module):
    """torchvision's Bottleneck, shrunk: the same forward, statement for statement."""

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = width * 2
        self.conv1 = torch.nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(width)
        self.conv2 = torch.nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(width)
        self.conv3 = torch.nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = torch.nn.BatchNorm2d(c_out)
        self.relu = torch.nn.ReLU(inplace=True)
        self.downsample = torch.nn.Sequential(
            torch.nn.Conv2d(c_in, c_out, 1, stride, bias=False), torch.nn.BatchNorm2d(c_out)
        )

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)
        out = self.conv3(out)
        out = self.bn3(out)
        identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.block = Bottleneck(4, 2, stride=2)
        self.head_bn = torch.nn.BatchNorm2d(4)  # its output is read twice: not fused

    def forward(self, x):
        x = torch.nn.functional.relu(self.bn(self.stem(x)))
        x = self.block(x)
        y = self.head_bn(x)
        return torch.relu(y) + y


def _run(model, x, train: bool):
    model.train(train)
    for p in model.parameters():
        p.grad = None
    xg = x.clone().requires_grad_()
    out = model(xg)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out, xg.grad, [p.grad for p in model.parameters()]


def _assert_same_step(model, fused, x, train: bool) -> None:
    """The fused model's output and every gradient match the unfused PyTorch model's."""
    with torch.backends.cudnn.flags(allow_tf32=False):
        ref = _run(model, x, train)
        out = _run(fused, x, train)
    assert_close(out[0], ref[0].detach().double())
    assert_close(out[1], ref[1].double())
    for g, g_ref in zip(out[2], ref[2], strict=True):
        assert_close(g, g_ref.double())


@pytest.mark.parametrize("train", [True, False])
def test_fused_model_matches_pytorch(train):
    torch.manual_seed(0)
    model = Net()
    fused, report = rtdnn.convert(model, fuse=True)
    assert isinstance(fused, torch.fx.GraphModule)
    assert report.fused == [
        "bn + relu", "block.bn1 + relu", "block.bn2 + relu", "block.bn3 + add + relu"
    ]  # fmt: skip
    assert report.not_fused is None and "fused" in str(report)
    assert fused.state_dict().keys() == model.state_dict().keys()
    calls = [n.target for n in fused.graph.nodes if n.op == "call_module"]
    assert "block.relu" not in calls
    x = torch.randn(2, 3, 6, 6)
    _assert_same_step(model, fused, x, train)
    for a, b in zip(model.buffers(), fused.buffers(), strict=True):
        if a.is_floating_point():
            assert_close(b, a.double())
        else:
            assert torch.equal(a, b)


def test_untraceable_model_is_converted_unfused():
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(3)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent: torch.fx cannot trace it
                return torch.relu(self.bn(x))
            return self.bn(x)

    converted, report = rtdnn.convert(Branchy(), fuse=True)
    assert not isinstance(converted, torch.fx.GraphModule)
    assert report.fused == [] and "torch.fx could not trace" in report.not_fused
    assert converted.bn.activation == "identity"


def test_fuse_refuses_inplace():
    with pytest.raises(ValueError, match="fuse=True needs inplace=False"):
        rtdnn.convert(Net(), inplace=True, fuse=True)


def test_residual_the_fused_op_cannot_take_is_added_as_before():
    """bn(x) + a broadcast tensor: the pattern matches, but z is not x's shape, so the module
    adds it with torch's broadcasting and applies the ReLU itself."""

    class BiasAfterNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm2d(3)
            self.shift = torch.nn.Parameter(torch.randn(3, 1, 1))

        def forward(self, x):
            return torch.relu(self.bn(x) + self.shift)

    torch.manual_seed(5)
    model = BiasAfterNorm()
    fused, report = rtdnn.convert(model, fuse=True)
    assert report.fused == ["bn + add + relu"]
    x = torch.randn(2, 3, 4, 4)
    for train in (True, False):
        model.train(train)
        fused.train(train)
        assert_close(fused(x), model(x).detach().double())


class MobileBlock(torch.nn.Module):
    """EfficientNet's and MobileNetV3's patterns: batch norm then SiLU or Hardswish (modules,
    in place, and functions), and a residual add before a SiLU."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.act1 = torch.nn.SiLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(4)
        self.act2 = torch.nn.Hardswish(inplace=True)
        self.bn3 = torch.nn.BatchNorm2d(4)
        self.bn4 = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.act1(self.bn1(self.conv1(x)))
        y = self.act2(self.bn2(self.conv2(y)))
        y = torch.nn.functional.hardswish(self.bn3(y))
        return torch.nn.functional.silu(self.bn4(y) + y)


@pytest.mark.parametrize("train", [True, False])
def test_silu_and_hardswish_fused(train):
    torch.manual_seed(3)
    model = MobileBlock()
    fused, report = rtdnn.convert(model, fuse=True)
    assert report.fused == [
        "bn1 + silu", "bn2 + hardswish", "bn3 + hardswish", "bn4 + add + silu"
    ]  # fmt: skip
    assert [fused.get_submodule(f"bn{i}").activation for i in range(1, 5)] == [
        "silu", "hardswish", "hardswish", "silu"
    ]  # fmt: skip
    x = torch.randn(2, 3, 5, 5)
    _assert_same_step(model, fused, x, train)


def test_activation_patterns_and_lookalikes():
    """Fused: F.silu with its inplace keyword, the relu_ method. Not fused: a user's module
    named SiLU that is not torch's, and a subclass of torch's with its own forward."""

    class SiLU(torch.nn.Module):  # a user's module that only shares the name
        def forward(self, x):
            return x * 2

    class LeakySiLU(torch.nn.SiLU):
        def forward(self, x):
            return torch.nn.functional.silu(x) + 0.1 * x

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bns = torch.nn.ModuleList(torch.nn.BatchNorm2d(3) for _ in range(4))
            self.own, self.leaky = SiLU(), LeakySiLU()

        def forward(self, x):
            x = torch.nn.functional.silu(self.bns[0](x), inplace=True)
            x = self.bns[1](x).relu_()
            x = self.own(self.bns[2](x))
            return self.leaky(self.bns[3](x))

    torch.manual_seed(1)
    model = Net()
    fused, report = rtdnn.convert(model, fuse=True)
    assert report.fused == ["bns.0 + silu", "bns.1 + relu"]
    x = torch.randn(2, 3, 4, 4)
    for train in (True, False):
        model.train(train)
        fused.train(train)
        assert_close(fused(x), model(x).detach().double())


def _with_statistics(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in eval mode with batch norms whose statistics and affine terms are not 0/1."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)
            torch.nn.init.uniform_(m.bias, -0.5, 0.5)
    return model.eval()


def test_fold_batch_norm_into_convolutions():
    """Eval mode: the batch norms right after a convolution (with their ReLU) fold into it;
    the one with the residual add and the one read twice stay. The output is the model's, and
    so is the input's gradient (the fused forward and its masked backward)."""
    torch.manual_seed(1)
    model = _with_statistics(Net())
    folded, report = rtdnn.convert(model, fold_batch_norm=True)
    assert report.folded == [
        "bn + relu into stem", "block.bn1 + relu into block.conv1",
        "block.bn2 + relu into block.conv2", "block.downsample.1 into block.downsample.0",
    ]  # fmt: skip
    assert "folded   4 batch norms" in str(report)
    names = dict(folded.named_modules())
    assert "bn" not in names and "block.bn1" not in names and "block.bn3" in names
    assert names["stem"].activation == "relu" and names["block.downsample.0"].bias is not None
    assert names["block.downsample.0"].activation == "identity"
    x = torch.randn(2, 3, 6, 6)
    xg = x.clone().requires_grad_()
    out = folded(xg)
    out.sum().backward()
    x64 = x.double().requires_grad_()
    ref = model.double()(x64)
    ref.sum().backward()
    assert_close(out, ref.detach())
    assert_close(xg.grad, x64.grad)
    assert names["stem"].weight.grad is not None


def test_fold_batch_norm_needs_eval_mode():
    with pytest.raises(rtdnn.BadParamError, match="fold_batch_norm"):
        rtdnn.convert(Net(), fold_batch_norm=True)


def test_folded_model_compiles_whole():
    torch.manual_seed(2)
    folded, _ = rtdnn.convert(_with_statistics(Net()), fold_batch_norm=True)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        eager = folded(x)
        compiled = torch.compile(folded, backend="aot_eager", fullgraph=True)(x)
    assert torch.equal(compiled, eager)


class _TiedDecoder(torch.nn.Module):
    """An encoder conv + batch norm + ReLU, a decoder reading the encoder's filter itself, and
    a batch norm whose weight the forward reads too."""

    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.conv = torch.nn.Conv2d(4, 4, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        h = torch.relu(self.bn(self.enc(x)))
        h = self.bn2(self.conv(h)) * self.bn2.weight.view(1, -1, 1, 1)
        return torch.nn.functional.conv_transpose2d(h, self.enc.weight, padding=1)


def test_fold_leaves_modules_whose_parameters_the_forward_reads():
    torch.manual_seed(3)
    model = _with_statistics(_TiedDecoder())
    folded, report = rtdnn.convert(model, fold_batch_norm=True)
    assert report.folded == []
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        assert_close(folded(x), model.double()(x.double()))


def test_folded_convolution_refuses_unbatched_input_and_shows_its_activation():
    torch.manual_seed(4)
    model = _with_statistics(torch.nn.Sequential(
        torch.nn.Conv1d(3, 4, 3, bias=False), torch.nn.BatchNorm1d(4), torch.nn.ReLU()
    ))  # fmt: skip
    folded, report = rtdnn.convert(model, fold_batch_norm=True)
    assert report.folded == ["1 + relu into 0"]
    conv = dict(folded.named_modules())["0"]
    assert "activation=relu" in repr(conv)
    assert conv.bias.requires_grad and conv.weight.requires_grad
    x = torch.randn(2, 3, 6)
    with torch.no_grad():
        assert_close(folded(x), model.double()(x.double()))
        with pytest.raises(rtdnn.NotSupportedError, match="batched input only"):
            folded(x[0])


def test_convolutions_pair_with_their_batch_norms_in_training():
    """Each batch norm that reads only a convolution's output runs with it as one op in
    training (autograd.conv_batch_norm), and the model matches PyTorch's: output, every
    gradient, running statistics and step counts (test_fused_model_matches_pytorch checks
    the same model in both modes); in eval mode the two modules run one after the other."""
    torch.manual_seed(1)
    model = Net()
    fused, report = rtdnn.convert(model, fuse=True)
    assert sorted(report.paired) == [
        "block.conv1 + block.bn1", "block.conv2 + block.bn2", "block.conv3 + block.bn3",
        "block.downsample.0 + block.downsample.1", "stem + bn",
    ]  # fmt: skip
    assert "paired" in str(report) and fused.state_dict().keys() == model.state_dict().keys()
    calls = [n.target for n in fused.graph.nodes if n.op == "call_module"]
    assert "block.bn3" not in calls and "head_bn" in calls  # head_bn reads no convolution
    ran = []
    real = rtdnn.autograd.conv_batch_norm

    def counted(*args, **kwargs):
        ran.append(1)
        return real(*args, **kwargs)

    for train, pairs in ((True, 5), (False, 0)):
        ran.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(rtdnn.autograd, "conv_batch_norm", counted)
            _assert_same_step(model, fused, torch.randn(2, 3, 6, 6), train)
        assert len(ran) == pairs
    for a, b in zip(model.buffers(), fused.buffers(), strict=True):
        if a.is_floating_point():
            assert_close(b, a.double())
        else:
            assert torch.equal(a, b)  # num_batches_tracked


class PairLookalikes(torch.nn.Module):
    """Convolutions and batch norms that must not pair, and one whose residual the paired op
    cannot take (a broadcast shift: the two modules run apart and add it as torch does)."""

    def __init__(self):
        super().__init__()
        self.reflect = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect", bias=False)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.read_twice = torch.nn.Conv2d(4, 4, 1)
        self.bn2 = torch.nn.BatchNorm2d(4)
        self.same = torch.nn.Conv2d(4, 4, 3, padding="same", bias=False)
        self.bn3 = torch.nn.BatchNorm2d(4)
        self.shifted = torch.nn.Conv2d(4, 4, 1, bias=False)
        self.bn4 = torch.nn.BatchNorm2d(4)
        self.shift = torch.nn.Parameter(torch.randn(4, 1, 1))

    def forward(self, x):
        y = torch.relu(self.bn1(self.reflect(x)))
        c = self.read_twice(y)
        y = self.bn2(c) + c
        y = torch.relu(self.bn3(self.same(y)))
        return torch.relu(self.bn4(self.shifted(y)) + self.shift)


@pytest.mark.parametrize("train", [True, False])
def test_pairing_leaves_what_it_cannot_take(train):
    torch.manual_seed(2)
    model = PairLookalikes()
    fused, report = rtdnn.convert(model, fuse=True)
    assert report.paired == ["shifted + bn4"]
    _assert_same_step(model, fused, torch.randn(2, 3, 5, 5), train)
    # Unbatched input to a paired convolution: the batch norm refuses it, as torch's does.
    paired = Net()
    converted, _ = rtdnn.convert(paired, fuse=True)
    with pytest.raises(ValueError, match="expected 4D input"):
        converted.train(train)(torch.randn(3, 6, 6))


def test_paired_op_computes_what_the_two_modules_compute():
    """Under autocast (float16: the interpreter's bfloat16 products are wrong) the paired op
    runs the same kernels as the convolution and batch norm modules one after the other: the
    same bits, forward and backward."""
    torch.manual_seed(4)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.BatchNorm2d(8)
    ).to(memory_format=torch.channels_last)
    paired, report = rtdnn.convert(model, fuse=True)
    apart, _ = rtdnn.convert(model)
    assert report.paired == ["0 + 1"]
    x = torch.randn(2, 3, 7, 7).to(memory_format=torch.channels_last)
    results = []
    for net in (paired, apart):
        # Two steps: the second runs the plans the first one's calls stored.
        for _ in range(2):
            xg = x.clone().requires_grad_()
            net.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                out = net(xg)
            out.float().square().sum().backward()
            grads = [p.grad for p in net.parameters()]
            results.append([out, xg.grad, *grads, *[b.clone() for b in net.buffers()]])
    kept = {k[0] for k in engine.cache.calls if k is not None}
    assert {"conv_bn_train", "conv_bn_bwd"} <= kept
    for a, b in zip(results[0] + results[1], results[2] + results[3], strict=True):
        assert torch.equal(a, b)


def test_paired_op_checks_overlaps_on_every_call():
    """A call with the signature of one that ran before takes its plan, and the plan still
    refuses running statistics that share memory (the same buffer for both)."""
    torch.manual_seed(5)
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    weight, bias = torch.ones(4, requires_grad=True), torch.zeros(4, requires_grad=True)
    rm, rv = torch.zeros(4), torch.ones(4)
    args = ([1, 1], [0, 0], [1, 1], 1, weight, bias)
    for _ in range(2):
        rtdnn.autograd.conv_batch_norm(x, w, None, *args, rm, rv, 0.1, 1e-5).sum().backward()
    with pytest.raises(rtdnn.Error, match="running"):
        rtdnn.autograd.conv_batch_norm(x, w, None, *args, rm, rm, 0.1, 1e-5)


def test_paired_cumulative_average_and_refused_arguments():
    """momentum=None (a cumulative average over the steps) moves the running statistics as
    torch does; a convolution that refuses its arguments (weights of another dtype) raises
    before the batch norm counts a step or touches its statistics, as the modules apart do."""
    torch.manual_seed(6)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, momentum=None))
    paired, report = rtdnn.convert(model, fuse=True)
    assert report.paired == ["0 + 1"]
    for _ in range(2):
        x = torch.randn(2, 3, 5, 5)
        assert_close(paired(x), model(x).detach().double())
    for a, b in zip(model.buffers(), paired.buffers(), strict=True):
        if a.is_floating_point():
            assert_close(b, a.double())
        else:
            assert torch.equal(a, b)
    before = [b.clone() for b in paired.buffers()]
    paired.get_submodule("0").half()
    with pytest.raises(rtdnn.Error, match="dtype"):
        paired(torch.randn(2, 3, 5, 5))
    assert all(torch.equal(a, b) for a, b in zip(before, paired.buffers(), strict=True))
