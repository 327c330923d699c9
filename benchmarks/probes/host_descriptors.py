"""Host time of a Hopper convolution call's TMA descriptors, on the CPU: building three
descriptors (the input's, read through four slots, the filter's and the output's) and keying
a launch of six descriptor slots, the way the runners did before descriptor views
(TensorDescriptor per call) and do now (DescriptorView.bind). No kernel runs.

    PYTHONPATH=src python benchmarks/probes/host_descriptors.py
"""

import timeit

import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from rtdnn.kernels import conv_hopper as ch
from rtdnn.kernels.launch import SlotLaunch


def _kernel(A, B, C, D, W, Y, alpha, n, FLAG: tl.constexpr):  # never launched
    pass


launch = SlotLaunch(JITFunction(_kernel), (1,), {}, ("A", "B", "C", "D", "W", "Y", "alpha"),
                    n=3, FLAG=True)  # fmt: skip
x = torch.empty(64, 56, 56, 64, dtype=torch.bfloat16)  # ResNet-50's l1 3x3 layer, batch 64
w = torch.empty(64, 9 * 64, dtype=torch.bfloat16)
y = torch.empty_like(x)
x_geometry = (x.shape, x.stride(), [2, 8, 8, 64])
w_geometry = (w.shape, w.stride(), [64, 64])
y_geometry = (y.shape, y.stride(), [1, 8, 8, 64])


def descriptors_per_call():
    read = ch.descriptor(x, *x_geometry)
    written = ch.descriptor(y, *y_geometry)
    return launch._signature(0, (read, read, read, read, ch.descriptor(w, *w_geometry),
                                 written, 1.0))  # fmt: skip


x_view = ch.descriptor_view(x.dtype, *x_geometry)
w_view = ch.descriptor_view(w.dtype, *w_geometry)
y_view = ch.descriptor_view(y.dtype, *y_geometry)


def bound_views():
    read = x_view.bind(x)
    return launch._signature(0, (read, read, read, read, w_view.bind(w), y_view.bind(y), 1.0))


compiled = {descriptors_per_call()[0]: 1, bound_views()[0]: 2}
calls = 20000
for _ in range(2):
    for way in (descriptors_per_call, bound_views):
        seconds = timeit.timeit(lambda way=way: compiled.get(way()[0]), number=calls)
        print(f"{way.__name__:22s} {seconds / calls * 1e6:.2f} us a call")
