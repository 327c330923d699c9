"""Compile the squeeze-and-excitation kernels for sm_90 without a GPU (a CPU-only check):
registers and spills of each variant at EfficientNet-B0's and MobileNetV3-Large's block shapes
(batch 128), printed per kernel. See aot_compile_norm.py for how the driver is stubbed.

    PYTHONPATH=src python benchmarks/aot_compile_se.py      (TRITON_INTERPRET must be unset)
"""

import sys

import aot_compile_norm  # noqa: F401  (the sm_90 stub and the compiling SlotLaunch)
import torch

import rtdnn.ops.squeeze_excitation  # noqa: F401

se_ops = sys.modules["rtdnn.ops.squeeze_excitation"]  # (rtdnn.ops.squeeze_excitation: the function)
se_ops.check_runnable = lambda device: None
se_ops.parallel_slots = lambda kind: 2 * 132

for c, r, hw, act, gate in [
    (96, 4, 112, "silu", "sigmoid"), (1152, 48, 7, "silu", "sigmoid"),
    (72, 24, 28, "relu", "hardsigmoid"), (480, 120, 14, "relu", "hardsigmoid"),
    (960, 240, 7, "relu", "hardsigmoid"),
]:  # fmt: skip
    x = torch.empty(128, c, hw, hw, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    w1, w2 = torch.empty(r, c, 1, 1), torch.empty(c, r, 1, 1)
    b1, b2 = torch.empty(r), torch.empty(c)
    print(f"C={c} R={r} {hw}x{hw}")
    plan = se_ops._Plan(x, w1, b1, w2, b2, act, gate)
    y, saved = plan.forward(x, w1, b1, w2, b2)
    plan.backward(torch.empty_like(x), x, saved, w1, w2)
