"""Timing helpers for the scripts in this folder (run them from the repository root): host time
per call, GPU time per kernel, profiles."""

import collections
import time

import torch


def host_us(fn, calls: int = 100, reps: int = 20) -> tuple[float, float]:
    """(host us, GPU span us) per call of fn. Calls go in short bursts, with the GPU drained
    between them, so the launch queue never fills and the host figure is the host's own cost;
    the GPU span (first launch to last kernel's end, per call) is larger when the GPU is the
    slower."""
    for _ in range(20):
        fn()
    host = span = 0.0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host += time.perf_counter() - t0
        end.record()
        torch.cuda.synchronize()
        span += start.elapsed_time(end) / 1e3
    return host / (calls * reps) * 1e6, span / (calls * reps) * 1e6


def autocast():
    """bf16 autocast on the GPU, as `rtdnn bench --model` runs."""
    return torch.autocast("cuda", dtype=torch.bfloat16)


def train_step(m, x: torch.Tensor):
    """A function running one training step of the layer m on x: autocast forward, then
    backward from a gradient of ones."""

    def step():
        with autocast():
            y = m(x)
        y.backward(torch.ones_like(y))

    return step


def forward_only(m, x: torch.Tensor):
    """A function running m's autocast forward on x (recorded by autograd if x needs grad)."""

    def step():
        with autocast():
            m(x)

    return step


class Identity(torch.autograd.Function):
    """The least a Python autograd node costs."""

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        return g


def sgd_train_step(net, loss_fn, x: torch.Tensor, target: torch.Tensor):
    """A function running one training step of `net` as `rtdnn bench --model` does: bf16
    autocast forward and loss, backward, SGD with momentum."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(net(x).float(), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def profile_steps(step, path: str, steps: int = 5, lines: int = 70) -> None:
    """A Python profile of `steps` calls of step, each issued with the GPU drained, written to
    `path` sorted by own time and by cumulative time. The backward runs on the calling thread
    (cProfile sees one thread; autograd's engine thread would be left out)."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    with torch.autograd.set_multithreading_enabled(False):
        for _ in range(steps):
            torch.cuda.synchronize()
            pr.enable()
            step()
            pr.disable()
    torch.cuda.synchronize()
    with open(path, "w") as f:
        st = pstats.Stats(pr, stream=f)
        st.sort_stats("tottime").print_stats(lines)
        st.sort_stats("cumulative").print_stats(lines)


def resnet50_pair(batch: int = 128, name: str = "resnet50"):
    """(a torchvision model, ResNet-50 by default, its fused rtdnn conversion, input, target) on
    the GPU, as `rtdnn bench --model NAME` builds them: channels-last, cuDNN in benchmark
    mode."""
    import rtdnn
    from rtdnn.bench.model import build

    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model, size = build(name)
    model = model.cuda().to(memory_format=torch.channels_last)
    converted, _ = rtdnn.convert(model, fuse=True)
    x = torch.randn(batch, 3, size, size, device="cuda").to(memory_format=torch.channels_last)
    target = torch.randint(0, 10, (batch,), device="cuda")
    return model, converted, x, target


def kernel_times(fn, steps: int = 20, width: int = 60) -> dict[str, float]:
    """Mean GPU microseconds per call of each kernel `fn` launches (torch.profiler), by the
    first `width` characters of the kernel's name."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    per: dict[str, float] = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:width]] += e.device_time / steps
    return {k: round(v, 2) for k, v in per.items()}


def print_best(results: list[dict], problem: tuple[str, ...]) -> None:
    """For each problem (the values of the `problem` keys), the fastest row by "ms", beside the
    problem's first row (a sweep's default configuration)."""
    best: dict[tuple, dict] = {}
    first: dict[tuple, dict] = {}
    for r in results:
        k = tuple(r[name] for name in problem)
        first.setdefault(k, r)
        if k not in best or r["ms"] < best[k]["ms"]:
            best[k] = r
    for k, r in best.items():
        print("BEST", k, r, "first configuration", first[k]["ms"], "ms")
