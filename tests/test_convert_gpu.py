"""rtdnn.convert on torchvision's ResNet-50 on the GPU: outputs and every parameter's gradient
against the unconverted model in strict float32 (train and eval), running statistics, state_dict
round trips, and the output under bfloat16 autocast with channels-last. Run with
RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU and torchvision.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

import rtdnn
from rtdnn.reference import rel_error

torchvision = pytest.importorskip("torchvision")

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="kernels are interpreted: see README"
    ),
    pytest.mark.gpu,
]


def _resnet50():
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


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_resnet50_outputs_gradients_and_statistics(train):
    model = _resnet50().to(memory_format=torch.channels_last)
    converted, report = rtdnn.convert(model)
    counts = report.counts()
    assert counts["Conv2d"] == 53 and counts["BatchNorm2d"] == 53 and counts["Linear"] == 1
    x = torch.randn(4, 3, 96, 96, device="cuda").to(memory_format=torch.channels_last)
    t = torch.randint(0, 10, (4,), device="cuda")
    model.train(train)
    converted.train(train)
    with _strict_fp32():
        ref = model(x)
        out = converted(x)
        torch.nn.functional.cross_entropy(ref, t).backward()
        torch.nn.functional.cross_entropy(out, t).backward()
    assert rel_error(out, ref.detach().double()) < 1e-4
    for (name, p), q in zip(converted.named_parameters(), model.parameters(), strict=True):
        assert rel_error(p.grad, q.grad.double()) < 1e-3, name
    for (name, a), b in zip(converted.named_buffers(), model.buffers(), strict=True):
        if a.is_floating_point():
            assert rel_error(a, b.double()) < 1e-5, name
        else:
            assert torch.equal(a, b), name


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
            exact = model(x).double()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ours = converted(x)
            theirs = model(x)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    # Both are bfloat16 networks: hold rtdnn to the error PyTorch's own bf16 model makes.
    assert rel_error(ours, exact) < max(2 * rel_error(theirs, exact), 2e-2)
