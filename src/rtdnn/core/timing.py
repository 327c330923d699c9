"""GPU timing shared by the tile tuner, Find and the benchmarks (see the method notes in
BENCHMARKS.md): median of many runs after warm-up, L2 flushed before each run."""

from __future__ import annotations

import functools
import statistics
import warnings
from collections.abc import Callable

import torch

#: Bytes read before each timed run: several times any GPU's L2.
FLUSH_BYTES = 256 * 2**20


@functools.cache
def _flush_buffer(device: int) -> torch.Tensor:
    return torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device=device)


def flush_l2() -> None:
    """Evict the inputs of the next run from L2 by reading a buffer larger than it.

    Reading, not writing: triton.testing.do_bench zeroes a buffer instead, which leaves L2 full
    of dirty lines that the timed kernels then write back to memory on top of their own
    traffic, up to the L2's size (50 MB on an H100: a third more bytes for an op that moves
    150 MB). After a read the lines are clean and cost nothing to replace."""
    _flush_buffer(torch.cuda.current_device()).amax()


def capture(fn: Callable[[], object]) -> Callable[[], object]:
    """`fn` captured in a CUDA graph, as a callable that replays it (or `fn` itself, with a
    warning, if capture fails). A replay issues all of fn's launches at once, so timing it
    leaves out the host's cost of issuing them.

    The capture runs on the current stream when that is not the default stream: an autograd
    backward captured there runs on the stream its forward ran on, which must be the
    capturing one (call under `torch.cuda.stream(s)` for both the forward and the timing)."""
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
    except RuntimeError as e:
        torch.cuda.synchronize()
        warnings.warn(f"CUDA graph capture failed, timing without it: {e}", stacklevel=3)
        return fn
    return g.replay


def median_time_ms(
    run: Callable[[], object], rep_ms: int = 100, max_runs: int | None = None
) -> float:
    """Median device time of `run()` in milliseconds, each run timed by events after an L2
    flush (`flush_l2`): about rep_ms / 4 ms of runs (flushes included) to warm up, then about
    rep_ms ms of timed ones, at least 10; `max_runs` caps the timed runs at max(10, max_runs)
    and the warm-up at a quarter of max_runs (None: no cap)."""
    timed = []

    def once():
        flush_l2()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        timed.append((start, end))

    first = torch.cuda.Event(enable_timing=True)
    first.record()
    for _ in range(5):
        once()
    timed[-1][1].synchronize()
    per_run = first.elapsed_time(timed[-1][1]) / 5  # flush included
    warm_up, timed_runs = int(rep_ms / 4 / per_run), max(10, int(rep_ms / per_run))
    if max_runs is not None:
        warm_up, timed_runs = min(warm_up, max_runs // 4), min(timed_runs, max(10, max_runs))
    for _ in range(warm_up):
        once()
    timed.clear()
    for _ in range(timed_runs):
        once()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in timed)


def device_time_ms(
    fn: Callable[[], object],
    *,
    rep_ms: int = 100,
    max_runs: int | None = None,
    graph: bool = True,
) -> float:
    """Median time of `fn()` on the current CUDA device, in milliseconds, L2 flushed before
    each run, so that inputs come from device memory as they would inside a network. With
    graph=True (see `capture`) only device time is measured, not the host's cost of
    launching. `rep_ms` and `max_runs` as in `median_time_ms`."""
    return median_time_ms(capture(fn) if graph else fn, rep_ms, max_runs)


def copy_bandwidth(nbytes: int = 2**30) -> float:
    """GB/s (bytes read + bytes written) of a device-to-device copy of `nbytes`: the ceiling
    the memory-bound benchmarks report against. Plain launches, not a graph replay: captured,
    the copy becomes a memcpy node, which ran 20% slower on an H100."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * nbytes / device_time_ms(lambda: b.copy_(a), graph=False) / 1e6
