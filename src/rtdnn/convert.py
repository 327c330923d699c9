"""Whole-model conversion: swap every torch.nn module rtdnn implements for its rtdnn twin.

Every module in rtdnn.nn subclasses the torch.nn module it replaces and adds no state, so a
module is converted by changing its class: weights, buffers, hooks, train/eval state and
state_dict keys stay exactly as they were. Only modules of exactly a supported type are
converted; a user's subclass (which may override forward) is left alone and reported.

rtdnn computes float32, float16 and bfloat16, not float64. A module with float64 parameters or
buffers is kept as it is, and so is a module without parameters (an activation, a pooling) in
a model that has float64 ones, since its input is float64 then; the report says why.

With a workspace limit or a micro-batch policy, each converted convolution also gets a
ConvTuning (autograd.conv_plan): it then measures and plans each of its problems on first use
and runs them within its limit (see rtdnn.network_plan, which divides a network budget).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field

import torch

from . import nn as rtdnn_nn
from .autograd.conv_plan import DIRECTIONS, ConvTuning
from .core import bad_param
from .fuse import fold_batch_norm as fold
from .fuse import fuse_batch_norm, pair_conv_batch_norm, trace
from .network_plan import LayerPlan, table_lines
from .nn.conv import _RtdnnConv

FLOAT64_REASON = "float64 parameters: rtdnn computes float32, float16 and bfloat16"
FLOAT64_MODEL_REASON = "in a float64 model: rtdnn computes float32, float16 and bfloat16"


def _float64(tensors) -> bool:
    return any(t.dtype == torch.float64 for t in tensors)


def _float64_reason(module: torch.nn.Module, model_float64: bool) -> str | None:
    """Why `module` must stay in torch because of float64, or None."""
    own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    if _float64(own):
        return FLOAT64_REASON
    if model_float64 and not any(t.is_floating_point() for t in own):
        return FLOAT64_MODEL_REASON
    return None


#: Modules of other libraries that rtdnn.nn replaces, by their class's full name. Their
#: libraries are not imported for this: a model that holds one has imported its library.
FOREIGN_TWINS = {"torchvision.ops.misc.SqueezeExcitation": rtdnn_nn.SqueezeExcitation}


def twins() -> dict[type, type]:
    """torch.nn class (or one of FOREIGN_TWINS, where its library is loaded) -> the rtdnn.nn
    class that replaces it."""
    table = {}
    for name in rtdnn_nn.__all__:
        cls = getattr(rtdnn_nn, name)
        for base in cls.__mro__[1:]:
            if base.__module__.startswith("torch.nn") and base.__name__ == cls.__name__:
                table[base] = cls
                break
    for full_name, twin in FOREIGN_TWINS.items():
        module, _, name = full_name.rpartition(".")
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            table[cls] = twin
    return table


@dataclass
class ConversionReport:
    """What `convert` replaced and what it left, by module path."""

    replaced: list[tuple[str, str]] = field(default_factory=list)  # (path, class name)
    kept: list[tuple[str, str, str]] = field(default_factory=list)  # (path, class, reason)
    fused: list[str] = field(default_factory=list)  # e.g. "layer1.0.bn3 + add + relu"
    folded: list[str] = field(default_factory=list)  # e.g. "layer1.0.bn1 + relu into ...conv1"
    paired: list[str] = field(default_factory=list)  # e.g. "layer1.0.conv1 + layer1.0.bn1"
    not_fused: str | None = None  # why fuse=True could not trace the model
    # The convolutions given a workspace limit or micro-batch policy, by path; each holds the
    # plans its directions last ran (filled as the model runs).
    tuned: dict[str, ConvTuning] = field(default_factory=dict)

    def plans(self) -> list[LayerPlan]:
        """The plan each tuned convolution last ran, by layer and direction (none before
        the model has run)."""
        return [
            LayerPlan(path, d, tuning.seen[d].plan)
            for path, tuning in self.tuned.items()
            for d in DIRECTIONS
            if d in tuning.seen
        ]

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
        if self.folded:
            lines.append(f"  folded   {len(self.folded)} batch norms into the convolutions")
        if self.paired:
            lines.append(f"  paired   {len(self.paired)} convolutions with their batch norms")
        if self.not_fused:
            lines.append(f"  not fused: {self.not_fused}")
        if self.tuned:
            lines.append(self._tuning_summary())
        return "\n".join(lines)

    def _tuning_summary(self) -> str:
        first = next(iter(self.tuned.values()))
        limit = first.workspace_limit
        lines = [
            f"  planned  {len(self.tuned)} convolutions: micro_batch={first.micro_batch!r}, "
            f"workspace_limit={limit!r} ({first.workspace_policy})"
        ]
        plans = self.plans()
        if not plans:
            lines.append("  (plans are made on the first forward and backward of each shape)")
        lines += ["  " + line for line in table_lines(plans)] if plans else []
        return "\n".join(lines)


def convert(
    model: torch.nn.Module,
    *,
    inplace: bool = False,
    fuse: bool = False,
    fold_batch_norm: bool = False,
    workspace_limit: int | None = None,
    micro_batch: str = "undivided",
    workspace_policy: str = "reuse",
) -> tuple[torch.nn.Module, ConversionReport]:
    """Return (converted model, report). With inplace=False the input model is untouched and
    the converted one is a deep copy; with inplace=True the input itself is converted.

    workspace_limit (bytes), micro_batch ("undivided", "powerOfTwo" or "all") and
    workspace_policy ("reuse" or "divide") plan the convolutions. Unless all three are left at
    their defaults, each converted convolution measures every algorithm, at every micro-batch
    size the policy allows, on the first forward and backward of each shape (the results go
    to the tuning database), and runs each direction by the fastest plan within its workspace
    limit. "reuse": `workspace_limit` is each layer's limit (None: no limit; the layers share
    one buffer). "divide": it is a budget for the sum of the layers' workspaces, which
    rtdnn.plan_network divides among them (until then each layer may use all of it).
    `report.plans()` (and printing the report) shows the plans once the model has run. A model
    so converted runs its convolutions eagerly: torch.compile breaks its graph around them.

    fuse=True also traces the converted model with torch.fx and fuses each batch norm with the
    ReLU, SiLU or Hardswish (and residual add) after it (see rtdnn.fuse), and pairs each batch
    norm that reads only a convolution's output with that convolution, so that in training
    the two run as one op with one autograd node (rtdnn.fuse.pair_conv_batch_norm; the batch
    norm's own forward hooks no longer run there); the model returned is then a
    torch.fx.GraphModule with the same submodules and state_dict keys. A model that cannot be
    traced is returned unfused, with the reason in `report.not_fused`.

    fold_batch_norm=True (for inference; implies fuse=True, and needs the model in eval mode)
    then folds each batch norm that follows a convolution into the convolution's weights and
    bias, and its ReLU into the convolution's kernel (see rtdnn.fuse.fold_batch_norm): one
    launch per pair instead of two. The folded batch norms leave the model and its
    state_dict. `report.folded` lists them.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if fold_batch_norm and model.training:
        raise bad_param("fold_batch_norm", True, "a model in eval mode (model.eval())")
    fuse = fuse or fold_batch_norm
    if fuse and inplace:
        # The fused batch norms apply the activation themselves: the input's own forward,
        # which still calls the activation and the add, would then compute something else.
        raise ValueError("convert: fuse=True needs inplace=False")
    tuning = None
    if workspace_limit is not None or micro_batch != "undivided" or workspace_policy != "reuse":
        # Validated here, before the model is copied or changed.
        tuning = ConvTuning(micro_batch, workspace_limit, workspace_policy)
    if not inplace:
        model = copy.deepcopy(model)
    table = twins()
    replaced_types = set(table.values())
    report = ConversionReport()
    model_float64 = _float64([*model.parameters(), *model.buffers()])
    # Paths under a multi-head attention: its forward reads out_proj's parameters and never
    # calls out_proj, which is part of it rather than a layer to convert or report.
    inside: list[str] = []
    for path, module in model.named_modules():
        if any(path.startswith(prefix) for prefix in inside):
            continue
        if isinstance(module, torch.nn.MultiheadAttention):
            inside.append(f"{path}." if path else "")
        cls = type(module)
        reason = _float64_reason(module, model_float64)
        if reason is not None and (cls in table or cls in replaced_types):
            if cls in replaced_types:  # an rtdnn module (converted before): back to torch's
                module.__class__ = next(base for base, twin in table.items() if twin is cls)
            report.kept.append((path, module.__class__.__name__, reason))
        elif cls in table:
            module.__class__ = table[cls]
            report.replaced.append((path, cls.__name__))
        elif cls in replaced_types:
            report.replaced.append((path, cls.__name__))  # already an rtdnn module
        elif any(issubclass(cls, base) for base in table):
            report.kept.append((path, cls.__name__, "subclass of a supported module"))
        elif not any(True for _ in module.children()):
            report.kept.append((path, cls.__name__, "no rtdnn implementation"))
    for path, module in model.named_modules():
        if isinstance(module, _RtdnnConv) and tuning is not None:
            module.tuning = report.tuned[path] = copy.deepcopy(tuning)
        elif isinstance(module, _RtdnnConv):  # converted again without: the default path
            module.__dict__.pop("tuning", None)
    if fuse:
        try:
            traced = trace(model)
        except Exception as e:  # torch.fx raises several types for untraceable code
            report.not_fused = f"torch.fx could not trace the model: {type(e).__name__}: {e}"
        else:
            model, report.fused = traced, fuse_batch_norm(traced)
            if fold_batch_norm:
                report.folded = fold(traced)
            else:
                report.paired = pair_conv_batch_norm(traced)
    return model, report
