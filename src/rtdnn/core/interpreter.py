"""Triton's interpreter without its NumPy noise.

The interpreter evaluates every lane of a block, masked-off lanes included (the log of a
padding lane's zero, an -inf minus -inf past the end of a row), and NumPy warns about those
values (RuntimeWarning: "divide by zero", "invalid value", "overflow"); it also converts
one-element arrays to scalars with int(), which NumPy >= 1.25 deprecates (DeprecationWarning:
"Conversion of an array with ndim > 0 to a scalar"). Masked-off lanes are never stored, so none
of this says anything about a result, and a user of the API should not see it.

rtdnn's kernels are launched from many places, but in the interpreter every launch goes through
`InterpretedFunction.run`: it is wrapped once, and only launches of rtdnn's own kernels run
with the warnings silenced, so other libraries' interpreted kernels warn as before. Warnings
are silenced only when raised from Triton's modules, inside the launch; the filters in force
outside it are left as they were (a launch in the interpreter takes milliseconds, so the cost
of saving and restoring them does not show).

Inside those launches the conversion of float32 to bfloat16 also rounds to nearest, ties to
even, as the GPU's does: Triton 3.6's interpreter truncates it (rounds toward zero), which
doubled the rounding error of every bfloat16 result computed on the CPU (measured:
3.3e-3 against 1.7e-3 relative on normal data; `benchmarks/probes/algo_accuracy.py`).
"""

from __future__ import annotations

import contextvars
import functools
import warnings

_TRITON_MODULES = r"triton\."
#: Set while one of rtdnn's kernels runs in the interpreter.
_in_rtdnn_kernel = contextvars.ContextVar("rtdnn_kernel", default=False)


def float32_to_bfloat16_bits(values):
    """The bfloat16 bit patterns (uint16) nearest to float32 `values` (ties to even; NaN stays
    a quiet NaN of the same sign, values past the largest bfloat16 round to infinity)."""
    import numpy as np

    floats = np.asarray(values, dtype=np.float32)
    bits = floats.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(floats)
    rounded[nan] = (bits[nan] >> 16) | 0x40
    return rounded.astype(np.uint16)


def _round_bfloat16_to_nearest() -> None:
    """Make the interpreter's float32 -> bfloat16 conversion round to nearest inside rtdnn's
    launches (see the module docstring); other launches keep Triton's conversion."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    cast = builder.cast_impl
    if getattr(cast, "rtdnn_rounding", False):
        return

    @functools.wraps(cast)
    def cast_impl(self, src, dst_type):
        if (
            _in_rtdnn_kernel.get()
            and src.dtype.scalar == tl.float32
            and dst_type.scalar == tl.bfloat16
        ):
            return interpreter.TensorHandle(float32_to_bfloat16_bits(src.data), dst_type.scalar)
        return cast(self, src, dst_type)

    cast_impl.rtdnn_rounding = True
    builder.cast_impl = cast_impl  # create_fp_trunc and the other casts call self.cast_impl


def quiet_interpreter() -> None:
    """Silence the interpreter's NumPy warnings around launches of rtdnn's kernels."""
    import numpy as np
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run
    if getattr(run, "rtdnn_quiet", False):
        return

    @functools.wraps(run)
    def quiet_run(self, *args, **kwargs):
        if not getattr(self.fn, "__module__", "").startswith("rtdnn."):
            return run(self, *args, **kwargs)
        token = _in_rtdnn_kernel.set(True)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                for category in (RuntimeWarning, DeprecationWarning):
                    warnings.filterwarnings("ignore", category=category, module=_TRITON_MODULES)
                return run(self, *args, **kwargs)
        finally:
            _in_rtdnn_kernel.reset(token)

    quiet_run.rtdnn_quiet = True
    InterpretedFunction.run = quiet_run
    _round_bfloat16_to_nearest()
