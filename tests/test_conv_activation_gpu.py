"""The forward convolution's fused ReLU compiled for the GPU: every algorithm on ResNet-like
shapes in bfloat16 and float16 (3x3, the 1x1 that the TMA GEMM reads, a strided 1x1, the RGB
stem), with bias and beta, against the float64 reference on NaN-poisoned outputs; and a
folded ResNet-50 block against the eval-mode model. Run with RTDNN_GPU_TESTS=1."""

import pytest
import torch
from conftest import TOLERANCE, gpu_only

import rtdnn
from rtdnn import reference
from rtdnn.algos import ALGORITHMS

pytestmark = gpu_only()

# (x shape, w shape, stride, padding)
SHAPES = {
    "3x3": ((8, 64, 28, 28), (64, 64, 3, 3), 1, 1),
    "1x1": ((8, 256, 14, 14), (128, 256, 1, 1), 1, 0),
    "1x1s2": ((8, 256, 14, 14), (512, 256, 1, 1), 2, 0),
    "stem": ((4, 3, 64, 64), (64, 3, 7, 7), 2, 3),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_fused_relu(algo, shape, dtype):
    torch.manual_seed(0)
    xs, ws, stride, padding = SHAPES[shape]
    x = torch.randn(xs, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    w = torch.randn(ws, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    bias = torch.randn(ws[0], device="cuda", dtype=dtype)
    kw = dict(stride=stride, padding=padding)
    y_shape = reference.conv_forward(x[:1], w, **kw).shape[1:]
    for beta in (0.0, 0.5):
        out = torch.randn((xs[0], *y_shape), device="cuda", dtype=dtype)
        out = out.to(memory_format=torch.channels_last)
        if beta == 0:
            out.fill_(float("nan"))
        ref = reference.conv_forward(x, w, bias, beta=beta, out=out, activation="relu", **kw)
        try:
            y = rtdnn.ops.conv_forward(
                x, w, bias, beta=beta, out=out, algo=algo, activation="relu", **kw
            )
        except rtdnn.NotSupportedError:
            pytest.skip(f"{algo} does not run {shape}")
        assert reference.rel_error(y, ref) <= TOLERANCE[dtype]


def test_folded_bottleneck_matches_eval_model():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(1)
    model = torchvision.models.resnet50().layer1.cuda().to(memory_format=torch.channels_last)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    model.eval()
    folded, report = rtdnn.convert(model, fold_batch_norm=True)
    assert len(report.folded) == 7  # conv1, conv2 of three blocks and the downsample
    x = torch.randn(8, 64, 56, 56, device="cuda").to(memory_format=torch.channels_last)
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        y = folded(x)
    with torch.no_grad():  # rel_error compares on the CPU, in float64
        ref = model.double().cpu()(x.double().cpu())
    assert reference.rel_error(y, ref) <= 2e-2
