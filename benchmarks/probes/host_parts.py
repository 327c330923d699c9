"""Host microseconds of the parts of one convolution and one batch-norm backward call, each
timed alone (no profiler), to see which Python lines cost what on this host.
    PYTHONPATH=src python benchmarks/probes/host_parts.py
"""

import time

import torch
from host_timing import Identity

from rtdnn import ops
from rtdnn.algos import ConvTensors
from rtdnn.kernels.launch import _launch_hooks_installed
from rtdnn.ops import _norm as V
from rtdnn.ops import conv as conv_ops


def us(fn, n: int = 3000) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
        torch.cuda.synchronize()
    return best / n * 1e6


def cl(t):
    return t.to(memory_format=torch.channels_last)


x = cl(torch.randn(1, 64, 8, 8, device="cuda", dtype=torch.bfloat16))
w = cl(torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.bfloat16))
ops.conv_forward(x, w, padding=1)
key, call = conv_ops._lookup(
    conv_ops.Direction.FORWARD, (x, w, None, None), 1, 1, 1, 1, "cross_correlation", "auto",
    None, conv_ops.resolve_math_mode(None),
)  # fmt: skip
y = call.output(None, x)
t = ConvTensors(x, w, y, None)
gemm_launch = call.runner.__closure__  # the prepared runner's cells (gemm, direction)
gemm = next(c.cell_contents for c in gemm_launch if hasattr(c.cell_contents, "_variants"))
main, _ = gemm._variants[(False, False)]
slot_values = [x, w, y, y, y, 1.0, 0.0]
compiled = next(iter(main.compiled.values()))
stream = torch._C._cuda_getCurrentRawStream(0)
args = main.template.copy()
for i, v in zip(main.index, slot_values, strict=True):
    args[i] = v.data_ptr() if isinstance(v, torch.Tensor) else v
c_args = (1, 1, 1, stream, compiled.function, *compiled.flags, None, None, compiled.metadata,
          None, None, None, *args)  # fmt: skip


leaf = torch.ones(4, device="cuda", requires_grad=True)


def identity_chain(n):
    def run():
        t = leaf
        for _ in range(n):
            t = Identity.apply(t)
        t.backward(torch.ones_like(t))

    return run


rows = {
    "conv_forward op": lambda: ops.conv_forward(x, w, padding=1),
    "  _lookup (key + dict get)": lambda: conv_ops._lookup(
        conv_ops.Direction.FORWARD, (x, w, None, None), 1, 1, 1, 1, "cross_correlation",
        "auto", None, conv_ops.resolve_math_mode(None)),
    "  output alloc": lambda: call.output(None, x),
    "  ConvTensors(...)": lambda: ConvTensors(x, w, y, None),
    "  prepared call (workspace + runner)": lambda: call(t, 1.0, 0.0),
    "  BrgemmLaunch call": lambda: gemm(x, w, y, alpha=1.0, beta=0.0),
    "  SlotLaunch call": lambda: main(*slot_values),
    "  torch._C._cuda_getDevice": torch._C._cuda_getDevice,
    "  torch._C._cuda_getCurrentRawStream": lambda: torch._C._cuda_getCurrentRawStream(0),
    "  hooks check": _launch_hooks_installed,
    "  Triton's C launch function": lambda: compiled.c_launch(*c_args),
    "  Triton's launcher (CudaLauncher.__call__)": lambda: compiled.launcher(
        1, 1, 1, stream, compiled.function, compiled.metadata, None, None, None, *args),
    "Function chain of 1, forward + backward": identity_chain(1),
    "Function chain of 51, forward + backward": identity_chain(51),
    "tensor.shape": lambda: x.shape,
    "tensor.stride()": lambda: x.stride(),
    "tensor.dtype": lambda: x.dtype,
    "tensor.device": lambda: x.device,
    "tensor.data_ptr()": lambda: x.data_ptr(),
    "(shape, stride, dtype, device)": lambda: (x.shape, x.stride(), x.dtype, x.device),
    "hash of that tuple": lambda: hash((x.shape, x.stride(), x.dtype, x.device)),
    "torch.empty_strided": lambda: torch.empty_strided((1, 64, 8, 8), (4096, 1, 512, 64),
                                                       dtype=torch.bfloat16, device=x.device),
    "torch.empty((64,), f32)": lambda: torch.empty((64,), dtype=torch.float32, device=x.device),
    "python call of a no-op function": lambda: None,
    "sum(range(1000))": lambda: sum(range(1000)),
}  # fmt: skip

# Batch norm backward (fused ReLU and residual), its op and the pieces of its call.
xb = cl(torch.randn(2, 64, 8, 8, device="cuda", dtype=torch.bfloat16))
wb = torch.rand(64, device="cuda") + 0.5
bb = torch.randn(64, device="cuda")
_, mean, invstd = ops.batch_norm_forward_training(xb, wb, bb, z=xb, activation="relu")
bn_args = (xb, xb, mean, invstd, wb, bb)
bn_kw = dict(z=xb, activation="relu")
ops.batch_norm_backward(*bn_args, **bn_kw)
rows.update({
    "bn backward op": lambda: ops.batch_norm_backward(*bn_args, **bn_kw),
    "  V.key (8 tensors)": lambda: V.key("bn_bwd", (*bn_args, xb, None), "relu", "spatial",
                                         True, V.nonzero(0.0)),
})  # fmt: skip
for name, fn in rows.items():
    try:
        print(f"{name:44s} {us(fn):8.2f} us", flush=True)
    except Exception as e:  # one broken row must not hide the others
        print(f"{name:44s} failed: {type(e).__name__}: {e}", flush=True)
