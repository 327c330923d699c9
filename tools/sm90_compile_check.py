"""Compile-only check without a GPU: make Triton believe an sm_90 device is present, so that
every kernel a test launches is compiled to PTX/cubin (with the bundled ptxas) instead of run.

Catches what the interpreter cannot: compiler-only errors (loop-carried type changes, tuple
items lost after loops, unsupported ops) and missing vectorization. Outputs are garbage, so
value assertions fail; look only for CompilationError and other non-assertion errors
(RTDNN_GPU_TESTS=1 keeps tests/conftest.py from insisting on the interpreter):

    RTDNN_GPU_TESTS=1 PYTHONPATH=src:tools:tests TRITON_INTERPRET=0 \
        python -m pytest -q -p sm90_compile_check tests/test_pooling.py 2>&1 \
        | grep -E "CompilationError|Loop-carried"

Used as a pytest plugin (-p); it relies on Triton 3.6 internals (driver and JITFunction.run).
"""

import os

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.driver import DriverBase  # noqa: E402
from triton.runtime import jit as _jit  # noqa: E402

COMPILED = []  # (kernel name, compiled kernel): .asm["ptx"], .asm["cubin"]


class FakeDriver(DriverBase):
    def is_active(self):
        return True

    def map_python_to_cpp_type(self, ty):
        return ty

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_benchmarker(self):
        raise NotImplementedError

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        import torch

        return torch.cuda

    def get_empty_cache_for_benchmark(self):
        raise NotImplementedError


def install() -> None:
    triton.runtime.driver.set_active(FakeDriver())
    run = _jit.JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        COMPILED.append((self.fn.__name__, kernel))
        return kernel

    _jit.JITFunction.run = compile_only
    import rtdnn.core.handle as handle

    handle.INTERPRETED = True  # let CPU tensors through check_runnable


install()
try:  # no shrinking of "failing" examples: every failure here is expected
    from hypothesis import Phase, settings

    settings.register_profile("compile-only", phases=[Phase.explicit, Phase.generate])
    settings.load_profile("compile-only")
except ImportError:
    pass
