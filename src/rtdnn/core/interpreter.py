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
"""

from __future__ import annotations

import functools
import warnings

_TRITON_MODULES = r"triton\."


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
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            for category in (RuntimeWarning, DeprecationWarning):
                warnings.filterwarnings("ignore", category=category, module=_TRITON_MODULES)
            return run(self, *args, **kwargs)

    quiet_run.rtdnn_quiet = True
    InterpretedFunction.run = quiet_run
