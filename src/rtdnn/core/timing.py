"""GPU timing shared by the tile tuner, Find and the benchmarks (see the method notes in
BENCHMARKS.md): median of many runs after warm-up, L2 flushed before each run."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch


def device_time_ms(fn: Callable[[], object], *, rep_ms: int = 100, graph: bool = True) -> float:
    """Median time of `fn()` on the current CUDA device, in milliseconds.

    With graph=True the call is captured once in a CUDA graph and the graph is replayed, so
    the host-side cost of issuing the launches is left out and only device time is measured;
    if capture fails the call is timed as it is, with a warning. triton.testing.do_bench
    flushes L2 before each run, so inputs come from device memory as they would inside a
    network.

    The capture runs on the current stream when that is not the default stream: an autograd
    backward captured there runs on the stream its forward ran on, which must be the
    capturing one (call under `torch.cuda.stream(s)` for both the forward and the timing).
    """
    import triton

    run = fn
    if graph:
        caller = torch.cuda.current_stream()
        side = caller if caller != torch.cuda.default_stream() else torch.cuda.Stream()
        side.wait_stream(caller)
        with torch.cuda.stream(side):  # warm up off the default stream (cuDNN wants this)
            for _ in range(3):
                fn()
        caller.wait_stream(side)
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=side):
                fn()
            run = g.replay
        except RuntimeError as e:
            torch.cuda.synchronize()
            warnings.warn(f"CUDA graph capture failed, timing without it: {e}", stacklevel=2)
    return triton.testing.do_bench(
        run, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median"
    )
