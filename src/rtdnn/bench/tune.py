"""`rtdnn tune --model`: plan a model's or a layer suite's convolutions under a workspace policy.

The model is converted with rtdnn.convert(workspace_limit=, micro_batch=, workspace_policy=)
and planned by rtdnn.plan_network on random input: every convolution measured (or read from the
tuning database) at every micro-batch size the policy allows, then the per-layer plan printed
beside the undivided one. A suite (bench/suites/*.json, or such a file) is planned as a network
of its layers, each on its own input, in all three directions.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import torch

from ..convert import convert
from ..network_plan import NetworkPlan, plan_network
from .conv import load_suite, suites

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "float32": torch.float32}


class SuiteNet(torch.nn.Module):
    """A suite's layers side by side: forward takes one input per layer, returns one output
    per layer."""

    def __init__(self, layers: list[dict]):
        super().__init__()
        self.names = [str(layer.get("name", i)) for i, layer in enumerate(layers)]
        self.convs = torch.nn.ModuleList(
            {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[len(layer["kernel"])](
                layer["c"],
                layer["k"],
                layer["kernel"],
                stride=layer["stride"],
                padding=layer["padding"],
                dilation=layer["dilation"],
                groups=layer.get("groups", 1),
                bias=False,
            )  # fmt: skip
            for layer in layers
        )

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [conv(x) for conv, x in zip(self.convs, inputs, strict=True)]


def is_suite(name: str) -> bool:
    return name in suites() or (name.endswith(".json") and os.path.isfile(name))


def _suite_layers(name: str) -> list[dict]:
    if name in suites():
        return load_suite(name)
    with open(name) as f:
        return json.load(f)["layers"]


def build(
    name: str, batch: int | None, dtype: torch.dtype, device: torch.device
) -> tuple[torch.nn.Module, object, dict[str, str]]:
    """(model in `dtype` on `device`, example input, layer path -> display name)."""
    channels_last = device.type == "cuda"
    if is_suite(name):
        layers = _suite_layers(name)
        model = SuiteNet(layers).to(device, dtype)
        inputs = []
        for layer in layers:
            shape = (batch or layer["n"], layer["c"], *layer["spatial"])
            x = torch.randn(shape, device=device, dtype=dtype)
            if channels_last and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            inputs.append(x.requires_grad_())  # so that backward-data runs too
        names = {f"convs.{i}": n for i, n in enumerate(model.names)}
        return model, inputs, names
    if name == "small":
        from .model import small_cnn

        model, size = small_cnn(), 32
    else:
        import torchvision

        model, size = torchvision.models.get_model(name, weights=None), 224
    model = model.to(device, dtype)
    x = torch.randn(batch or 32, 3, size, size, device=device, dtype=dtype)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, x, {}


def run_tune(
    name: str,
    batch: int | None,
    dtype: str,
    workspace_limit: int | None,
    micro_batch: str,
    workspace_policy: str,
    direction: str,
) -> NetworkPlan:
    """Convert and plan the model or suite `name` (see module docstring); returns the plan of
    the directions `direction` names ("all" or one)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, example, names = build(name, batch, DTYPES[dtype], device)
    model, _ = convert(
        model, inplace=True, workspace_limit=workspace_limit, micro_batch=micro_batch,
        workspace_policy=workspace_policy,
    )  # fmt: skip
    directions = None if direction == "all" else (direction,)
    plan = plan_network(model, example, backward=direction != "forward", directions=directions)
    if names:
        plan.rows = [replace(r, layer=names.get(r.layer, r.layer)) for r in plan.rows]
    return plan
