"""Programmatic dependent launch: the next kernel on the stream starts while this one ends.

Between two kernels on a stream the GPU normally drains the first grid completely before it
launches the second, and the second's programs then take a few microseconds to spread over
the SMs. For an op of two or three memory-bound kernels of 10 to 70 us each (normalization's
statistics and elementwise passes) that gap is several percent of the op.

On Hopper and later a kernel launched with `launch_pdl=True` may be launched before the
kernel ahead of it on the stream has finished, once every program of that kernel has
allowed it (`gdc_launch_dependents`) or exited. Its programs wait at `gdc_wait` until that
kernel has finished and its writes are visible, so nothing is read or written early; what
overlaps is the launch and the placement of programs on the SMs.

`follow_prior_grid` is the first statement of every kernel launched this way: wait for the
kernel before, then let the next one launch. The order matters: a kernel that allowed its
dependents before waiting could let them start while its own predecessor still runs.
Every grid that waits has finished only after the one before it, so waiting for the prior
grid waits for all earlier work on the stream.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def follow_prior_grid(PDL: tl.constexpr):
    """With PDL (a kernel launched with launch_pdl=True on sm_90 or later): wait until the
    previous kernel on the stream has finished, then allow the next kernel to launch. A no-op
    without PDL (and in the interpreter, which has no inline assembly)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
