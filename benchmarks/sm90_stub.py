"""A stand-in CUDA driver that reports an sm_90 target, so Triton compiles kernels for Hopper on
a machine without a GPU. Import and call `activate()` before rtdnn is imported; used by the
offline compile checks in this folder. Relies on Triton 3.6 internals (CudaDriver)."""

import os
import sys

import torch
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaDriver
from triton.runtime import driver


class Sm90Stub(CudaDriver):
    def __init__(self):
        pass

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cuda", 0)


def activate() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: this compiles the kernels")
    driver.set_active(Sm90Stub())
