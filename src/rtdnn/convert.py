"""Whole-model conversion: swap every torch.nn module rtdnn implements for its rtdnn twin.

Every module in rtdnn.nn subclasses the torch.nn module it replaces and adds no state, so a
module is converted by changing its class: weights, buffers, hooks, train/eval state and
state_dict keys stay exactly as they were. Only modules of exactly a supported type are
converted; a user's subclass (which may override forward) is left alone and reported.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from . import nn as rtdnn_nn
from .fuse import fuse_batch_norm, trace


def twins() -> dict[type, type]:
    """torch.nn class -> the rtdnn.nn class that replaces it."""
    table = {}
    for name in rtdnn_nn.__all__:
        cls = getattr(rtdnn_nn, name)
        for base in cls.__mro__[1:]:
            if base.__module__.startswith("torch.nn") and base.__name__ == cls.__name__:
                table[base] = cls
                break
    return table


@dataclass
class ConversionReport:
    """What `convert` replaced and what it left, by module path."""

    replaced: list[tuple[str, str]] = field(default_factory=list)  # (path, class name)
    kept: list[tuple[str, str, str]] = field(default_factory=list)  # (path, class, reason)
    fused: list[str] = field(default_factory=list)  # e.g. "layer1.0.bn3 + add + relu"
    not_fused: str | None = None  # why fuse=True could not trace the model

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, name in self.replaced:
            out[name] = out.get(name, 0) + 1
        return out

    def __str__(self) -> str:
        lines = [f"rtdnn.convert: {len(self.replaced)} modules replaced, {len(self.kept)} kept"]
        for name, n in sorted(self.counts().items()):
            lines.append(f"  replaced {n:4d} x {name}")
        for path, name, reason in self.kept:
            lines.append(f"  kept     {path or '(root)'}: {name} ({reason})")
        if self.fused:
            lines.append(f"  fused    {len(self.fused)} batch norms with what follows them")
        if self.not_fused:
            lines.append(f"  not fused: {self.not_fused}")
        return "\n".join(lines)


def convert(
    model: torch.nn.Module, *, inplace: bool = False, fuse: bool = False
) -> tuple[torch.nn.Module, ConversionReport]:
    """Return (converted model, report). With inplace=False the input model is untouched and
    the converted one is a deep copy; with inplace=True the input itself is converted.

    fuse=True also traces the converted model with torch.fx and fuses each batch norm with the
    ReLU (and residual add) after it (see rtdnn.fuse); the model returned is then a
    torch.fx.GraphModule with the same submodules and state_dict keys. A model that cannot be
    traced is returned unfused, with the reason in `report.not_fused`.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if fuse and inplace:
        # The fused batch norms apply the ReLU themselves: the input's own forward, which
        # still calls the ReLU and the add, would then compute something else.
        raise ValueError("convert: fuse=True needs inplace=False")
    if not inplace:
        model = copy.deepcopy(model)
    table = twins()
    replaced_types = set(table.values())
    report = ConversionReport()
    for path, module in model.named_modules():
        cls = type(module)
        if cls in table:
            module.__class__ = table[cls]
            report.replaced.append((path, cls.__name__))
        elif cls in replaced_types:
            report.replaced.append((path, cls.__name__))  # already an rtdnn module
        elif any(issubclass(cls, base) for base in table):
            report.kept.append((path, cls.__name__, "subclass of a supported module"))
        elif not any(True for _ in module.children()):
            report.kept.append((path, cls.__name__, "no rtdnn implementation"))
    if fuse:
        try:
            traced = trace(model)
        except Exception as e:  # torch.fx raises several types for untraceable code
            report.not_fused = f"torch.fx could not trace the model: {type(e).__name__}: {e}"
        else:
            model, report.fused = traced, fuse_batch_norm(traced)
    return model, report
