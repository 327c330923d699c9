"""The command line: option checking (one line, exit 2, before any work), --version, info, and
where bench says it wrote its results. No real benchmark runs here: the runners are replaced."""

import json
import os

import pytest
import torch

import rtdnn
from rtdnn import cli


def _usage_error(capsys, argv) -> str:
    """main(argv) must stop with exit status 2; returns argparse's error line."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def no_work(monkeypatch):
    """Any attempt to start real work fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("work started although the options were wrong")

    for name in ("_info", "_bench", "_demo", "_self_check"):
        monkeypatch.setattr(cli, name, refuse)
    monkeypatch.setattr(cli.os, "execv", refuse)


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize(
    "argv, words",
    [
        (["bench", "--suite", "nosuchsuite"], ["--suite", "nosuchsuite", "resnet50", "vgg16"]),
        (["bench", "--dtype", "float7"], ["--dtype", "float7", "bf16", "fp16", "float32"]),
        (["bench", "--batch", "-5"], ["--batch", "-5", "positive"]),
        (["bench", "--batch", "0"], ["--batch", "'0'", "positive"]),
        (["bench", "--batch", "two"], ["--batch", "two"]),
        (["bench", "--limit", "0"], ["--limit", "positive"]),
        (["bench", "--model", "small", "--batch", "-1"], ["--batch", "-1"]),
        (["bench", "--direction", "sideways"], ["--direction", "sideways"]),
        (["bench", "--op", "conv"], ["--op", "conv"]),
        (["bench", "--op", "lrn", "--model", "small"], ["--op", "--model"]),
        (["bench", "--op", "lrn", "--suite", "vgg16"], ["--suite", "not used by --op"]),
        (["bench", "--op", "all", "--dtype", "fp16"], ["--dtype", "not used by --op"]),
        (["bench", "--model", "small", "--limit", "3"], ["--limit", "not used by --model"]),
        (["bench", "--no-fuse"], ["--no-fuse", "not used by the convolution suite"]),
        (["bench", "--compile", "default"], ["--compile", "not used by the convolution suite"]),
        (["bench", "--out", "pyproject.toml"], ["--out", "not a folder"]),
        (["bench", "--algo", "nosuch"], ["--algo", "'nosuch'", "all", "IMPLICIT_GEMM", "FFT"]),
        (["bench", "--algo", "all", "--find"], ["--find", "not used by --algo"]),
        (["bench", "--algo", "GEMM", "--eager"], ["--eager", "not used by --algo"]),
        (["bench", "--op", "lrn", "--algo", "all"], ["--algo", "not used by --op"]),
        (["bench", "--model", "small", "--algo", "all"], ["--algo", "not used by --model"]),
        (["bench", "--algo", "all", "--math", "fp32"], ["--math fp32", "--dtype float32"]),
        (["bench", "--algo", "all", "--math", "fp64"], ["--math", "fp64", "tf32"]),
        (["bench", "--dtype", "fp32", "--math", "fp32"], ["--math", "not used by the convolution"]),
        (["bench", "--micro-batch", "--op", "lrn"], ["--op", "--micro-batch"]),
        (["bench", "--micro-batch", "--find"], ["--find", "not used by --micro-batch"]),
        (["bench", "--policies", "all"], ["--policies", "not used by the convolution suite"]),
        (["bench", "--micro-batch", "--policies", "all,some"], ["--policies", "all,some"]),
        (["bench", "--micro-batch", "--budget", "0"], ["--budget", "positive"]),
        (["demo", "--epochs", "0"], ["--epochs", "positive"]),
        (["demo", "--epochs", "-2"], ["--epochs", "-2"]),
        (["demo", "--budget", "-3"], ["--budget", "-3", "seconds"]),
        (["demo", "--budget", "0"], ["--budget", "seconds"]),
        (["demo", "--budget", "nan"], ["--budget", "nan"]),
        (["demo", "--plot", "/no/such/folder/loss.png"], ["--plot", "/no/such/folder"]),
        (["frobnicate"], ["frobnicate"]),
        ([], ["command"]),
    ],
)
def test_bad_options_exit_2_before_any_work(capsys, monkeypatch, no_work, cuda, argv, words):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(__file__)))  # for pyproject.toml
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(cli, "_installed", lambda name: True)  # optional extras: another test
    line = _usage_error(capsys, argv)
    for word in words:
        assert word in line, line


def test_suites_are_those_shipped():
    from rtdnn.bench.conv import suites

    assert cli.suites() == suites()
    assert "resnet50" in cli.suites()


