"""SlotLaunch's GPU road on the CPU, for the host probes (host_hopper_cpu.py,
host_profile_cpu.py, host_slot_launch_cpu.py): the current device and stream stood in for,
and each compiled kernel a C entry point that does nothing (or calls `on_launch`), stored by
the first call of a signature in place of Triton's compile. What runs is rtdnn's Python from
a prepared launch to the C entry point: keys, arguments, descriptors. Import it after setting
TRITON_INTERPRET (rtdnn takes CPU tensors; nothing is interpreted on this road)."""

from collections.abc import Callable

import torch

from rtdnn.kernels import launch


class NoKernel(launch._Compiled):
    """A compiled kernel whose C entry point does nothing but call `on_launch`, if given."""

    def __init__(self, on_launch: Callable[[], None] | None = None):
        self.function, self.metadata, self.flags = None, None, (False, False)
        self.c_launch = (lambda *args: on_launch()) if on_launch else (lambda *args: None)
        self.descriptors, self.tensor_maps = (), {}


def slot_launches_on_the_cpu(on_launch: Callable[[], None] | None = None) -> None:
    """SlotLaunch runs as on a GPU, up to a NoKernel's entry point."""
    torch._C._cuda_getDevice = lambda: 0
    torch._C._cuda_getCurrentRawStream = lambda device: 0
    launch.INTERPRETED = False
    launch.SlotLaunch._slow_path = lambda self, key, compiled, values: self.compiled.__setitem__(
        key, NoKernel(on_launch)
    )
