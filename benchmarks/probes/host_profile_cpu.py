"""Where the host's Python time goes in a converted model's training step, without a GPU: the
model runs on the CPU with every Triton launch stubbed out (no kernel runs, results are
meaningless), so what is timed is rtdnn's Python per call (checks, plans, allocation, the
autograd nodes) plus PyTorch's own CPU ops for the layers rtdnn does not replace. Prints the
step's host milliseconds, the launches it would make, and the profile's top functions.

    PYTHONPATH=src python benchmarks/probes/host_profile_cpu.py [MODEL] [BATCH] [TOP]
    (MODEL: a torchvision model name, default efficientnet_b0; needs torchvision)

A CUDA launch costs the host more than a stub does (the driver call, CUDA allocations), so
the figures are a floor of the GPU machine's host time per step, for comparing versions.
With SLOT_LAUNCH=1 the launches go the GPU's road up to the driver instead: SlotLaunch keys
and binds every argument (the current device and stream stood in for) and calls a C entry
point that does nothing, so its own Python is in the step and the profile; the step with
SlotLaunch stubbed is timed first, for the difference.
"""

import cProfile
import os
import pstats
import sys
import time
import types

os.environ["TRITON_INTERPRET"] = "1"  # rtdnn takes CPU tensors; the stubs below run nothing
# torchvision's compiled operators may not match this torch build: its meta registrations are
# not needed for the models.
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("meta"))

import torch  # noqa: E402
import torchvision  # noqa: E402
from gpu_road_cpu import slot_launches_on_the_cpu  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

import rtdnn  # noqa: E402
from rtdnn.kernels import launch  # noqa: E402

LAUNCHES = [0]


def _no_kernel(self, *args, **kwargs):
    LAUNCHES[0] += 1


def stub_launches() -> None:
    """Every Triton kernel launch becomes a count."""
    InterpretedFunction.run = _no_kernel
    InterpretedFunction.__getitem__ = lambda self, grid: types.MethodType(_no_kernel, self)
    launch.SlotLaunch.__call__ = _no_kernel


def slot_launches_to_the_entry_point() -> None:
    """SlotLaunch runs as on a GPU (gpu_road_cpu.py) up to a C entry point that counts the
    launch and does nothing."""
    launch.SlotLaunch.__call__ = SLOT_CALL
    slot_launches_on_the_cpu(lambda: _no_kernel(None))


SLOT_CALL = launch.SlotLaunch.__call__


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "efficientnet_b0"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    model = model.to(torch.bfloat16).to(memory_format=torch.channels_last).train()
    converted, _ = rtdnn.convert(model, fuse=True)
    size = 224 if name.startswith("vit") else 64  # ViT's patch grid is fixed
    x = torch.randn(batch, 3, size, size, dtype=torch.bfloat16)
    x = x.to(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (batch,))
    loss_fn = rtdnn.nn.CrossEntropyLoss()
    stub_launches()

    def step():
        # As a training loop does: gradients set to None, not accumulated (on the CPU an
        # accumulation is real arithmetic over every parameter, which would swamp the profile).
        converted.zero_grad(set_to_none=True)
        loss = loss_fn(converted(x).float(), target)
        loss.backward()

    steps = 10

    def timed(what: str) -> None:
        for _ in range(3):
            step()
        LAUNCHES[0] = 0
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            best = min(best, (time.perf_counter() - t0) / steps * 1e3)
        print(f"{name}, batch {batch}: {best:.2f} ms host per training step, "
              f"{LAUNCHES[0] / steps / 3:.0f} launches ({what})")  # fmt: skip

    timed("stubbed")
    if os.environ.get("SLOT_LAUNCH") == "1":
        slot_launches_to_the_entry_point()
        timed("SlotLaunch to a C entry point that does nothing")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        step()
    profile.disable()
    stats = pstats.Stats(profile).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)


if __name__ == "__main__":
    main()
