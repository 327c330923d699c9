"""Algorithm selection: by heuristic with a preference (Get) or by running them all (Find).

What Find measures is kept in this process and in the tuning database (select.database), so
that a problem measured once, in this process or an earlier one in the same environment, is
not measured again and `algo="auto"` runs the measured choice.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..algos import (
    ALGORITHMS,
    NO_WORKSPACE,
    ConvAlgorithm,
    ConvTensors,
    get_algorithm,
    supported_algorithms,
    tiles,
)
from ..algos.direct import direct_preferred
from ..algos.fft import fft_preferred
from ..algos.gemm import gemm_preferred
from ..algos.implicit_gemm import split_k_preferred
from ..algos.implicit_precomp_gemm import precomp_preferred
from ..algos.winograd import winograd_preferred
from ..core import ConvProblem, NotSupportedError, allocate_workspace, bad_param
from ..core.timing import device_time_ms
from . import database, shipped

PREFERENCES = ("fastest", "no_workspace")

# Results known to this process, per problem, fastest first: measured by find or read from the
# tuning database. choose prefers them over the heuristic; find returns them.
_measured: dict[ConvProblem, list[AlgoPerf]] = {}
# Problems the database had no results for when choose asked, so that it asks once.
_not_stored: set[ConvProblem] = set()

tiles.set_store(database.TileChoices(), shipped.ShippedTiles())


@dataclass(frozen=True)
class AlgoPerf:
    """One algorithm's result for one problem, as cuDNN's Find returns it."""

    algo: str
    time_ms: float
    workspace_bytes: int
    deterministic: bool
    status: str = "ok"


def _check_limit(workspace_limit: int | None) -> None:
    if workspace_limit is not None and (
        not isinstance(workspace_limit, int) or workspace_limit < 0
    ):
        raise bad_param("workspace_limit", workspace_limit, "None or an int >= 0 (bytes)")


def _heuristic_order(p: ConvProblem) -> list[str]:
    """Algorithms from the likely fastest down, without running anything."""
    # Depthwise: memory-bound, where DIRECT's FMA tiles beat GEMMs whose tensor-core tiles
    # would be mostly empty (see algos.direct.PREFER_UP_TO_KG for what was measured).
    first = ["DIRECT"] if direct_preferred(p) else []
    # Strict float32 3x3: Winograd's GEMMs run on tensor cores (3xTF32), the implicit GEMM's
    # on FMA units (see algos.winograd.PREFER_FROM_CHANNELS).
    if winograd_preferred(p):
        first.append("WINOGRAD_NONFUSED")
    # Strict float32 with large filters (9x9 and up, 1-D 31 taps and up): the transforms'
    # cost does not grow with the taps (see algos.fft.PREFER_FROM_TAPS).
    first += fft_preferred(p)
    # Backward-data of an RGB stem or a 1-channel input: the implicit GEMMs' output is a few
    # columns wide, GEMM's is not (see algos.gemm.PREFER_BACKWARD_DATA_UP_TO_C). Its
    # workspace is large (450 MiB for ResNet-50's stem at batch 64): up to 1/32 of the
    # device's memory (algos.gemm.PREFER_UP_TO_MEMORY_SHARE), and under a tighter limit the
    # list goes on to the implicit GEMM.
    if gemm_preferred(p):
        first.append("GEMM")
    # TF32 on Hopper with a filter whose reduced channels are not contiguous (backward-data of
    # a channels-last or NCHW filter, forward of an NCHW one): the implicit GEMM on a copy that
    # has them (see algos.implicit_precomp_gemm.tf32_filter_copy).
    if precomp_preferred(p):
        first.append("IMPLICIT_PRECOMP_GEMM")
    # Split-K pays off where the output alone cannot fill the device and the reduction is
    # long (see algos.implicit_gemm.split_k_preferred); elsewhere Find can still pick it.
    if split_k_preferred(p):
        return [*first, "IMPLICIT_GEMM_SPLIT_K", "IMPLICIT_GEMM", "GEMM"]
    return [*first, "IMPLICIT_GEMM", "IMPLICIT_GEMM_SPLIT_K", "GEMM"]


def choose(
    p: ConvProblem,
    preference: str = "fastest",
    workspace_limit: int | None = None,
    deterministic: bool = False,
) -> ConvAlgorithm:
    """The algorithm to run `p` with, under the preference and the workspace limit (bytes);
    `deterministic`: only among algorithms whose results repeat bit for bit on `p`."""
    if preference not in PREFERENCES:
        raise bad_param("preference", preference, f"one of {PREFERENCES}")
    _check_limit(workspace_limit)
    if preference == "no_workspace":
        workspace_limit = 0

    def fits(a: ConvAlgorithm) -> bool:
        return (
            a.supports(p) is None
            and (workspace_limit is None or a.workspace_bytes(p) <= workspace_limit)
            and (not deterministic or a.deterministic(p))
        )

    measured = [r.algo for r in _known(p) if r.status == "ok"]
    for name in measured + _heuristic_order(p):
        if fits(ALGORITHMS[name]):
            return ALGORITHMS[name]
    return ALGORITHMS[NO_WORKSPACE]  # supports everything, needs nothing, is deterministic


def resolve(
    p: ConvProblem, algo: str, workspace_limit: int | None, deterministic: bool = False
) -> ConvAlgorithm:
    """`algo` ("auto" or a name) checked against `p`, the workspace limit and, when
    `deterministic`, whether its results repeat bit for bit."""
    if algo == "auto":
        return choose(p, "fastest", workspace_limit, deterministic)
    _check_limit(workspace_limit)
    a = get_algorithm(algo)
    reason = a.supports(p)
    if reason is not None:
        raise NotSupportedError(f"algo={algo!r} is not supported for this problem: {reason}")
    if deterministic and not a.deterministic(p):
        raise bad_param(
            "algo",
            algo,
            "a deterministic algorithm, as deterministic=True (or "
            f"torch.use_deterministic_algorithms(True)) asks: {a.name}'s results on this "
            "problem may differ from run to run",
        )
    need = a.workspace_bytes(p)
    if workspace_limit is not None and need > workspace_limit:
        raise bad_param(
            "workspace_limit", workspace_limit, f">= {need} bytes, what algo={algo!r} needs"
        )
    return a


#: Timed runs per algorithm in Find (at most; after a warm-up of a quarter as many): a median
#: of 30 L2-flushed graph replays, where 50 ms of runs of a fast convolution (a 0.05 ms
#: micro-batch) would be hundreds. mu-cuDNN's policy "all" runs Find at every batch size from
#: 1 to N (ResNet-18 at batch 64: about 6 minutes of Find on an H100, BENCHMARKS.md).
FIND_RUNS = 30


def _time_ms(fn, device: str) -> float:
    if device == "cuda":
        return device_time_ms(fn, rep_ms=50, max_runs=FIND_RUNS)
    fn()  # the interpreter has nothing to warm up beyond this
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _stored(p: ConvProblem, env: database.Environment) -> list[AlgoPerf] | None:
    """The results the tuning database holds for p in `env`, fastest first; None if it holds
    none, or results for another set of algorithms than those that support p now."""
    entries = database.database().lookup(p.key(), p.batch, env)
    if {e.algo for e in entries} != {a.name for a in supported_algorithms(p)}:
        return None
    results = [
        AlgoPerf(e.algo, e.time_ms, e.workspace_bytes, e.deterministic, e.status) for e in entries
    ]
    return sorted(results, key=lambda r: r.time_ms)


def _known(p: ConvProblem) -> list[AlgoPerf]:
    """The results known for p: this process's, else the database's (read once); [] if none."""
    if p in _measured:
        return _measured[p]
    if p in _not_stored:
        return []
    stored = _stored(p, database.environment(p.device))
    if stored is None:
        _not_stored.add(p)
        return []
    _measured[p] = stored
    return stored


def forget() -> None:
    """Forget the results held in this process (the tuning database keeps its own)."""
    _measured.clear()
    _not_stored.clear()


def find(p: ConvProblem, tensors: ConvTensors, refresh: bool = False) -> list[AlgoPerf]:
    """Every supported algorithm's result on p, fastest first.

    Results already measured for p, in this process or stored in the tuning database for this
    environment, are returned without running anything. Otherwise, or with `refresh`, every
    algorithm is run on `tensors` (scratch data of p's shapes; the written one is
    overwritten), and the results are stored. `choose` uses them either way.
    """
    env = database.environment(tensors.x.device)
    if not refresh:
        known = _measured.get(p) or _stored(p, env)
        if known:
            _measured[p] = known
            return list(known)
    results = []
    for a in supported_algorithms(p):
        need = a.workspace_bytes(p)
        try:
            ws = allocate_workspace(need, torch.device(tensors.x.device))
            ms = _time_ms(lambda a=a, ws=ws: a.run(p, tensors, ws), p.device)
            results.append(AlgoPerf(a.name, ms, need, a.deterministic(p)))
        except Exception as e:  # one failing algorithm must not hide the others
            results.append(AlgoPerf(a.name, math.inf, need, a.deterministic(p), f"failed: {e}"))
    results.sort(key=lambda r: r.time_ms)
    _measured[p] = results
    _not_stored.discard(p)
    database.database().store(p.key(), p.batch, env, results)
    return list(results)


__all__ = ["PREFERENCES", "AlgoPerf", "choose", "database", "find", "forget", "resolve"]
