"""Host time per call, layer by layer: the plain op, the torch.library custom op, the nn module
(with and without autocast and autograd), beside PyTorch's own, on tiny shapes; see
host_timing.host_us for how the host's own cost is separated from time spent waiting on the GPU.
    PYTHONPATH=src python benchmarks/probes/overhead.py
"""

import torch
import triton
import triton.language as tl
from host_timing import Identity, autocast, forward_only, host_us, train_step
from triton.runtime import driver

import rtdnn
from rtdnn import ops
from rtdnn.kernels.launch import SlotLaunch, _launch_hooks_installed

dev = "cuda"


def cl(t):
    return t.to(memory_format=torch.channels_last)


x = cl(torch.randn(1, 64, 8, 8, device=dev, dtype=torch.bfloat16))
w = cl(torch.randn(64, 64, 3, 3, device=dev, dtype=torch.bfloat16))
x32 = x.float()
conv = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False).to(dev, memory_format=torch.channels_last)
bn = torch.nn.BatchNorm2d(64).to(dev)
relu = torch.nn.ReLU()
ours = {m: rtdnn.convert(m)[0] for m in (conv, bn, relu)}
bn_relu = rtdnn.convert(torch.nn.BatchNorm2d(64).to(dev))[0]
bn_relu.activation = "relu"  # what rtdnn.convert(fuse=True) sets on a bn followed by a relu


@triton.jit
def _copy_kernel(X, Y, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i))


copy_launch = SlotLaunch(_copy_kernel, (1,), {}, ("X", "Y"), BLOCK=64)
y_copy = torch.empty_like(x)
xg = x32.clone().requires_grad_()


def backward_only(m):
    with autocast():
        y = m(xg)
    params = [xg, *m.parameters()]
    ones = torch.ones_like(y)
    return lambda: torch.autograd.grad(y, params, ones, retain_graph=True)


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
    ("conv module forward with grad (autocast)", forward_only(ours[conv], xg)),
    ("conv module train step (autocast)", train_step(ours[conv], xg)),
    ("torch conv train step (autocast)", train_step(conv, xg)),
    ("bn eval op", lambda: ops.batch_norm_forward_inference(
        x, bn.weight, bn.bias, bn.running_mean, bn.running_var)),
    ("bn module eval, no grad", no_grad(lambda: ours[bn].eval()(x))),
    ("torch bn eval, no grad", no_grad(lambda: bn.eval()(x))),
    ("bn module train step", train_step(ours[bn].train(), xg)),
    ("torch bn train step", train_step(bn.train(), xg)),
    ("relu op", lambda: ops.activation_forward(x, "relu")),
    ("relu module, no grad", no_grad(lambda: ours[relu](x))),
    ("torch relu, no grad", no_grad(lambda: torch.relu(x))),
    ("relu module train step", train_step(ours[relu], xg)),
    ("torch relu train step", train_step(relu, xg)),
    ("bn+relu fused module train step", train_step(bn_relu.train(), xg)),
    ("one prepared launch (SlotLaunch)", lambda: copy_launch(x, y_copy)),
    ("  current device (Triton driver)", lambda: driver.active.get_current_device()),
    ("  current stream (Triton driver)", lambda: driver.active.get_current_stream(0)),
    ("  launch hook check", _launch_hooks_installed),
    ("torch.empty", lambda: torch.empty(64, device=dev)),
    ("pure Python: sum(range(1000))", lambda: sum(range(1000))),
    ("conv backward_data op", lambda: ops.conv_backward_data(x, w, x.shape, padding=1)),
    ("conv backward_filter op", lambda: ops.conv_backward_filter(x, x, w.shape, padding=1)),
    ("rtdnn conv backward only (autocast graph)", backward_only(ours[conv])),
    ("torch conv backward only (autocast graph)", backward_only(conv)),
    ("identity autograd.Function train step", train_step(Identity.apply, xg)),
]  # fmt: skip
for name, fn in rows:
    try:
        host, gpu = host_us(fn)
        print(f"{name:40s} {host:8.1f} us  (GPU span {gpu:7.1f} us)", flush=True)
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
