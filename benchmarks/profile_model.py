"""Host-side profile of a converted ResNet-50's training and inference steps.

Prints the wall time per step beside the unconverted model's and the functions that take the
host's time (cProfile), to find where per-call overhead goes. Usage on a GPU machine:
    PYTHONPATH=src python benchmarks/profile_model.py [batch] [out_dir]
"""

import cProfile
import io
import pstats
import sys
import time

import torch
import torchvision

import rtdnn

batch = int(sys.argv[1]) if len(sys.argv) > 1 else 32
out_dir = sys.argv[2] if len(sys.argv) > 2 else "."
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
model = torchvision.models.resnet50(weights=None).cuda().to(memory_format=torch.channels_last)
converted, _ = rtdnn.convert(model)
x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
target = torch.randint(0, 1000, (batch,), device="cuda")


def make_steps(net):
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def train():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(net(x).float(), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def infer():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            net(x)

    return train, infer


def wall_ms(step, n=10):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e3


def host_ms(step, n=10):
    """Host time alone: the launches queue up without waiting for the GPU."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        step()
    host = (time.perf_counter() - start) / n * 1e3
    torch.cuda.synchronize()
    return host


lines = []
for label, net in (("pytorch", model), ("rtdnn", converted)):
    train, infer = make_steps(net)
    net.train()
    t_wall, t_host = wall_ms(train), host_ms(train)
    net.eval()
    i_wall, i_host = wall_ms(infer), host_ms(infer)
    lines.append(
        f"{label:8s} batch {batch}: train {t_wall:7.2f} ms/step (host {t_host:7.2f}), "
        f"infer {i_wall:7.2f} ms (host {i_host:7.2f})"
    )
    print(lines[-1], flush=True)

train, infer = make_steps(converted)
for label, step, mode in (("train", train, True), ("infer", infer, False)):
    converted.train(mode)
    step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        step()
    prof.disable()
    torch.cuda.synchronize()
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(45)
        text = s.getvalue()
        lines.append(f"\n===== {label} by {key} (5 steps)\n{text}")
with open(f"{out_dir}/profile_model.txt", "w") as f:
    f.write("\n".join(lines))
