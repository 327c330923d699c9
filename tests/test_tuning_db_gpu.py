"""The tuning database on the GPU: results are stored under the GPU's name and compute
capability and reused by a new process without measuring; the tile tuner's choices are
stored and taken back without timing. Run with RTDNN_GPU_TESTS=1 on a machine with a CUDA
GPU."""

import pytest
import torch
from conftest import gpu_only

import rtdnn
from rtdnn import select
from rtdnn.algos import ALGORITHMS, tiles
from rtdnn.select import database

pytestmark = gpu_only()


@pytest.fixture
def db_file(tmp_path, monkeypatch):
    path = tmp_path / "tuning.sqlite3"
    monkeypatch.setenv("RTDNN_TUNING_DB", str(path))
    monkeypatch.delenv("RTDNN_AUTOTUNE", raising=False)
    monkeypatch.setattr(tiles, "_shipped", None)  # what is timed here, not what ships
    database.use(None)
    return path


def new_process(monkeypatch) -> None:
    """What a new process knows: nothing measured or tuned, the database opened afresh."""
    select.forget()
    monkeypatch.setattr(tiles, "_chosen", {})
    for algo in ALGORITHMS.values():  # prepared launches hold the tiles chosen for them
        monkeypatch.setattr(algo, "_runners", {})
    database.use(None)


def refuse(*args, **kwargs):
    raise AssertionError("measured although the tuning database had the result")


def test_find_is_stored_under_this_gpu_and_reused(db_file, monkeypatch):
    x = torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.bfloat16)
    results = rtdnn.find_conv_algorithms(x, w, padding=1)
    assert results[0].status == "ok"

    props = torch.cuda.get_device_properties(0)
    envs = {e.environment for e in database.database().entries()}
    assert len(envs) == 1
    (env,) = envs
    assert env.device == f"{props.name} sm_{props.major}{props.minor}"

    new_process(monkeypatch)
    monkeypatch.setattr(select, "_time_ms", refuse)
    assert rtdnn.find_conv_algorithms(x, w, padding=1) == results
    new_process(monkeypatch)
    assert rtdnn.get_conv_algorithm(x, w, padding=1) == results[0].algo


def test_tile_choices_are_stored_and_reused(db_file, monkeypatch):
    new_process(monkeypatch)
    x = torch.randn(16, 64, 32, 32, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, 64, 3, 3, device="cuda", dtype=torch.bfloat16)
    first = rtdnn.conv_forward(x, w, padding=1, algo="IMPLICIT_GEMM")
    stored = database.database().tile_entries()
    assert [t.algo for t in stored] == ["IMPLICIT_GEMM"], stored
    assert stored[0].problem.startswith("forward|")

    new_process(monkeypatch)
    monkeypatch.setattr(tiles, "device_time_ms", refuse)
    again = rtdnn.conv_forward(x, w, padding=1, algo="IMPLICIT_GEMM")
    assert torch.equal(first, again)  # the same tiles, so the same rounding
