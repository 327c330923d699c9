"""Compile the CTC loss and spatial transformer kernels for sm_90 without a GPU (a CPU-only
check).

Triton's interpreter accepts code the GPU compiler rejects, so this runs rtdnn.ops' CTC and
spatial transformer forward and backward on CPU tensors, every dtype, mode and padding, with
the CUDA driver replaced by an sm_90 stub and every launch turned into a compilation (nothing
runs: the values are meaningless), and prints the kernels compiled.

    PYTHONPATH=src python benchmarks/aot_compile_ctc_st.py   (TRITON_INTERPRET must be unset)
"""

import sys

from sm90_stub import accept_cpu_tensors, activate, compile_only  # noqa: E402

activate()
compiled = compile_only()

import torch  # noqa: E402

import rtdnn  # noqa: E402, F401
from rtdnn.ops import ctc  # noqa: E402
from rtdnn.ops import spatial_transformer as st  # noqa: E402

accept_cpu_tensors()
max_target = int(sys.argv[1]) if len(sys.argv) > 1 else 200

for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for dims in (2, 3):
        x = torch.randn((2, 3, 5, 6) if dims == 2 else (2, 3, 4, 5, 6), dtype=dtype)
        theta = torch.randn(2, dims, dims + 1, dtype=dtype)
        grid = st.affine_grid(theta, x.shape, False)
        st.affine_grid_backward(grid, x.shape, True)
        last = x.to(memory_format=torch.channels_last if dims == 2 else torch.channels_last_3d)
        for mode in ("bilinear", "nearest"):
            st.grid_sample(last, grid, mode, "zeros", False)  # a block of channels per gather
            for padding in ("zeros", "border", "reflection"):
                y = st.grid_sample(x, grid, mode, padding, True)
                st.grid_sample_backward(y, x, grid, mode, padding, True)
                st.grid_sample_backward(y, x, grid, mode, padding, False, deterministic=True)
    T, N, C = 300, 2, 29
    lp = torch.randn(T, N, C).log_softmax(-1).to(dtype)
    targets = torch.randint(1, C, (N, max_target))
    args = ctc.prepare(lp, targets, (T, T), (max_target, max_target // 2), 0)[:5]
    for reduction in ctc.REDUCTIONS:
        for zero_infinity in (False, True):
            _, nll, alpha = ctc.ctc_forward(*args, 0, max_target, reduction, zero_infinity)
            grad_loss = torch.ones(N if reduction == "none" else ())
            ctc.ctc_backward(grad_loss, *args, nll, alpha, 0, reduction, zero_infinity)
# The check that runs where targets or lengths are on the GPU: both layouts, both int types.
for int_type in (torch.int32, torch.int64):
    lengths = torch.tensor([3, 2], dtype=int_type)
    ctc._summary_on_device(targets.to(int_type).reshape(-1), lengths, lengths, max_target, 29, 0)
    ctc._summary_on_device(targets.to(int_type)[0], lengths, lengths, 0, 29, 0)

print(f"{len(compiled)} kernels compiled for sm_90:")
for name, _ in sorted(compiled):
    print(" ", name)
