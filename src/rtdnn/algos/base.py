"""The algorithm plug-in interface. Selection, benchmarking and micro-batching see only this."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..core import ConvProblem, Direction
from ..kernels import activation as act_kernels
from ..kernels import brgemm
from ..kernels import elementwise as ew
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


def epilogue_activation(p: ConvProblem):
    """The GEMM epilogue's activation function (kernels/brgemm.py) for `p`'s activation."""
    return brgemm.relu if p.activation == "relu" else brgemm.identity


def then_activation(runner: Runner, p: ConvProblem) -> Runner:
    """`runner`, then `p`'s activation in place on the forward output: for an algorithm whose
    kernels cannot apply it themselves (one more pass over the output)."""
    if p.activation != "relu":
        raise ValueError(f"no activation pass for {p.activation!r}")
    y = p.y
    plan = ew.plan(y.shape, y.strides, (y.strides,), elem_bytes=y.dtype.itemsize)
    if plan is None:  # a conv output has at most 5 dims, MAX_DIMS is 6: kept as a check
        raise ValueError(f"no elementwise plan for an output of shape {y.shape}")
    relu = ew.prepared_launch(act_kernels.relu_fwd, plan, 1, False)

    def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
        runner(t, workspace, alpha, beta)
        relu(t.y, [t.y])

    return run


class ConvAlgorithm:
    """One way to compute a convolution. Subclasses set `name` and implement the methods.

    A forward problem's activation (ConvProblem.activation) is applied by the algorithm's
    own kernels where `fuses_activation` is set (its `prepare` sees it in the problem), and
    otherwise by a pass of its own after them (`runner` adds it).
    """

    name: str = ""
    fuses_activation: bool = False

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
            if p.activation != "identity" and not self.fuses_activation:
                plain = self.runner(replace(p, activation="identity"), t, workspace)
                runner = self._runners[p] = then_activation(plain, p)
                return runner
            tiles = choose_tiles(self, p, t, workspace)
            runner = self._runners[p] = self.prepare(p, tiles)
        return runner

    def __repr__(self) -> str:
        return self.name
