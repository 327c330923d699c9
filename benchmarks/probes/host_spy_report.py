"""Where the host's time goes in host_spy.py's loop, from py-spy's raw output recorded with
--threads (one line per distinct stack: 'thread (TID): NAME', frames separated by ';', then a
count of samples). The main thread's samples inside timed_loop are kept; of the other threads,
those of autograd's engine working on a node (evaluate_function) and, counted apart, the
engine's idle ones. Samples inside a compilation (Triton's compiler, the first call of a
kernel signature) are left out and counted.
    python benchmarks/probes/host_spy_report.py OUT.txt [TOP]
Prints, per thread: the samples, the top frames by own samples (the stack's last frame; with
--native, C++ frames count apart from the Python that called them) and by inclusive samples
(each frame counted once per stack).
"""

import collections
import re
import sys

path = sys.argv[1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
own: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
inclusive: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
totals: collections.Counter = collections.Counter()
compiling = 0


def compiles(frame: str) -> bool:
    """A frame of a kernel's compilation (a warm-up step's first call of a signature)."""
    return "triton/compiler/" in frame or "_do_compile" in frame or "triton/runtime/build" in frame


def frame_name(frame: str) -> str:
    """A frame without its line number, with a short path and no template arguments."""
    frame = re.sub(r":\d+\)$", ")", frame.strip())
    frame = re.sub(r"\(.*/(site-packages|src)/", "(", frame)
    while "<" in frame and re.search(r"<[^<>]*>", frame):
        frame = re.sub(r"<[^<>]*>", "", frame)
    return frame[:110]


for line in open(path):
    stack, _, count = line.rstrip("\n").rpartition(" ")
    if not count.isdigit():
        continue
    thread, *frames = stack.split(";")
    if any(compiles(f) for f in frames):
        compiling += int(count)
        continue
    if "MainThread" in thread:
        if not any("timed_loop" in f for f in frames):
            continue
        kind = "main thread, in timed_loop"
    elif any("evaluate_function" in f for f in frames):
        kind = "autograd engine threads, working"
    elif any("thread_main" in f for f in frames):
        kind = "autograd engine threads, waiting"
    else:
        continue
    n = int(count)
    totals[kind] += n
    names = [frame_name(f) for f in frames]
    if names:
        own[kind][names[-1]] += n
    for name in set(names):
        inclusive[kind][name] += n

print(f"(left out: {compiling} samples inside compilations)")
for kind, total in sorted(totals.items()):
    print(f"== {kind}: {total} samples")
    if kind.endswith("waiting"):
        continue
    print("-- own")
    for name, n in own[kind].most_common(top):
        print(f"{100 * n / total:6.1f}%  {name}")
    print("-- inclusive")
    for name, n in inclusive[kind].most_common(top):
        print(f"{100 * n / total:6.1f}%  {name}")
