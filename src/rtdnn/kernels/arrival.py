"""Split reductions in one launch: the last program to arrive finishes the reduction.

A reduction split over many programs (per-channel statistics over millions of rows, split-K
GEMM tiles) leaves one partial result per program. Rather than a second kernel to combine them,
each program counts its arrival on a shared counter once its partial is stored; the program
that sees every other one arrived before it combines the partials, in a fixed order (so the
result does not depend on which program came last), and resets the counter to zero for the
next launch. This is the semaphore of CUTLASS's serial split-K.

Memory ordering: every thread's stores precede a CTA barrier, and the counter is incremented
with release-acquire semantics at GPU scope, so the last program sees the others' partials;
it reads them through L2 (`cache_modifier=".cg"`).

A grid barrier (`wait_for_grid`, `grid_sync_once`) goes further: every program waits until all
have arrived, so that a second pass may read what the last program finished. It needs every
program resident at once: a cooperative launch, which CUDA refuses rather than hang.
"""

import triton
import triton.language as tl


@triton.jit
def last_to_arrive(counter, expected):
    """Count this program's arrival at `counter` (int32, zero before the first of `expected`
    arrivals); True in the last program to arrive, which must finish the work. The counter is
    zero again after the last arrival."""
    tl.debug_barrier()  # the whole program's stores come before its arrival
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    last = arrived == expected - 1
    if last:
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
    return last


@triton.jit
def merge_tree(ARRIVALS, block, s, slices, fan_in):
    """Where slice `s` of `slices` sits in a two-level merge tree: the slices form groups of
    `fan_in`; the last of a group to arrive merges the group, and the last group to finish
    merges the groups. Returns (group, members of the group, groups, the counters of `block`:
    one per group and one for the groups, groups + 1 in all)."""
    groups = tl.cdiv(slices, fan_in)
    group = s // fan_in
    members = tl.minimum(fan_in, slices - group * fan_in)
    return group, members, groups, ARRIVALS + block * (groups + 1)


@triton.jit
def wait_for_grid(SYNC, target):
    """Wait until every program of the grid has arrived here as often as `target` says (the
    counter SYNC is raised once per program per barrier). Every program must be resident at
    once (a cooperative launch). The release orders this program's stores before its
    arrival, the acquire the others' before what follows."""
    tl.debug_barrier()
    tl.atomic_add(SYNC, 1, sem="release", scope="gpu")
    while tl.atomic_add(SYNC, 0, sem="acquire", scope="gpu") < target:
        pass
    tl.debug_barrier()


@triton.jit
def grid_sync_once(SYNC, programs):
    """A launch's one grid barrier over its `programs` programs (wait_for_grid). SYNC: two
    int32 counters, zero before the launch and zero again after it: the last program to get
    past the barrier, once every other one has, resets both, so that the buffer serves the
    next launch on the stream as it came."""
    wait_for_grid(SYNC, programs)
    if tl.atomic_add(SYNC + 1, 1, sem="relaxed", scope="gpu") == programs - 1:
        tl.atomic_xchg(SYNC, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(SYNC + 1, 0, sem="relaxed", scope="gpu")
