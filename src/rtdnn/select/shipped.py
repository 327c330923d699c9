"""Tile choices that ship with rtdnn, so that a first call runs tuned tiles without timing any.

`shipped_tiles.json` (next to this module) holds what the tile tuner chose in sweeps of common
layers on a GPU, one table per GPU swept. A table serves every GPU of the same compute
capability and multiprocessor count: a tile's speed depends on the architecture, and how
evenly its programs fill the GPU on the count. A problem found in the table takes its choice;
one found only at other batch sizes (the same layer, the batch size aside) takes the choice of
the nearest batch size; a float16 problem the table lacks takes bfloat16's. With tuning off
(RTDNN_AUTOTUNE=0), a convolution found neither way takes the choice of the nearest-sized one
of the same kind (shape_class), which is more likely to suit it than the heuristic's first
candidate; with tuning on it is measured instead.
The tuner still checks that a shipped choice is one of its candidates (a later version may
offer others).

`tools/ship_tiles.py` writes the tables from a sweep's tuning database.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re

import torch

from ..kernels.launch import TileConfig
from .database import tiles_from_fields, tuner_key_parts

PATH = os.path.join(os.path.dirname(__file__), "shipped_tiles.json")
FORMAT = 1

# The batch size in a convolution's problem key (ConvProblem.key: "...|x(N, C, *S)(strides)|...").
# Strides of dense layouts do not depend on N, so the rest of the key names the layer.
_BATCH = re.compile(r"\|x\((\d+),")


# The dtype in a problem key (ConvProblem.key, the linear layers' keys): "|torch.float16|".
_FLOAT16, _BFLOAT16 = f"|{torch.float16}|", f"|{torch.bfloat16}|"

# A convolution's problem key in parts (ConvProblem.key): direction|dtype|math|x(shape)(strides)
# |w(shape)(strides)|y(strides)|the convolution's parameters, bias, device, activation.
_CONV_KEY = re.compile(
    r"^(?P<head>[^|]+\|[^|]+\|[^|]+)\|x\((?P<x>[^)]*)\)\((?P<xs>[^)]*)\)"
    r"\|w\((?P<w>[^)]*)\)\((?P<ws>[^)]*)\)\|y\((?P<ys>[^)]*)\)\|(?P<rest>.*)$"
)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def shape_class(problem: str) -> tuple[tuple, tuple[int, int, int]] | None:
    """(what a convolution's key says besides its sizes: direction, dtype, math, filter size,
    stride, padding, dilation, groups, mode, bias, device, activation, and whether each tensor
    is channels-last; its sizes: pixels N x spatial, input channels, output channels), or
    None for a key that is not a convolution's."""
    m = _CONV_KEY.match(problem)
    if m is None:
        return None
    x, w = _ints(m["x"]), _ints(m["w"])
    xs, ws, ys = _ints(m["xs"]), _ints(m["ws"]), _ints(m["ys"])
    if len(x) < 3 or len(w) != len(x) or len(xs) != len(x) or len(ws) != len(w):
        return None
    # Channels-last: the channel stride is 1 (and the tensor has more than one channel).
    layouts = tuple(len(st) > 1 and st[1] == 1 for st in (xs, ws, ys))
    return (m["head"], w[2:], m["rest"], layouts), (math.prod(x[:1] + x[2:]), x[1], w[0])


def batch_class(problem: str) -> tuple[str, int] | None:
    """(the problem key with its batch size taken out, the batch size), or None for a key
    without one (a linear layer's)."""
    m = _BATCH.search(problem)
    if m is None:
        return None
    return problem[: m.start()] + "|x(N," + problem[m.end() :], int(m.group(1))


class Table:
    """One GPU's shipped choices, by (algorithm, problem), by (algorithm, batch class) and by
    (algorithm, shape class)."""

    def __init__(self, entries: list[dict]):
        self.exact: dict[tuple[str, str], TileConfig] = {}
        self.by_class: dict[tuple[str, str], list[tuple[int, TileConfig]]] = {}
        self.by_shape: dict[tuple[str, tuple], list[tuple[tuple, TileConfig]]] = {}
        for e in entries:
            tiles = tiles_from_fields(dict(e["tiles"]))
            if tiles is None:
                continue  # a tile class this version no longer has
            self.exact[e["algo"], e["problem"]] = tiles
            found = batch_class(e["problem"])
            if found is not None:
                self.by_class.setdefault((e["algo"], found[0]), []).append((found[1], tiles))
            shaped = shape_class(e["problem"])
            if shaped is not None:
                self.by_shape.setdefault((e["algo"], shaped[0]), []).append((shaped[1], tiles))

    def lookup(self, algo: str, problem: str, similar: bool = False) -> TileConfig | None:
        """The choice for `problem`, else for the same layer at the nearest batch size; with
        `similar`, else for the nearest-sized convolution of the same kind (filter, stride,
        dtype, layouts...: shape_class), by the distance of their sizes in log scale. A
        float16 problem the table lacks takes bfloat16's choice for the same layer, and with
        `similar` the nearest of its kind in either dtype (16-bit elements both, multiplied
        at the same rate; the sweeps ran bfloat16)."""
        keys = tuple(dict.fromkeys((problem, problem.replace(_FLOAT16, _BFLOAT16, 1))))
        for key in keys:
            tiles = self._same_layer(algo, key)
            if tiles is not None:
                return tiles
        return self._similar(algo, keys) if similar else None

    def _same_layer(self, algo: str, problem: str) -> TileConfig | None:
        """The choice for `problem`, else for the same layer at the nearest batch size."""
        tiles = self.exact.get((algo, problem))
        if tiles is not None:
            return tiles
        found = batch_class(problem)
        near = self.by_class.get((algo, found[0])) if found is not None else None
        if near:
            batch = max(found[1], 1)
            return min(near, key=lambda bt: (abs(math.log(max(bt[0], 1) / batch)), -bt[0]))[1]
        return None

    def _similar(self, algo: str, keys: tuple[str, ...]) -> TileConfig | None:
        """The choice for the nearest-sized convolution of the same kind as any of `keys`
        (one problem's, in each dtype it may take choices of)."""
        shaped = [shape_class(key) for key in keys]
        if shaped[0] is None:
            return None
        sizes = shaped[0][1]
        alike = [e for kind, _ in shaped for e in self.by_shape.get((algo, kind), [])]
        if not alike:
            return None

        def distance(entry: tuple[tuple, TileConfig]) -> tuple[float, tuple]:
            other = entry[0]
            far = sum(
                abs(math.log(max(a, 1) / max(b, 1))) for a, b in zip(other, sizes, strict=True)
            )
            return far, tuple(-v for v in other)  # a tie takes the larger

        return min(alike, key=distance)[1]


