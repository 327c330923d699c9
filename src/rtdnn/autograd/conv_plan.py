"""Convolution run by a layer's own plan: a workspace limit and batch policy per direction.

rtdnn.convert(..., workspace_limit=, micro_batch=) gives each converted convolution a
ConvTuning; the module then runs `planned_conv`, which calls the plain conv functions of each
direction with that direction's limit and the batch policy, and keeps what each ran (problem
and plan) for the conversion report and for rtdnn.plan_network. The limits are per direction
because a network budget divided by plan_network gives forward, backward-data and
backward-filter of one layer different shares.

It is a torch.autograd.Function rather than a custom op: its state (the ConvTuning, which it
updates) is a Python object, which a custom op's schema cannot carry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import ops
from ..core import bad_param
from ..ops.conv_plan import Observed, observed
from ..select.plan import check_bytes, check_policy, check_workspace_policy

DIRECTIONS = ("forward", "backward_data", "backward_filter")


@dataclass
class ConvTuning:
    """How one convolution layer runs: `micro_batch` (a select.plan policy) and a workspace
    limit in bytes, `workspace_limit` for every direction unless `limits` (set by
    plan_network) gives the direction its own; a direction `limits` leaves out gets 0.
    `workspace_policy` says what `workspace_limit` is: "reuse", each layer's limit; "divide",
    a budget for the whole network, which each layer may use alone until plan_network
    divides it. `seen` holds the last plan each direction ran."""

    micro_batch: str = "undivided"
    workspace_limit: int | None = None
    workspace_policy: str = "reuse"
    limits: dict[str, int] | None = None
    seen: dict[str, Observed] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_policy("micro_batch", self.micro_batch)
        check_bytes("workspace_limit", self.workspace_limit)
        check_workspace_policy("workspace_policy", self.workspace_policy)
        if self.workspace_policy == "divide" and self.workspace_limit is None:
            raise bad_param(
                "workspace_limit", None, 'an int >= 0 (bytes) with workspace_policy="divide"'
            )

    def limit(self, direction: str) -> int | None:
        if self.limits is None:
            return self.workspace_limit
        return self.limits.get(direction, 0)


def _run(tuning: ConvTuning, direction: str, fn, *args, **kwargs) -> Tensor:
    """fn(*args, **kwargs) with the direction's limit and the policy, its plan kept in
    `tuning.seen` (a batch of 0 runs nothing and plans nothing)."""
    with observed() as seen:
        out = fn(
            *args, **kwargs, workspace_limit=tuning.limit(direction),
            micro_batch=tuning.micro_batch,
        )  # fmt: skip
    if seen:
        tuning.seen[direction] = seen[-1]
    return out


class _PlannedConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, geometry: dict, tuning: ConvTuning):
        ctx.save_for_backward(x, w)
        ctx.geometry, ctx.tuning, ctx.has_bias = geometry, tuning, bias is not None
        return _run(tuning, "forward", ops.conv_forward, x, w, bias, **geometry)

    @staticmethod
    @once_differentiable  # the backward ops have no backward of their own
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        geometry, tuning = ctx.geometry, ctx.tuning
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        if need_x:
            dx = _run(tuning, "backward_data", ops.conv_backward_data, dy, w, x.shape, **geometry)
        if need_w:
            dw = _run(
                tuning, "backward_filter", ops.conv_backward_filter, x, dy, w.shape, **geometry
            )
        if ctx.has_bias and need_b:
            db = ops.conv_backward_bias(dy)
        return dx, dw, db, None, None


def planned_conv(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    mode: str,
    tuning: ConvTuning,
) -> Tensor:
    """y = conv(x, w) + bias (x (N, C, *S), w (K, C/groups, *R), numeric padding), with
    autograd; each direction runs under `tuning` (see ConvTuning)."""
    geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode)
    return _PlannedConv.apply(x, w, bias, geometry, tuning)


__all__ = ["DIRECTIONS", "ConvTuning", "planned_conv"]
