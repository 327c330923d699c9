"""rtdnn.convert on torchvision's ResNet-50 on the GPU: outputs and every parameter's gradient
against the unconverted model in strict float32 (train and eval, with and without batch norm
fused with the ReLU and residual add after it), running statistics, state_dict
round trips, and the output under bfloat16 autocast with channels-last. Run with
RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU and torchvision.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import gpu_only

import rtdnn
from rtdnn.reference import rel_error

pytestmark = gpu_only()


def _resnet50():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None, num_classes=10).cuda()


def _strict_fp32():
    return torch.backends.cudnn.flags(enabled=True, allow_tf32=False)


@pytest.fixture(autouse=True)
def _no_tf32_matmul():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_resnet50_outputs_gradients_and_statistics(train, fuse):
    """A deep network amplifies rounding, so float32 PyTorch itself is some way from the float64
    model: hold the converted model to a small multiple of PyTorch's own float32 error. With
    fuse=True, every batch norm feeding a ReLU (49 of 53, 16 through the residual add) is
    fused with it."""
    model = _resnet50().to(memory_format=torch.channels_last)
    exact = copy.deepcopy(model).double()
    converted, report = rtdnn.convert(model, fuse=fuse)
    counts = report.counts()
    assert counts["Conv2d"] == 53 and counts["BatchNorm2d"] == 53 and counts["Linear"] == 1
    if fuse:
        assert len(report.fused) == 49 and report.not_fused is None
        assert sum("+ add" in f for f in report.fused) == 16
    x = torch.randn(4, 3, 96, 96, device="cuda").to(memory_format=torch.channels_last)
    t = torch.randint(0, 10, (4,), device="cuda")
    nets = (exact, model, converted)
    outs = []
    with _strict_fp32():
        for net, inp in zip(nets, (x.double(), x, x), strict=True):
            net.train(train)
            outs.append(net(inp))
            torch.nn.functional.cross_entropy(outs[-1], t).backward()

    def within_pytorchs_error(ours, theirs, ref, what, floor=1e-5):
        ref = ref.detach().cpu()
        allowed = max(3 * rel_error(theirs, ref), floor)
        assert rel_error(ours, ref) < allowed, what

    within_pytorchs_error(outs[2], outs[1], outs[0], "output")
    names = [name for name, _ in converted.named_parameters()]
    for name, p64, p_torch, p_ours in zip(names, *(n.parameters() for n in nets), strict=True):
        within_pytorchs_error(p_ours.grad, p_torch.grad, p64.grad, name, floor=1e-4)
    names = [name for name, _ in converted.named_buffers()]
    for name, b64, b_torch, b_ours in zip(names, *(n.buffers() for n in nets), strict=True):
        if b_ours.is_floating_point():
            within_pytorchs_error(b_ours, b_torch, b64, name)
        else:
            assert torch.equal(b_ours, b_torch), name


def test_resnet50_state_dict_round_trip_and_bf16_autocast():
    model = _resnet50().eval()
    converted, _ = rtdnn.convert(model)
    fresh = _resnet50()
    fresh.load_state_dict(converted.state_dict())
    back, _ = rtdnn.convert(_resnet50())
    back.load_state_dict(model.state_dict())
    for a, b in zip(fresh.state_dict().values(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b)

    model = model.to(memory_format=torch.channels_last)
    converted = copy.deepcopy(converted).to(memory_format=torch.channels_last)
    x = torch.randn(8, 3, 128, 128, device="cuda").to(memory_format=torch.channels_last)
    with torch.no_grad():
        with _strict_fp32():
            exact = model(x).double().cpu()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ours = converted(x)
            theirs = model(x)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    # Both are bfloat16 networks: hold rtdnn to the error PyTorch's own bf16 model makes.
    assert rel_error(ours, exact) < max(2 * rel_error(theirs, exact), 2e-2)


def test_whole_training_step_captured_in_a_cuda_graph():
    """A converted model's training step (bf16 autocast forward, cross-entropy, backward, SGD
    with momentum) captured once in a CUDA graph, as torch's whole-network capture does:
    each replay gives the parameters the eager step gives them from the same state."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(16),
        torch.nn.SiLU(), torch.nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False),
        torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, 10),
    ).cuda().to(memory_format=torch.channels_last)  # fmt: skip
    eager, _ = rtdnn.convert(model, fuse=True)
    graphed = copy.deepcopy(eager)
    x = torch.randn(8, 3, 32, 32, device="cuda").to(memory_format=torch.channels_last)
    target = torch.randint(0, 10, (8,), device="cuda")

    def stepper(net):
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        loss_fn = rtdnn.nn.CrossEntropyLoss()

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                loss = loss_fn(net(x).float(), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    eager_step, graphed_step = stepper(eager), stepper(graphed)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles, momentum buffers), both models alike
        for _ in range(3):
            eager_step()
            graphed_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed_step()  # recorded, not run: `graphed` is still where `eager` is
    for _ in range(3):
        graph.replay()
        eager_step()
    torch.cuda.synchronize()
    for (name, a), b in zip(eager.named_parameters(), graphed.parameters(), strict=True):
        assert rel_error(b, a.detach().double().cpu()) < 1e-6, name
