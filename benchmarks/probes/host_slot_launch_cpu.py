"""SlotLaunch's own host time for a converted model's training step, on the CPU: the step runs
once with every launch recorded (the SlotLaunch and the values it was called with, on the
GPU's road up to a C entry point that does nothing, as host_profile_cpu.py's SLOT_LAUNCH=1
sets it up), then the recorded launches are replayed alone, timed, many times. Prints the
microseconds of one step's launches and of one launch: the figure to compare versions of
SlotLaunch by (the kernels differ from a GPU's, the launch path does not).

    PYTHONPATH=src python benchmarks/probes/host_slot_launch_cpu.py [MODEL] [BATCH]
"""

import sys
import timeit

import host_profile_cpu as h
import torch
import torchvision

import rtdnn
from rtdnn.kernels import launch


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    model = model.to(torch.bfloat16).to(memory_format=torch.channels_last).train()
    converted, _ = rtdnn.convert(model, fuse=True)
    x = torch.randn(batch, 3, 64, 64, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (batch,))
    loss_fn = rtdnn.nn.CrossEntropyLoss()
    h.stub_launches()
    h.slot_launches_to_the_entry_point()

    def step():
        converted.zero_grad(set_to_none=True)
        loss_fn(converted(x).float(), target).backward()

    for _ in range(3):
        step()
    recorded = []

    def record(self, *values):
        recorded.append((self, values))
        h.SLOT_CALL(self, *values)

    launch.SlotLaunch.__call__ = record
    step()
    launch.SlotLaunch.__call__ = h.SLOT_CALL
    call = h.SLOT_CALL

    def replay():
        for slot_launch, values in recorded:
            call(slot_launch, *values)

    rounds = 200
    best = min(timeit.repeat(replay, number=rounds, repeat=7)) / rounds
    print(f"{name}, batch {batch}: {len(recorded)} launches a step, SlotLaunch {best * 1e6:.0f} us "
          f"a step, {best / len(recorded) * 1e6:.2f} us a launch")  # fmt: skip


if __name__ == "__main__":
    main()
