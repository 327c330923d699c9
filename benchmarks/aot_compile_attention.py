"""Compile the attention kernels for sm_90 without a GPU (a CPU-only check).

Runs rtdnn.ops.attention's forward and backward on CPU tensors with the CUDA driver replaced by
an sm_90 stub and every launch turned into a compilation (nothing runs: the values are
meaningless): every dtype, head sizes 16 to 256, with and without a mask, causal or not, with
and without dropout.

Takes about ten minutes on two CPU cores.

    PYTHONPATH=src python benchmarks/aot_compile_attention.py   (TRITON_INTERPRET must be unset)
"""

from sm90_stub import accept_cpu_tensors, activate, compile_only  # noqa: E402

activate()
compiled = compile_only()

import torch  # noqa: E402

from rtdnn.ops import attention as A  # noqa: E402

accept_cpu_tensors()

for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for e, ev in ((16, 16), (64, 64), (128, 128), (96, 64), (256, 256)):
        for masked, causal, p in ((False, False, 0.0), (False, True, 0.0), (True, False, 0.0),
                                  (False, True, 0.1)):  # fmt: skip
            q = torch.randn(1, 4, 40, e, dtype=dtype)
            k = torch.randn(1, 2, 50, e, dtype=dtype)
            v = torch.randn(1, 2, 50, ev, dtype=dtype)
            mask = torch.rand(40, 50) > 0.5 if masked else None
            out, lse = A.attention_forward(q, k, v, mask, causal, 0.1, True, p, 5)
            dout = torch.randn_like(out)
            A.attention_backward(dout, q, k, v, out, lse, mask, causal, 0.1, True, p, 5)
            print(f"{str(dtype):15s} e={e:3d} ev={ev:3d} mask={masked:d} causal={causal:d} "
                  f"dropout={p} ok")  # fmt: skip

A.attention_dropout_mask((1, 4, 40, 50), 0.1, 5, "cpu")  # the mask the kernels draw
names = sorted({name for name, _ in compiled})
print(f"{len(compiled)} kernels compiled for sm_90: {names}")
