"""The algorithm plug-in interface. Selection, benchmarking and micro-batching see only this."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core import ConvProblem, Direction
from ..kernels.launch import TileConfig
from .tiles import choose_tiles


@dataclass
class ConvTensors:
    """The tensors of one convolution. Which one is written depends on the direction:
    forward writes y, backward-data writes x (dx), backward-filter writes w (dw)."""

    x: torch.Tensor
    w: torch.Tensor
    y: torch.Tensor
    bias: torch.Tensor | None = None

    def written(self, direction: Direction) -> torch.Tensor:
        return {Direction.FORWARD: self.y, Direction.BACKWARD_DATA: self.x}.get(direction, self.w)

    def with_written(self, direction: Direction, t: torch.Tensor) -> ConvTensors:
        if direction == Direction.FORWARD:
            return ConvTensors(self.x, self.w, t, self.bias)
        if direction == Direction.BACKWARD_DATA:
            return ConvTensors(t, self.w, self.y, self.bias)
        return ConvTensors(self.x, t, self.y, self.bias)


Runner = Callable[[ConvTensors, "torch.Tensor | None", float, float], None]


class ConvAlgorithm:
    """One way to compute a convolution. Subclasses set `name` and implement the methods."""

    name: str = ""

    def __init__(self) -> None:
        self._runners: dict[ConvProblem, Runner] = {}

    def supports(self, p: ConvProblem) -> str | None:
        """None if this algorithm can run `p`, else the reason it cannot."""
        raise NotImplementedError

    def workspace_bytes(self, p: ConvProblem) -> int:
        """Exact bytes of scratch memory `run` needs for `p`."""
        return 0

    def deterministic(self, p: ConvProblem) -> bool:
        """True if repeated runs give bit-identical results."""
        return True

    def tile_candidates(self, p: ConvProblem) -> list[TileConfig]:
        """Tile shapes worth timing for `p` (the first is the default)."""
        raise NotImplementedError

    def prepare(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        """Build the launches for `p` with these tiles; the result runs (tensors, workspace,
        alpha, beta). Inputs are already validated."""
        raise NotImplementedError

    def run(
        self,
        p: ConvProblem,
        t: ConvTensors,
        workspace: torch.Tensor | None,
        alpha: float = 1.0,
        beta: float = 0.0,
    ) -> None:
        """Compute the direction's output, with the tile shape chosen for `p` on first use."""
        self.runner(p, t, workspace)(t, workspace, alpha, beta)

    def runner(self, p: ConvProblem, t: ConvTensors, workspace: torch.Tensor | None) -> Runner:
        """The prepared launches for `p`, built on first use with the tile shape chosen there
        (timed on t and workspace when tile tuning is on)."""
        runner = self._runners.get(p)
        if runner is None:
            tiles = choose_tiles(self, p, t, workspace)
            runner = self._runners[p] = self.prepare(p, tiles)
        return runner

    def __repr__(self) -> str:
        return self.name
