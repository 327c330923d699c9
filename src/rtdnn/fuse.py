"""Fusing batch norm with what follows it, as cuDNN's BN_ACTIVATION and BN_ADD_ACTIVATION ops
do: in a traced model, each

    y = relu(batch_norm(x))            becomes one call  batch_norm(x, activation="relu")
    y = relu(batch_norm(x) + z)        becomes one call  batch_norm(x, z, activation="relu")

and the same with SiLU (EfficientNet) or Hardswish (MobileNetV3) in place of the ReLU, so
the activation (and the residual add of a ResNet block) costs no separate pass over memory
and no separate launch, forward or backward.

The model is traced with torch.fx; a pattern is fused only where nothing
else reads the intermediate results (the batch norm's output, the sum) and the batch norm
module is called once, since the fused activation becomes part of that module. A model that
cannot be traced (data-dependent control flow) is left as it is; `convert` reports why.

For inference, `fold_batch_norm` goes further, as inference engines do: a batch norm in eval
mode right after a convolution becomes part of the convolution's weights and bias, and its
ReLU part of the convolution's GEMM epilogue, so the pair costs one kernel instead of two.
"""

from __future__ import annotations

import operator
from collections import Counter

import torch
import torch.nn.functional as F
from torch import fx
from torch.nn.utils.fusion import fuse_conv_bn_weights

from .nn.conv import _RtdnnConv
from .nn.normalization import _RtdnnBatchNorm

_ADDS = (operator.add, operator.iadd, torch.add)
#: What the fused batch norm can apply after itself, as modules (torch's classes, or rtdnn's
#: twins of them), functions and tensor methods.
_MODULES = {torch.nn.ReLU: "relu", torch.nn.SiLU: "silu", torch.nn.Hardswish: "hardswish"}
_FUNCTIONS = {torch.relu: "relu", torch.relu_: "relu", F.relu: "relu", F.silu: "silu",
              F.hardswish: "hardswish"}  # fmt: skip
_METHODS = {"relu": "relu", "relu_": "relu"}


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _activation(node: fx.Node | None, modules: dict[str, torch.nn.Module]) -> str | None:
    """The fusable activation `node` applies to its one input, or None."""
    if node is None:
        return None
    if node.op == "call_module":
        kind = type(modules[node.target])
        # Exactly torch's class or rtdnn's twin: a user's subclass may compute something else.
        for cls, name in _MODULES.items():
            if kind is cls or (issubclass(kind, cls) and kind.__module__.startswith("rtdnn.nn")):
                return name
        return None
    if len(node.args) != 1 or any(k != "inplace" for k in node.kwargs):
        return None
    if node.op == "call_function":
        return _FUNCTIONS.get(node.target)
    return _METHODS.get(node.target) if node.op == "call_method" else None


def _residual(add: fx.Node | None, bn: fx.Node) -> fx.Node | None:
    """The other operand z of `add` when add is bn + z (or z + bn) of two tensors."""
    if add is None or add.op != "call_function" or add.target not in _ADDS or add.kwargs:
        return None
    if len(add.args) != 2 or bn not in add.args:
        return None
    z = add.args[1] if add.args[0] is bn else add.args[0]
    return z if isinstance(z, fx.Node) and z is not bn else None


class _Tracer(fx.Tracer):
    """torch.fx's tracer, with rtdnn.nn modules kept whole, as torch.nn's own are."""

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return type(m).__module__.startswith("rtdnn.nn") or super().is_leaf_module(m, qualname)


def trace(model: torch.nn.Module) -> fx.GraphModule:
    """torch.fx.symbolic_trace for a converted model: one call_module node per rtdnn layer."""
    graph = _Tracer().trace(model)
    return fx.GraphModule(model, graph, type(model).__name__)


def fuse_batch_norm(gm: fx.GraphModule) -> list[str]:
    """Fuse, in place, every rtdnn batch norm of a traced model (see `trace`) that feeds a
    ReLU, SiLU or Hardswish, directly or through a residual add. Returns one line per fusion.
    Parameters, buffers and state_dict keys are unchanged."""
    modules = dict(gm.named_modules())
    calls = Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    fused = []
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or calls[node.target] != 1:
            continue
        bn = modules[node.target]
        if not isinstance(bn, _RtdnnBatchNorm) or bn.activation != "identity":
            continue
        if len(node.args) != 1 or node.kwargs:
            continue
        after = _only_user(node)
        z = _residual(after, node)
        if z is not None:
            act = _only_user(after)
        else:
            act, after = after, None
        activation = _activation(act, modules)
        if activation is None:
            continue
        # z may be computed after the batch norm (torchvision's Bottleneck runs its downsample
        # branch there), so the fused call goes where the add was.
        with gm.graph.inserting_before(after or node):
            args = node.args if z is None else (node.args[0], z)
            call = gm.graph.call_module(node.target, args)
        act.replace_all_uses_with(call)
        for dead in (act, after, node):
            if dead is not None:
                gm.graph.erase_node(dead)
        bn.activation = activation
        fused.append(f"{node.target}{' + add' if z is not None else ''} + {activation}")
    gm.graph.lint()
    gm.recompile()
    return fused


