"""Host overhead per call: the full op path, the prepared runner alone, and cuDNN's."""

import cProfile
import pstats
import time

import torch

from rtdnn import ops

dev = "cuda"
x = torch.randn(64, 1024, 14, 14, device=dev, dtype=torch.bfloat16).to(
    memory_format=torch.channels_last
)
w = torch.randn(256, 1024, 1, 1, device=dev, dtype=torch.bfloat16).to(
    memory_format=torch.channels_last
)
dy = torch.randn(64, 256, 14, 14, device=dev, dtype=torch.bfloat16).to(
    memory_format=torch.channels_last
)


def per_call(fn, n=300):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def ours():
    return ops.conv_backward_data(dy, w, x.shape)


def theirs():
    return torch.ops.aten.convolution_backward(
        dy, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, False, False]
    )


def filt():
    return ops.conv_backward_filter(x, dy, w.shape)


print(f"rtdnn bwd-data  {per_call(ours):.1f} us/call (wall, back to back)")
print(f"rtdnn bwd-filt  {per_call(filt):.1f} us/call")
print(f"cuDNN bwd-data  {per_call(theirs):.1f} us/call")
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    ours()
print(f"rtdnn graphed   {per_call(g.replay):.1f} us/call")
cProfile.run("for _ in range(300): ours()", "/tmp/prof")
pstats.Stats("/tmp/prof").sort_stats("tottime").print_stats(14)
