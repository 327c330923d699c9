"""Where kernels run: compiled on a CUDA device, or in Triton's interpreter on the CPU."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence

import torch

from .errors import AllocFailedError, NotSupportedError
from .interpreter import quiet_interpreter

#: Triton decides at import time whether @triton.jit kernels are compiled or interpreted.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRETED:
    quiet_interpreter()


def check_runnable(device: torch.device) -> None:
    """CPU tensors need the interpreter; raise before any kernel is launched otherwise."""
    if device.type == "cpu" and not INTERPRETED:
        raise NotSupportedError(
            "device=cpu is not supported when kernels are compiled: set TRITON_INTERPRET=1 "
            "before importing rtdnn to run them in Triton's interpreter, or use CUDA tensors"
        )


def allocate_workspace(nbytes: int, device: torch.device) -> torch.Tensor | None:
    """A scratch buffer of `nbytes` (None for zero), or AllocFailedError."""
    if nbytes == 0:
        return None
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError as e:
        raise AllocFailedError(f"workspace of {nbytes} bytes could not be allocated: {e}") from e


# Scratch memory that ops keep between calls. Kernels on one CUDA stream run one after the
# other, so a buffer per stream serves every op a thread issues on it: the last kernel of an op
# has finished with it before the next op's first kernel starts. This spares a training step
# hundreds of allocations of small buffers (partial sums between the passes of a reduction).
# Buffers are also per host thread: two threads issuing ops on one stream at once would
# interleave their kernels (one op's second pass reading what another's first pass left).
# Ops issued on two streams get two buffers. In the interpreter kernels run synchronously.
_scratch: dict[tuple, torch.Tensor] = {}


class _Transient(threading.local):
    depth = 0  # > 0 while the thread runs call_with_transient_scratch


_transient = _Transient()


def call_with_transient_scratch(fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs), with every stream_scratch buffer it asks for allocated for the call
    alone (freed when it returns) instead of kept for the stream. For ops called from a
    torch.compile'd graph: under mode="reduce-overhead" its CUDA-graph trees run and record
    the graph with their own memory pool and refuse to go on if memory allocated there
    outlives the call. A captured graph keeps the addresses it recorded, so this suits only
    graphs whose capture tracks every allocation (CUDA-graph trees do); a graph captured by
    torch.cuda.graph around eager calls keeps the cached buffers alive instead."""
    _transient.depth += 1
    try:
        return fn(*args, **kwargs)
    finally:
        _transient.depth -= 1


def _cuda_index(device: torch.device) -> int:
    """A CUDA device's index, the current device's for "cuda" without one."""
    return device.index if device.index is not None else torch._C._cuda_getDevice()


def _owner(device: torch.device) -> tuple:
    """(device, current stream, host thread): who may use a scratch buffer."""
    if device.type != "cuda":
        return device, 0, threading.get_ident()
    return device, torch._C._cuda_getCurrentRawStream(_cuda_index(device)), threading.get_ident()


def stream_scratch(
    device: torch.device,
    name: str,
    numel: int,
    dtype: torch.dtype = torch.float32,
    zeroed: bool = False,
) -> torch.Tensor:
    """A buffer of at least `numel` elements of `dtype`, private to the current stream of
    `device`, the calling thread and `name` (so that one op can hold several at once). Its
    contents are whatever the last op left there (zeros when `zeroed` and new). It grows to the
    largest size asked for. Inside call_with_transient_scratch every call gets a new buffer
    (zeroed when `zeroed`), which nothing keeps."""
    key = None if _transient.depth else (*_owner(device), name)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < numel:
        alloc = torch.zeros if zeroed else torch.empty
        try:
            buf = alloc(max(numel, 1024), dtype=dtype, device=device)
        except torch.OutOfMemoryError as e:
            msg = f"scratch buffer of {numel} x {dtype} could not be allocated: {e}"
            raise AllocFailedError(msg) from e
        if key is not None:
            _scratch[key] = buf
    return buf


def stream_workspace(nbytes: int, device: torch.device) -> torch.Tensor | None:
    """allocate_workspace's result, reused: the current stream's workspace buffer (None for
    zero bytes). For the workspaces rtdnn's ops pass to their own algorithms; a caller's
    `workspace` argument is the caller's."""
    if nbytes == 0:
        return None
    return stream_scratch(device, "workspace", nbytes, torch.uint8)


def stream_counters(device: torch.device, numel: int) -> torch.Tensor:
    """An int32 buffer of at least `numel` arrival counters, zero between kernels: a kernel
    whose programs count their arrivals (so that the last one finishes a reduction) must
    leave every counter it used at zero again, which makes the buffer reusable by the next
    kernel on the stream, and in a captured CUDA graph by every replay."""
    return stream_scratch(device, "counters", numel, torch.int32, zeroed=True)


class _Fork:
    """Side streams for run_concurrently, and the events that fork them from the current
    stream and join them back. Made on first use and kept, per (device index, host thread,
    number of side streams): per thread, as scratch buffers are, since a stream that one
    thread is capturing into a CUDA graph must not receive another thread's launches. An
    event is recorded anew on each use, and a wait takes its latest record, so the events
    are reused rather than made per call (stream.wait_stream makes one per call)."""

    def __init__(self, index: int, count: int):
        self.sides = [torch.cuda.Stream(index) for _ in range(count)]
        self.forked = torch.cuda.Event()
        self.joined = [torch.cuda.Event() for _ in range(count)]


_forks: dict[tuple[int, int, int], _Fork] = {}


def run_concurrently(device: torch.device, calls: Sequence[Callable[[], None]]) -> None:
    """Issue `calls`, whose kernels write disjoint memory, so that the GPU may run them at
    the same time: the first on the current stream, each other on a side stream of its own
    that first waits for all the current stream's earlier work; the current stream then
    waits for every side stream, so later work (and the caching allocator's reuse of freed
    memory) sees them finished, as if they had run in order. Launches that each leave
    multiprocessors idle (backward-data's stride phases on a 7x7 image, one GEMM of 100 tiles
    each on 132 multiprocessors) then fill the GPU together. Works under CUDA-graph capture
    (the graph records the fork and the join). On the CPU the calls run in order."""
    if len(calls) < 2 or device.type != "cuda":
        for call in calls:
            call()
        return
    index = _cuda_index(device)
    key = (index, threading.get_ident(), len(calls) - 1)
    fork = _forks.get(key)
    if fork is None:
        fork = _forks[key] = _Fork(index, len(calls) - 1)
    main = torch.cuda.current_stream(index)
    fork.forked.record(main)
    for side in fork.sides:
        side.wait_event(fork.forked)
    calls[0]()
    # torch.cuda.set_stream switches the stream of the stream's device only; the context
    # manager torch.cuda.stream also makes that device current, at several times the cost.
    switch = torch.cuda.set_stream if index == torch._C._cuda_getDevice() else None
    for side, joined, call in zip(fork.sides, fork.joined, calls[1:], strict=True):
        if switch is None:
            with torch.cuda.stream(side):
                call()
        else:
            switch(side)
            try:
                call()
            finally:
                switch(main)
        joined.record(side)
    for joined in fork.joined:
        main.wait_event(joined)
