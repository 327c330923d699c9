"""Host time per call, layer by layer: the plain op, the torch.library custom op, the nn module
(with and without autocast and autograd), beside PyTorch's own. Tiny shapes keep the GPU ahead
of the host, so each number is the host's cost of one call.
    PYTHONPATH=src python benchmarks/overhead.py
"""

import time

import torch

import rtdnn
from rtdnn import ops

dev = "cuda"


def host_us(fn, n=2000):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - start) / n * 1e6
    torch.cuda.synchronize()
    return host


def cl(t):
    return t.to(memory_format=torch.channels_last)


x = cl(torch.randn(1, 64, 8, 8, device=dev, dtype=torch.bfloat16))
w = cl(torch.randn(64, 64, 3, 3, device=dev, dtype=torch.bfloat16))
x32 = x.float()
conv = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False).to(dev, memory_format=torch.channels_last)
bn = torch.nn.BatchNorm2d(64).to(dev)
relu = torch.nn.ReLU()
ours = {m: rtdnn.convert(m)[0] for m in (conv, bn, relu)}
xg = x32.clone().requires_grad_()


def autocast():
    return torch.autocast("cuda", dtype=torch.bfloat16)


def train_step(m):
    def step():
        with autocast():
            y = m(xg)
        y.backward(torch.ones_like(y))

    return step


def no_grad(fn):
    def call():
        with torch.no_grad():
            fn()

    return call


rows = [
    ("conv op (rtdnn.conv_forward)", lambda: ops.conv_forward(x, w, padding=1)),
    ("conv custom op", lambda: torch.ops.rtdnn.conv_forward(x, w, None, [1, 1], [1, 1], [1, 1],
                                                           1, "cross_correlation")),
    ("conv module, no grad, autocast", no_grad(autocast()(lambda: ours[conv](x32)))),
    ("torch conv module, no grad, bf16", no_grad(lambda: torch.nn.functional.conv2d(x, w,
                                                                                   padding=1))),
    ("conv module train step (autocast)", train_step(ours[conv])),
    ("torch conv train step (autocast)", train_step(conv)),
    ("bn eval op", lambda: ops.batch_norm_forward_inference(
        x, bn.weight, bn.bias, bn.running_mean, bn.running_var)),
    ("bn module eval, no grad", no_grad(lambda: ours[bn].eval()(x))),
    ("torch bn eval, no grad", no_grad(lambda: bn.eval()(x))),
    ("bn module train step", train_step(ours[bn].train())),
    ("torch bn train step", train_step(bn.train())),
    ("relu op", lambda: ops.activation_forward(x, "relu")),
    ("relu module, no grad", no_grad(lambda: ours[relu](x))),
    ("torch relu, no grad", no_grad(lambda: torch.relu(x))),
    ("relu module train step", train_step(ours[relu])),
    ("torch relu train step", train_step(relu)),
]  # fmt: skip
for name, fn in rows:
    try:
        print(f"{name:40s} {host_us(fn):8.1f} us", flush=True)
    except Exception as e:  # one broken row must not hide the others
        print(f"{name:40s} failed: {type(e).__name__}: {e}", flush=True)

# Where the host time of one converted convolution goes (single thread, no autograd).
import cProfile  # noqa: E402
import pstats  # noqa: E402

call = no_grad(
    lambda: torch.ops.rtdnn.conv_forward(x, w, None, [1, 1], [1, 1], [1, 1], 1, "cross_correlation")
)
cProfile.run("for _ in range(2000): call()", "/tmp/overhead.prof")
pstats.Stats("/tmp/overhead.prof").sort_stats("tottime").print_stats(25)
