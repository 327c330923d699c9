"""`rtdnn bench --algo`: every convolution algorithm forced on every layer beside PyTorch,
run here as its CPU smoke run (tiny layers through the interpreter): the rows are exactly the
algorithms that support each layer, each correct, one fastest per (layer, direction), and the
win-region table counts them."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rtdnn import cli
from rtdnn.algos import ALGORITHMS
from rtdnn.algos.implicit_gemm import ImplicitGemm
from rtdnn.bench import conv_algos
from rtdnn.bench.conv_algos import TINY_LAYERS, AlgoRow, run_algo_suite, win_regions
from rtdnn.core import (
    ConvDesc,
    ConvProblem,
    Direction,
    TensorDesc,
    conv_output_shape,
    default_math_mode,
)
from rtdnn.ops import conv as conv_ops


def _supported(layer: dict, direction: str) -> dict[str, int]:
    """{algorithm: workspace bytes} for every algorithm that supports `layer` in `direction`,
    worked out here from the layer's description (channels-last float32, as the bench runs
    it; the written tensor laid out like x for forward, like dy for the backward ones)."""
    n, c, k = layer["n"], layer["c"], layer["k"]
    g = layer["groups"]
    conv = ConvDesc.create(
        len(layer["kernel"]), layer["stride"], layer["padding"], layer["dilation"], g,
        "cross_correlation", default_math_mode(),
    )  # fmt: skip

    def channels_last(shape):
        return torch.empty(shape).movedim(1, -1).contiguous().movedim(-1, 1)

    x = channels_last((n, c, *layer["spatial"]))
    w = channels_last((k, c // g, *layer["kernel"]))
    y = channels_last(conv_output_shape(x.shape, w.shape, conv))
    p = ConvProblem.create(
        Direction.parse(direction), TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), conv,
        "cpu",
    )  # fmt: skip
    return {name: a.workspace_bytes(p) for name, a in ALGORITHMS.items() if a.supports(p) is None}


def _rows(folder) -> list[dict]:
    (path,) = folder.glob("conv_algos_tiny_float32.json")
    return json.loads(path.read_text())["rows"]


def _check_table(rows: list[dict], directions: list[str], markdown: str) -> None:
    pairs = [(layer, d) for d in directions for layer in TINY_LAYERS]
    assert {(r["layer"], r["direction"]) for r in rows} == {
        (layer["name"], d) for layer, d in pairs
    }
    for layer, d in pairs:
        here = [r for r in rows if (r["layer"], r["direction"]) == (layer["name"], d)]
        expected = _supported(layer, d)
        assert {r["algo"]: r["workspace_bytes"] for r in here} == expected, (layer["name"], d)
        for r in here:
            assert r["ok"] and r["status"] == "ok", r
            assert r["rel_err_vs_cudnn"] < 1e-5, r
            assert math.isfinite(r["ms"]) and r["ms"] > 0, r
            assert r["ratio"] == pytest.approx(r["cudnn_ms"] / r["ms"]), r
        (fastest,) = [r for r in here if r["fastest"]]
        assert fastest["ms"] == min(r["ms"] for r in here)
        assert sum(r["auto"] for r in here) == 1, "auto's choice is one of those timed"
        for r in here:
            assert f"| {layer['name']} | {d} | {'**' * r['fastest']}{r['algo']}" in markdown
    wins = markdown.split("#### Win regions")[1]
    for layer in TINY_LAYERS:
        kernel = conv_algos.kernel_label(layer)
        assert all(r["kernel"] == kernel for r in rows if r["layer"] == layer["name"])
        assert f"| {kernel} | {len(directions)} | " in wins
    for name in {r["algo"] for r in rows}:
        won = sum(r["fastest"] for r in rows if r["algo"] == name)
        ran = sum(r["algo"] == name for r in rows)
        assert f"| {name} | {ran} | {won} |" in wins, (name, wins)


def test_cli_algo_all_forward_lists_every_supported_algorithm(capsys, tmp_path):
    argv = ["bench", "--algo", "all", "--direction", "forward", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "No CUDA device: a smoke run of --algo all" in out
    assert str(tmp_path / "conv_algos_tiny_float32.md") in out
    markdown = (tmp_path / "conv_algos_tiny_float32.md").read_text()
    _check_table(_rows(tmp_path), ["forward"], markdown)


@pytest.mark.slow
def test_cli_algo_all_every_direction(capsys, tmp_path):
    assert cli.main(["bench", "--algo", "all", "--out", str(tmp_path)]) == 0
    markdown = (tmp_path / "conv_algos_tiny_float32.md").read_text()
    _check_table(_rows(tmp_path), ["forward", "backward_data", "backward_filter"], markdown)


def test_cli_one_algorithm(capsys, tmp_path):
    """One algorithm by name (any case): its rows only; where it does not apply a row says
    why, which is no failure."""
    argv = ["bench", "--algo", "winograd", "--out", str(tmp_path), "--suite", "vgg16"]
    assert cli.main([*argv, "--direction", "backward_filter"]) == 0
    out = capsys.readouterr().out
    assert "(--suite: for the GPU benchmark" in out
    rows = _rows(tmp_path)
    assert [r["algo"] for r in rows] == ["WINOGRAD"] * len(TINY_LAYERS)
    for r in rows:
        assert r["status"].startswith("not supported: ") and not r["ok"], r
        assert "backward-filter" in r["status"] or "2-D only" in r["status"], r

    assert cli.main([*argv, "--direction", "forward", "--algo", "GEMM"]) == 0
    rows = _rows(tmp_path)
    assert [r["algo"] for r in rows] == ["GEMM"] * len(TINY_LAYERS)
    assert all(r["ok"] and r["fastest"] for r in rows), rows


def test_strict_float32(capsys, monkeypatch, tmp_path):
    """--math fp32: rtdnn's calls in strict float32, PyTorch's TF32 switch off during the run
    and restored after."""
    tf32_before = torch.backends.cudnn.allow_tf32
    seen = []
    real = conv_algos.run_layer_algos

    def spy(*args, **kwargs):
        seen.append((kwargs["math_mode"], torch.backends.cudnn.allow_tf32))
        return real(*args, **kwargs)

    monkeypatch.setattr(conv_algos, "run_layer_algos", spy)
    argv = ["bench", "--algo", "IMPLICIT_GEMM", "--direction", "forward", "--dtype", "fp32"]
    assert cli.main([*argv, "--math", "fp32", "--out", str(tmp_path)]) == 0
    assert seen == [("fp32", False)] * len(TINY_LAYERS)
    assert torch.backends.cudnn.allow_tf32 == tf32_before
    out = capsys.readouterr().out
    assert "(--dtype" not in out, "float32 is what the smoke run takes"
    data = json.loads((tmp_path / "conv_algos_tiny_float32_strict.json").read_text())
    assert "float32 (strict)" in data["title"]
    assert [r["algo"] for r in data["rows"]] == ["IMPLICIT_GEMM"] * len(TINY_LAYERS)
    assert all(r["ok"] for r in data["rows"]), data["rows"]


class Broken(ImplicitGemm):
    name = "BROKEN_STAND_IN"

    def prepare(self, p, tiles):
        raise RuntimeError("no kernel today")


def test_a_failing_algorithm_is_reported_and_fails_the_run(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(ALGORITHMS, Broken.name, Broken())
    monkeypatch.setattr(conv_ops, "_prepared", {})
    layers = TINY_LAYERS[1:]  # the 1-D one: the fewest algorithms
    rows = run_algo_suite("tiny", "float32", ["forward"], "all", out_dir=None, layers=layers)
    (broken,) = [r for r in rows if r.algo == Broken.name]
    assert broken.failed and "no kernel today" in broken.status and not broken.fastest
    assert not any(r.failed for r in rows if r.algo != Broken.name)
    assert sum(r.fastest for r in rows) == 1
    monkeypatch.setattr(conv_algos, "TINY_LAYERS", layers)
    argv = ["bench", "--algo", "all", "--direction", "forward", "--out", str(tmp_path)]
    assert cli.main(argv) == 1


def test_win_regions_counts_wins_per_direction_and_kernel():
    def row(layer, direction, algo, ms, fastest=False, auto=False):
        kernel = {"a": "3x3 s1", "b": "1x1 s1"}[layer]
        return AlgoRow(layer, direction, algo, ms, 0, 1.5, 1.5 / ms, 0.0, True,
                       fastest=fastest, auto=auto, kernel=kernel)  # fmt: skip

    rows = [
        row("a", "forward", "X", 1.0, fastest=True),
        row("a", "forward", "Y", 2.0, auto=True),
        row("b", "forward", "X", 1.0, fastest=True, auto=True),
        row("a", "backward_data", "Y", 0.5, fastest=True, auto=True),
    ]
    table = win_regions(rows)
    assert "fastest forward | fastest backward_data |" in table
    assert "backward_filter" not in table
    assert "| X | 2 | 2 | 2 | 0 | 2 | 1.50 |" in table
    assert "| Y | 2 | 1 | 0 | 1 | 1 | 1.50 |" in table
    assert "on 2 of 3 (layer, direction) pairs" in table
    assert "| 3x3 s1 | 2 | X 1, Y 1 |" in table
    assert "| 1x1 s1 | 1 | X 1 |" in table


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_rows_describe_the_problem_the_call_runs(direction, monkeypatch):
    """Each row's support and workspace are asked of the very problem rtdnn's call builds."""
    from rtdnn.bench.conv import layer_calls

    for layer in TINY_LAYERS:
        c = layer_calls(layer, direction, torch.float32, None, "cpu")
        monkeypatch.setattr(conv_ops, "_prepared", {})
        c.ours(algo="IMPLICIT_GEMM")
        (prepared,) = conv_ops._prepared.values()
        assert prepared.problem == conv_algos._problem(c, direction), layer["name"]


@pytest.mark.parametrize(
    "module",
    [
        torch.nn.Conv2d(96, 96, 7, groups=96),  # one input channel: the depthwise filters
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.Conv3d(4, 4, 3, groups=4),
    ],
)
def test_suite_tensors_are_strided_as_a_models(module):
    """The suites' channels-last filters carry the strides of a model's (module.to(memory_
    format=...)), also in a dimension of size 1, where strides are otherwise arbitrary: the
    shipped tile table is keyed by strides recorded from models, and a suite's depthwise
    filter strided otherwise missed every shipped choice."""
    from rtdnn.bench.conv import _channels_last

    fmt = torch.channels_last if module.weight.dim() == 4 else torch.channels_last_3d
    want = module.to(memory_format=fmt).weight.stride()
    assert _channels_last(torch.randn(module.weight.shape)).stride() == want
