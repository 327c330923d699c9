"""GPU timing shared by the tile tuner, Find and the benchmarks (see the method notes in
BENCHMARKS.md): median of many runs after warm-up, L2 flushed before each run."""

from __future__ import annotations

from collections.abc import Callable

import torch


def device_time_ms(fn: Callable[[], object], *, rep_ms: int = 100, graph: bool = True) -> float:
    """Median time of `fn()` on the current CUDA device, in milliseconds.

    With graph=True the call is captured once in a CUDA graph and the graph is replayed, so
    the host-side cost of issuing the launches is left out and only device time is measured;
    if capture fails the call is timed as it is. triton.testing.do_bench flushes L2 before each
    run, so inputs come from device memory as they would inside a network.
    """
    import triton

    run = fn
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the capture stream (cuDNN wants this)
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run = g.replay
        except RuntimeError:
            torch.cuda.synchronize()
    return triton.testing.do_bench(
        run, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median"
    )
