"""Where the host time of a convolution's backward goes: the autograd engine's Python node, the
ops it calls, and the engine's CUDA worker thread (set_multithreading_enabled(False) runs the
backward on the calling thread instead). Tiny shapes; calls in bursts with the GPU drained
between, so the numbers are the host's.
    PYTHONPATH=src python benchmarks/probes/backward_host.py
"""

import cProfile
import pstats

import torch
from host_timing import Identity, host_us

import rtdnn
from rtdnn import ops

dev = "cuda"


def cl(t):
    return t.to(memory_format=torch.channels_last)


x = cl(torch.randn(1, 64, 8, 8, device=dev, dtype=torch.bfloat16))
w = cl(torch.randn(64, 64, 3, 3, device=dev, dtype=torch.bfloat16))
conv = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False).to(dev, torch.bfloat16)
conv = conv.to(memory_format=torch.channels_last)
ours = rtdnn.convert(conv)[0]
xg = x.clone().requires_grad_()


class DirectConv(torch.autograd.Function):
    """The ops called straight from a plain Function: no custom-op wrapper in between."""

    @staticmethod
    def forward(ctx, t, weight):
        ctx.save_for_backward(t, weight)
        return ops.conv_forward(t, weight, padding=1)

    @staticmethod
    def backward(ctx, g):
        t, weight = ctx.saved_tensors
        dx = ops.conv_backward_data(g, weight, t.shape, padding=1)
        dw = ops.conv_backward_filter(t, g, weight.shape, padding=1)
        return dx, dw


def backward_only(forward, params):
    y = forward()
    ones = torch.ones_like(y)
    return lambda: torch.autograd.grad(y, params, ones, retain_graph=True)


wg = w.clone().requires_grad_()
cases = {
    "identity Function": backward_only(lambda: Identity.apply(xg), [xg]),
    "plain Function calling the ops": backward_only(lambda: DirectConv.apply(xg, wg), [xg, wg]),
    "converted Conv2d": backward_only(lambda: ours(xg), [xg, ours.weight]),
    "torch Conv2d": backward_only(lambda: conv(xg), [xg, conv.weight]),
    "ops: backward_data + backward_filter": lambda: (
        ops.conv_backward_data(x, w, x.shape, padding=1),
        ops.conv_backward_filter(x, x, w.shape, padding=1),
    ),
}
for threads in (True, False):
    torch.autograd.set_multithreading_enabled(threads)
    print(f"-- autograd worker threads {'on' if threads else 'off'}")
    for name, fn in cases.items():
        print(f"{name:40s} {host_us(fn)[0]:8.1f} us", flush=True)

# With worker threads off the backward runs on this thread, where cProfile sees it.
fn = cases["converted Conv2d"]
cProfile.run("for _ in range(2000): fn()", "/tmp/backward.prof")
pstats.Stats("/tmp/backward.prof").sort_stats("tottime").print_stats(22)