def pair_conv_batch_norm(gm: fx.GraphModule) -> list[str]:
    """Pair, in place, each rtdnn batch norm of a traced model (see `trace`; run after
    `fuse_batch_norm`) that reads only the output of an rtdnn convolution with that
    convolution: the two calls become one, conv(x, batch_norm=bn, z=z), which computes
    bn(conv(x), z) and in training runs as one op with one autograd node
    (autograd.conv_batch_norm), saving the host a second op call and a second node per
    layer. Parameters, buffers and state_dict keys are unchanged; the batch norm's own forward
    (and its hooks) no longer runs in training. Convolutions or batch norms called more than
    once or read by anything else, and convolutions that cannot pair (see
    nn.conv's pairs_with_batch_norm), are left as they are. Returns one line per pair."""
    modules = dict(gm.named_modules())
    calls = Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    paired = []
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or calls[node.target] != 1 or node.kwargs:
            continue
        bn = modules[node.target]
        if not isinstance(bn, _RtdnnBatchNorm) or len(node.args) not in (1, 2):
            continue
        src = node.args[0]
        if not isinstance(src, fx.Node) or src.op != "call_module" or len(src.users) != 1:
            continue
        conv = modules[src.target]
        if not isinstance(conv, _RtdnnConv) or calls[src.target] != 1:
            continue
        if len(src.args) != 1 or src.kwargs or not conv.pairs_with_batch_norm(bn.num_features):
            continue
        with gm.graph.inserting_before(node):
            kwargs = {"batch_norm": gm.graph.get_attr(node.target)}
            if len(node.args) == 2:
                kwargs["z"] = node.args[1]
            call = gm.graph.call_module(src.target, src.args, kwargs)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        gm.graph.erase_node(src)
        paired.append(f"{src.target} + {node.target}")
    gm.graph.lint()
    gm.recompile()
    return paired


def fold_batch_norm(gm: fx.GraphModule) -> list[str]:
    """Fold, in place, each rtdnn batch norm of a traced model (see `trace`; run after
    `fuse_batch_norm`) that is in eval mode with running statistics and reads only the output
    of an rtdnn convolution into that convolution: w' = w * g, b' = (b - mean) * g + beta with
    g = weight / sqrt(running_var + eps) (torch.nn.utils.fusion.fuse_conv_bn_weights), and a
    ReLU fused with the batch norm goes to the convolution (its `activation`). Batch norms with
    a residual add, SiLU or Hardswish are left as they are, as are convolutions or batch norms
    called more than once or read by anything else. Returns one line per fold.

    The folded batch norms are removed from the model: its state_dict loses their keys, the
    convolutions gain a bias, and later changes to the batch norm's statistics (or training
    it) no longer apply. The model computes what it computed in eval mode."""
    modules = dict(gm.named_modules())
    calls = Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    # Parameters the forward reads directly (a decoder tied to an encoder's filter): their
    # modules keep their own weights.
    read = [n.target for n in gm.graph.nodes if n.op == "get_attr"]

    def read_directly(path: str) -> bool:
        return any(t == path or t.startswith(path + ".") for t in read)

    folded = []
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or calls[node.target] != 1 or len(node.args) != 1:
            continue
        bn, src = modules[node.target], node.args[0]
        if not isinstance(bn, _RtdnnBatchNorm) or bn.training or bn.running_mean is None:
            continue
        if bn.activation not in ("identity", "relu") or node.kwargs:
            continue
        if not isinstance(src, fx.Node) or src.op != "call_module" or len(src.users) != 1:
            continue
        conv = modules[src.target]
        if not isinstance(conv, _RtdnnConv) or calls[src.target] != 1:
            continue
        if conv.activation != "identity" or conv.out_channels != bn.num_features:
            continue
        if read_directly(node.target) or read_directly(src.target):
            continue
        with torch.no_grad():
            conv.weight, conv.bias = fuse_conv_bn_weights(
                conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight,
                bn.bias,
            )  # fmt: skip
        conv.bias.requires_grad_(conv.weight.requires_grad)  # a new bias trains as the weight
        conv.activation = bn.activation
        conv.folded_batch_norm = True
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
        gm.delete_submodule(node.target)
        relu = " + relu" if bn.activation == "relu" else ""
        folded.append(f"{node.target}{relu} into {src.target}")
    gm.graph.lint()
    gm.recompile()
    return folded