@pytest.mark.parametrize(
    "argv, module, words",
    [
        (["demo"], "sklearn", ["scikit-learn", 'pip install -e ".[demo]"']),
        (["demo", "--plot", "loss.png"], "matplotlib", ["--plot", 'pip install -e ".[demo]"']),
        (["bench", "--model", "resnet50"], "torchvision", ["torchvision"]),
        (["bench", "--micro-batch"], "scipy", ["--micro-batch", "pip install 'rtdnn[plan]'"]),
    ],
)
def test_missing_optional_dependency_reported_first(
    capsys, monkeypatch, no_work, argv, module, words
):
    monkeypatch.setattr(cli, "_installed", lambda name: name != module)
    line = _usage_error(capsys, argv)
    for word in words:
        assert word in line, line


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"rtdnn {rtdnn.__version__}"


@pytest.mark.parametrize(
    "interpreted, cuda, expected, absent",
    [
        (True, False, "interpreter", "compiled"),
        (False, False, "cannot run", "compiled"),
        (False, True, "compiled", "interpreter"),
    ],
)
def test_info_says_one_thing_about_the_kernels(
    capsys, monkeypatch, interpreted, cuda, expected, absent
):
    monkeypatch.setattr(rtdnn.core, "INTERPRETED", interpreted)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    if cuda:  # no device here: stand in for its properties

        class Props:
            name, multi_processor_count, total_memory = "Some GPU", 132, 80 << 30

        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props)
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    kernels = [line for line in out.splitlines() if line.startswith("kernels")]
    assert len(kernels) == 1
    assert expected in kernels[0] and absent not in kernels[0], kernels[0]
    assert f"rtdnn     {rtdnn.__version__}" in out


def test_bench_on_gpu_passes_checked_options_and_prints_where_it_wrote(
    capsys, monkeypatch, tmp_path
):
    """The GPU branch with the suite runner replaced: canonical dtype, directions, and the
    files written listed by path."""
    import rtdnn.bench.conv as conv

    calls = []

    def fake_run_suite(suite, dtype, directions, batch, limit, out_dir, find, eager):
        calls.append((suite, dtype, directions, batch, limit, find, eager))
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"conv_{suite}_{dtype}.json"), "w") as f:
            json.dump({"rows": []}, f)
        return []

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(conv, "run_suite", fake_run_suite)
    out = tmp_path / "results"
    argv = ["bench", "--suite", "vgg16", "--dtype", "bfloat16", "--direction", "forward"]
    status = cli.main([*argv, "--batch", "4", "--limit", "2", "--out", str(out)])
    assert status == 0
    assert calls == [("vgg16", "bf16", ["forward"], 4, 2, False, False)]
    printed = capsys.readouterr().out
    assert "results written to:" in printed
    assert str(out / "conv_vgg16_bf16.json") in printed


def test_bench_algo_on_gpu_passes_checked_options(monkeypatch, tmp_path):
    """The GPU branch of --algo with the runner replaced: the algorithm's registered name,
    canonical dtype and directions; a failed row makes the exit status 1."""
    import rtdnn.bench.conv_algos as conv_algos

    calls, failed = [], []

    class Row:
        @property
        def failed(self):
            return bool(failed)

    def fake_run_algo_suite(*args, math_mode):
        calls.append((*args, math_mode))
        return [Row()]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(conv_algos, "run_algo_suite", fake_run_algo_suite)
    argv = ["bench", "--algo", "winograd_nonfused", "--suite", "vgg16", "--dtype", "fp32"]
    argv += ["--direction", "backward_data", "--limit", "3", "--out", str(tmp_path)]
    assert cli.main([*argv, "--math", "fp32"]) == 0
    assert calls == [
        ("vgg16", "float32", ["backward_data"], "WINOGRAD_NONFUSED", None, 3, str(tmp_path), "fp32")
    ]
    failed.append(True)
    assert cli.main(["bench", "--algo", "ALL", "--out", str(tmp_path)]) == 1
    assert calls[1] == ("resnet50", "bf16", list(conv_algos.DIRECTIONS), "all", None, None,
                        str(tmp_path), "tf32")  # fmt: skip


def test_bench_defaults(monkeypatch, tmp_path):
    import rtdnn.bench.conv as conv

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(conv, "run_suite", lambda *a: calls.append(a) or [])
    assert cli.main(["bench", "--out", str(tmp_path)]) == 0
    suite, dtype, directions, batch, limit = calls[0][:5]
    assert (suite, dtype, batch, limit) == ("resnet50", "bf16", None, None)
    assert directions == list(conv.DIRECTIONS)


