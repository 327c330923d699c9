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


def ptxas_log(kernel) -> str:
    """What Triton's bundled ptxas says, with -v, when it assembles a compiled kernel's PTX
    for sm_90a: registers, spill bytes and warnings (C7515: warp-group MMAs serialized)."""
    import subprocess
    import tempfile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(kernel.asm["ptx"])
        f.flush()
        return subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                              capture_output=True, text=True).stderr  # fmt: skip


def compile_only(keep: list | None = None) -> set:
    """Make every Triton launch compile its kernel (a warm-up) instead of running it. Returns
    the set of (kernel name, hash) compiled, which fills as launches happen; `keep`, a list,
    also receives each compiled kernel (to read its code), in launch order."""
    from triton.runtime.jit import JITFunction

    compiled: set = set()
    run = JITFunction.run

    def _compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.add((self.__name__, kernel.hash))
        if keep is not None:
            keep.append(kernel)
        return kernel

    JITFunction.run = _compile_only
    return compiled


def accept_cpu_tensors() -> None:
    """Let rtdnn take CPU tensors where it would want CUDA ones, and never keep a compiled
    kernel to launch directly (there is nothing to launch on). Call after importing rtdnn."""
    from rtdnn.kernels import launch

    launch.INTERPRETED = True
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("rtdnn") and hasattr(
            module, "check_runnable"
        ):
            module.check_runnable = lambda device: None