def read(path: str = PATH) -> dict:
    """The shipped document: {"format": 1, "tables": [{"capability": "9.0", "multiprocessors":
    132, "sweeps": [{"gpu", "rtdnn", "triton", "torch", "date", "sweep", "problems"}], "tiles":
    [{"algo", "problem", "tiles"}]}]}; no tables when the file is missing or of another
    format."""
    try:
        with open(path) as f:
            document = json.load(f)
    except FileNotFoundError:
        return {"format": FORMAT, "tables": []}
    if document.get("format") != FORMAT:
        return {"format": FORMAT, "tables": []}  # another version's file: none of it is used
    return document


@functools.cache
def _table_for(capability: str, multiprocessors: int, path: str) -> Table | None:
    for table in read(path)["tables"]:
        if table["capability"] == capability and table["multiprocessors"] == multiprocessors:
            return Table(table["tiles"])
    return None


def current_gpu() -> tuple[str, int] | None:
    """(compute capability such as "9.0", multiprocessor count) of the current CUDA device, or
    None without one."""
    try:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
    except (RuntimeError, AssertionError):  # no CUDA device, or a CPU build of torch
        return None
    return f"{props.major}.{props.minor}", props.multi_processor_count


class ShippedTiles:
    """The shipped choices for the current GPU (`gpu()` says which), as the tile tuner reads
    them (algos.tiles)."""

    def __init__(self, path: str = PATH, gpu=current_gpu):
        self.path, self.gpu = path, gpu

    def load(self, key: tuple, similar: bool = False) -> TileConfig | None:
        """The shipped choice for a tuner key (algorithm name, *problem), or None; `similar`:
        see Table.lookup."""
        gpu = self.gpu()
        table = _table_for(*gpu, self.path) if gpu is not None else None
        if table is None:
            return None
        return table.lookup(*tuner_key_parts(key), similar=similar)


def add_sweep(document: dict, entries: list, multiprocessors: int, sweep: str, date: str) -> dict:
    """`document` (as `read` gives it) with the tile choices `entries` (TuningDatabase's
    TileEntry rows, all of one GPU) merged into the table of that GPU's compute capability and
    `multiprocessors`: a problem chosen again takes the new choice. `sweep` says what ran."""
    if not entries:
        return document
    env = entries[0].environment
    if any(e.environment != env for e in entries):
        raise ValueError("entries of more than one environment: add each GPU's on its own")
    m = re.search(r"sm_(\d+)(\d)$", env.device)
    if m is None:
        raise ValueError(f"{env.device!r}: not a GPU environment (no sm_XY)")
    capability = f"{m.group(1)}.{m.group(2)}"
    tables = document["tables"]
    table = next(
        (t for t in tables
         if t["capability"] == capability and t["multiprocessors"] == multiprocessors),
        None,
    )  # fmt: skip
    if table is None:
        table = {"capability": capability, "multiprocessors": multiprocessors, "sweeps": [],
                 "tiles": []}  # fmt: skip
        tables.append(table)
    table["sweeps"].append({
        "gpu": env.device, "rtdnn": env.rtdnn, "triton": env.triton, "torch": env.torch,
        "date": date, "sweep": sweep, "problems": len(entries),
    })  # fmt: skip
    merged = {(t["algo"], t["problem"]): t for t in table["tiles"]}
    for e in entries:
        merged[e.algo, e.problem] = {"algo": e.algo, "problem": e.problem,
                                     "tiles": json.loads(e.tiles)}  # fmt: skip
    table["tiles"] = sorted(merged.values(), key=lambda t: (t["algo"], t["problem"]))
    _table_for.cache_clear()
    return document


def write(document: dict, path: str = PATH) -> None:
    """Write the shipped document (one entry a line, so that a sweep's change reads as lines
    added and changed)."""
    lines = []
    for table in document["tables"]:
        head = {k: v for k, v in table.items() if k != "tiles"}
        rows = ",\n".join("      " + json.dumps(t, sort_keys=True) for t in table["tiles"])
        lines.append(f'    {json.dumps(head, sort_keys=True)[:-1]}, "tiles": [\n{rows}\n    ]}}')
    body = ",\n".join(lines)
    with open(path, "w") as f:
        f.write(f'{{"format": {FORMAT}, "tables": [\n{body}\n]}}\n')