def test_micro_batch_bench_gets_its_options(monkeypatch, tmp_path):
    """--micro-batch: the suites left to the experiment unless given, float32 by default (the
    paper's precision), policies and budget passed on; on the CPU too (its tiny layers)."""
    import rtdnn.bench.micro_batch as micro_batch
    from rtdnn.select.plan import POLICIES

    assert cli.POLICIES == POLICIES
    calls = []
    monkeypatch.setattr(micro_batch, "run_suites", lambda *a: calls.append(a) or [])
    for cuda in (True, False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        assert cli.main(["bench", "--micro-batch", "--out", str(tmp_path)]) == 0
    argv = ["bench", "--micro-batch", "--suite", "alexnet", "--policies", "undivided,all"]
    argv += ["--budget", "512", "--batch", "8", "--limit", "2", "--direction", "forward"]
    assert cli.main([*argv, "--dtype", "bf16", "--out", str(tmp_path)]) == 0
    default = (None, "float32", None, None, None, None, None, str(tmp_path))
    assert calls == [
        default,
        default,
        (["alexnet"], "bf16", ["forward"], 8, 2, ["undivided", "all"], 512, str(tmp_path)),
    ]


def test_cpu_bench_runs_the_self_check_and_notes_unused_options(capsys, monkeypatch):
    """Without a GPU: the self-check (replaced by two canned results here), its verdict as the
    exit status, and a note that the suite options are for the GPU benchmark."""
    import rtdnn.bench.selfcheck as selfcheck

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(selfcheck, "run_all", lambda: [("a", 1e-8, True), ("b", 1.0, False)])
    assert cli.main(["bench", "--suite", "vgg16"]) == 1
    out = capsys.readouterr().out
    assert "self-check" in out and "--suite" in out and "1 failed" in out
    assert "FAIL b" in out
    assert cli.main(["bench", "--op", "norm"]) == 1
    assert "--op: for the GPU benchmark" in capsys.readouterr().out


def test_every_suite_layer_is_a_valid_convolution():
    """Each shipped suite's layers describe convolutions rtdnn accepts (shapes, strides,
    padding, groups), checked without running anything."""
    from rtdnn.bench.conv import _conv_args, load_suite
    from rtdnn.core import ConvDesc, conv_output_shape

    for name in cli.suites():
        layers = load_suite(name)
        assert layers and len({layer["name"] for layer in layers}) == len(layers), name
        for layer in layers:
            args = _conv_args(layer)
            nd = len(layer["spatial"])
            desc = ConvDesc.create(
                nd, args["stride"], args["padding"], args["dilation"], args["groups"],
                "cross_correlation", "fp32",
            )  # fmt: skip
            x_shape = (layer["n"], layer["c"], *layer["spatial"])
            w_shape = (layer["k"], layer["c"] // args["groups"], *layer["kernel"])
            out = conv_output_shape(x_shape, w_shape, desc)
            assert all(o >= 1 for o in out[2:]), (name, layer["name"])


def test_bench_op_routes_each_family(monkeypatch, tmp_path):
    """--op with the runners replaced: each family alone, all of them in order for `all` (the
    limit passed to those that take cases), and exit status 1 when any checked row disagrees."""
    import rtdnn.bench.attention as attention
    import rtdnn.bench.ctc as ctc
    import rtdnn.bench.grid_sample as grid_sample
    import rtdnn.bench.norm as norm
    import rtdnn.bench.prims as prims
    import rtdnn.bench.rnn as rnn

    calls, bad = [], set()

    class Row:
        def __init__(self, name):
            self.ok = name not in bad

    def checked(name):
        return lambda out_dir, limit: calls.append((name, limit)) or [Row(name)]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(norm, "run_norm", lambda out_dir: calls.append(("norm", None)))
    monkeypatch.setattr(prims, "run_ops", lambda ops, out_dir: calls.append((tuple(ops), None)))
    for module, name in ((attention, "attention"), (rnn, "rnn"), (ctc, "ctc"),
                         (grid_sample, "grid_sample")):  # fmt: skip
        monkeypatch.setattr(module, f"run_{name}", checked(name))
    for name in ("rnn", "ctc", "grid_sample"):
        calls.clear()
        assert cli.main(["bench", "--op", name, "--limit", "2", "--out", str(tmp_path)]) == 0
        assert calls == [(name, 2)]
    calls.clear()
    assert cli.main(["bench", "--op", "lrn", "--out", str(tmp_path)]) == 0
    assert calls == [(("lrn",), None)]
    calls.clear()
    bad.add("rnn")
    assert cli.main(["bench", "--op", "all", "--limit", "1", "--out", str(tmp_path)]) == 1
    assert calls == [
        ("norm", None), (tuple(prims.OPS), None), ("attention", 1), ("rnn", 1), ("ctc", 1),
        ("grid_sample", 1),
    ]  # fmt: skip
