"""Compile the recurrent-network kernels for sm_90 without a GPU (a CPU-only check).

Triton's interpreter accepts code the GPU compiler rejects, so this runs rtdnn.ops' RNN
forward and backward on CPU tensors, every mode and dtype, with the CUDA driver replaced by
an sm_90 stub and every launch turned into a compilation (nothing runs: the values are
meaningless), and prints the kernels compiled.

    PYTHONPATH=src python benchmarks/aot_compile_rnn.py      (TRITON_INTERPRET must be unset)
"""

from sm90_stub import accept_cpu_tensors, activate, compile_only  # noqa: E402

activate()
compiled = compile_only()

import types  # noqa: E402

import torch  # noqa: E402

import rtdnn  # noqa: E402, F401
from rtdnn.ops.rnn import prepare, rnn_backward_packed, rnn_forward_packed  # noqa: E402

accept_cpu_tensors()
# The persistent recurrence sizes its grid by the multiprocessors: an H100's.
torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(
    multi_processor_count=132
)
SHAPES = {"rnn_tanh": 1, "rnn_relu": 1, "lstm": 4, "gru": 3}

for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for mode, gates in SHAPES.items():
        for proj in (0, 16) if mode == "lstm" else (0,):
            h, i, layers = 32, 24, 2
            p = proj or h
            weights = []
            for layer in range(layers):
                for _ in range(2):
                    size = i if layer == 0 else 2 * p
                    weights += [torch.randn(gates * h, size), torch.randn(gates * h, p)]
                    weights += [torch.randn(gates * h), torch.randn(gates * h)]
                    weights += [torch.randn(p, h)] if proj else []
            weights = [w.to(dtype) for w in weights]
            x = torch.randn(5, 3, i, dtype=dtype)
            # Equal lengths (the persistent kernels' uniform steps) and variable ones.
            for lengths in (None, [5, 4, 2]):
                call = prepare(
                    x, None, weights, mode=mode, num_layers=layers, bidirectional=True,
                    proj_size=proj, dropout=0.5, seed=1, math="fp32", lengths=lengths,
                )  # fmt: skip
                opts = dict(dropout=0.5, training=True, seed=1, math="fp32")
                y, h_n, c_n, f32, data = rnn_forward_packed(
                    call.data, call.batch_sizes, call.h0, call.c0, weights, call.spec, **opts
                )
                rnn_backward_packed(
                    y, h_n, c_n if mode == "lstm" else None, call.data, weights, f32, data,
                    call.batch_sizes, call.spec, **opts,
                )  # fmt: skip
            print(f"{str(dtype):15s} {mode:8s} proj={proj:2d} ok")

names = sorted({name for name, _ in compiled})
print(f"{len(compiled)} kernels compiled for sm_90: {names}")
