"""The tuning database: find_conv_algorithms stores what it measures and reuses it (in this
process and in others) without measuring again, per environment; refresh=True measures anew;
algo="auto" reads it. Several threads and processes share one file; a corrupt file is moved
aside and rebuilt, an unusable location falls back to memory, a locked one skips the store,
each with a warning and never an error. Also where the file lives, tile choices, and
`rtdnn tune`.

Find's timer is replaced by a counting fake: these tests are about what is stored and when
something is measured, not about the kernels (test_conv_select runs them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest
import torch

import rtdnn
from rtdnn import cli, select
from rtdnn.algos import supported_algorithms, tiles
from rtdnn.algos.direct import DirectTiles
from rtdnn.core import BadParamError
from rtdnn.kernels.launch import TileConfig
from rtdnn.ops.conv import _problem_for_selection
from rtdnn.select import database
from rtdnn.select.database import TuningDatabase, TuningDatabaseWarning

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny forward problem; on it the heuristic never picks GEMM, the fake timer's fastest.
X_SHAPE, W_SHAPE = (1, 2, 3, 3), (2, 2, 2, 2)


def operands(batch: int = 1):
    return torch.randn(batch, *X_SHAPE[1:]), torch.randn(W_SHAPE)


def forward_problem(x, w):
    """The problem find_conv_algorithms(x, w, math="fp32") describes."""
    return _problem_for_selection("forward", x, w, 1, 0, 1, 1, "cross_correlation", "fp32")[0]


class FakeTimer:
    """Stands in for select._time_ms: runs nothing, counts calls, and times `fastest` at
    0.5 ms and every other algorithm at 2 ms (in the order find measures them)."""

    def __init__(self, fastest: str = "GEMM"):
        self.fastest = fastest
        self.calls = 0
        self._names: list[str] = []

    def expect(self, x, w):
        """The algorithms find will measure for x and w, in its order."""
        self._names = [a.name for a in supported_algorithms(forward_problem(x, w))]

    def __call__(self, fn, device):
        name = self._names[self.calls % len(self._names)]
        self.calls += 1
        return 0.5 if name == self.fastest else 2.0


@pytest.fixture
def timer(monkeypatch):
    fake = FakeTimer()
    monkeypatch.setattr(select, "_time_ms", fake)
    return fake


@pytest.fixture
def db_file(tmp_path, monkeypatch):
    """RTDNN_TUNING_DB names a file in tmp_path; the process's database reopens it."""
    path = tmp_path / "tuning.sqlite3"
    monkeypatch.setenv("RTDNN_TUNING_DB", str(path))
    database.use(None)
    return path


def find(x, w, timer: FakeTimer, **kw):
    timer.expect(x, w)
    return rtdnn.find_conv_algorithms(x, w, math="fp32", **kw)


def new_process() -> None:
    """What a new process knows: nothing measured, the database opened afresh."""
    select.forget()
    database.use(None)


# -- reuse, refresh, environment ------------------------------------------------------------


def test_stored_results_are_reused_without_measuring(db_file, timer):
    x, w = operands()
    first = find(x, w, timer)
    measured = timer.calls
    assert measured == len(first) > 1 and first[0].algo == "GEMM" and first[0].time_ms == 0.5

    assert find(x, w, timer) == first and timer.calls == measured  # this process's results

    new_process()
    again = find(x, w, timer)
    assert timer.calls == measured, "measured again although the database had the problem"
    assert again == first  # name, time, workspace, determinism and status all kept

    # algo="auto" (and get) choose from the stored results without find being called.
    new_process()
    assert rtdnn.get_conv_algorithm(x, w, math="fp32") == "GEMM"
    assert timer.calls == measured


def test_auto_uses_stored_results_and_computes_the_right_thing(db_file, timer):
    x, w = operands()
    find(x, w, timer)
    new_process()
    heuristic = rtdnn.get_conv_algorithm(x, w, math="fp32", workspace_limit=0)
    assert heuristic != "GEMM"
    assert rtdnn.get_conv_algorithm(x, w, math="fp32") == "GEMM"
    y = rtdnn.conv_forward(x, w, algo="auto", math="fp32")
    assert torch.allclose(y, torch.nn.functional.conv2d(x, w), rtol=1e-5, atol=1e-5)


def test_refresh_measures_again_and_replaces_the_stored_results(db_file, timer):
    x, w = operands()
    first = find(x, w, timer)
    calls = timer.calls
    timer.fastest = "DIRECT"
    refreshed = find(x, w, timer, refresh=True)
    assert timer.calls == 2 * calls
    assert refreshed[0].algo == "DIRECT" and first[0].algo == "GEMM"
    assert rtdnn.get_conv_algorithm(x, w, math="fp32") == "DIRECT"

    new_process()
    assert find(x, w, timer) == refreshed and timer.calls == 2 * calls
    assert len(database.database().entries()) == len(refreshed), "old rows left behind"


def test_refresh_must_be_a_bool():
    x, w = operands()
    with pytest.raises(BadParamError, match="refresh"):
        rtdnn.find_conv_algorithms(x, w, refresh="yes")


def test_another_environment_misses(db_file, timer, monkeypatch):
    x, w = operands()
    here = database.environment("cpu")
    find(x, w, timer)
    calls = timer.calls

    elsewhere = dataclasses.replace(here, torch="0.0")
    original = database.environment
    monkeypatch.setattr(database, "environment", lambda device="cuda": elsewhere)
    new_process()
    find(x, w, timer)
    assert timer.calls == 2 * calls, "a result from another torch version was reused"
    assert {e.environment for e in database.database().entries()} == {here, elsewhere}

    monkeypatch.setattr(database, "environment", original)  # back here: still stored
    new_process()
    find(x, w, timer)
    assert timer.calls == 2 * calls


def test_each_batch_size_is_its_own_entry(db_file, timer):
    for batch in (1, 2):
        find(*operands(batch), timer)
    assert sorted({e.batch for e in database.database().entries()}) == [1, 2]


def test_cpu_and_gpu_environments_differ(monkeypatch):
    cpu = database.environment("cpu")
    assert cpu.device == database.CPU_DEVICE and "interpreter" in cpu.device.lower()
    assert cpu.rtdnn == rtdnn.__version__ and cpu.torch == torch.__version__
    monkeypatch.setattr(database, "_gpu_name", lambda index: "NVIDIA H100 80GB HBM3 sm_90")
    gpu = database.environment("cuda:0")
    assert gpu.device == "NVIDIA H100 80GB HBM3 sm_90" and gpu != cpu


def test_results_for_other_algorithms_are_measured_again(db_file, timer):
    """Stored results that miss an algorithm this build supports (stored by an older build)
    are not used: find measures them all."""
    x, w = operands()
    p = forward_problem(x, w)
    db = database.database()
    db.store(p.key(), 1, database.environment("cpu"), [select.AlgoPerf("GEMM", 0.1, 0, True)])
    results = find(x, w, timer)
    assert timer.calls == len(results) > 1


# -- several processes and threads --------------------------------------------------------

CHILD_FIND = """
import json, sys
from rtdnn import select
import rtdnn, torch
calls = []
def fake(fn, device):
    calls.append(1)
    return 1.0 + len(calls)
select._time_ms = fake
out = {}
for batch in (1, 2):
    x, w = torch.randn(batch, 2, 3, 3), torch.randn(2, 2, 2, 2)
    before = len(calls)
    results = rtdnn.find_conv_algorithms(x, w, math="fp32")
    out[batch] = {"measured": len(calls) - before, "best": [results[0].algo, results[0].time_ms]}
print(json.dumps(out))
"""


def _python(code: str, db_path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "RTDNN_TUNING_DB": str(db_path)}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    assert "TuningDatabaseWarning" not in err, err
    return out


def test_two_processes_share_the_file(db_file, timer):
    """This process measures batch 1; another reads it without measuring and measures
    batch 2; this one then reads batch 2 without measuring."""
    x, w = operands(1)
    mine = find(x, w, timer)
    child = json.loads(_finish(_python(CHILD_FIND, db_file)))
    assert child["1"] == {"measured": 0, "best": [mine[0].algo, mine[0].time_ms]}
    assert child["2"]["measured"] > 0

    calls = timer.calls
    new_process()
    theirs = find(*operands(2), timer)
    assert timer.calls == calls
    assert [theirs[0].algo, theirs[0].time_ms] == child["2"]["best"]


CHILD_WRITER = """
import os, sys, time
from rtdnn.select import AlgoPerf, database
name, go, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
db = database.database()
env = database.environment("cpu")
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
for i in range(count):
    db.store(f"{name}-{i}", 1, env, [AlgoPerf("GEMM", float(i), 0, True),
                                     AlgoPerf("IMPLICIT_GEMM", 1.0 + i, 0, True)])
    assert len(db.lookup(f"{name}-{i}", 1, env)) == 2
print("done", flush=True)
"""


def test_concurrent_writers_lose_nothing(db_file):
    """Two processes and four threads (each with its own connection) write to one file at
    the same time: no error, no warning, every row is there."""
    count = 40
    go = db_file.parent / "go"
    procs = [_python(CHILD_WRITER, db_file, name, str(go), str(count)) for name in ("p0", "p1")]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    env = database.environment("cpu")
    failures: list[BaseException] = []

    def write(name: str) -> None:
        try:
            db = TuningDatabase(str(db_file))
            for i in range(count):
                db.store(f"{name}-{i}", 1, env, [select.AlgoPerf("DIRECT", float(i), 0, True)])
                assert len(db.lookup(f"{name}-{i}", 1, env)) == 1
            db.close()
        except BaseException as e:  # reported below, in the test's thread
            failures.append(e)

    threads = [threading.Thread(target=write, args=(f"thread{i}",)) for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuningDatabaseWarning)
        go.touch()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for proc in procs:
            assert "done" in _finish(proc)
    assert not failures, failures
    check = TuningDatabase(str(db_file))
    entries = check.entries()
    check.close()
    assert len(entries) == (2 * 2 + 4) * count
    assert len({(e.problem, e.algo) for e in entries}) == len(entries)


def test_threads_share_the_process_database(db_file):
    env = database.environment("cpu")
    db = database.database()

    def write(name: str) -> None:
        for i in range(25):
            db.store(f"{name}-{i}", 1, env, [select.AlgoPerf("GEMM", 1.0, 0, True)])

    threads = [threading.Thread(target=write, args=(f"t{i}",)) for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuningDatabaseWarning)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(db.entries()) == 100


# -- a damaged, unusable, locked or disabled database ---------------------------------------


def _damage_pages(path) -> None:
    """A valid header, then noise: sqlite opens it and finds it malformed."""
    db = TuningDatabase(str(path))
    env = database.environment("cpu")
    for i in range(50):
        db.store(f"p{i}", 1, env, [select.AlgoPerf("GEMM", 1.0, 0, True)])
    db.close()  # the last connection: the log is folded into the file
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(torch.randint(0, 256, (size - 100,), dtype=torch.uint8).numpy().tobytes())


@pytest.mark.parametrize("damage", ["garbage", "malformed"])
def test_corrupt_file_is_moved_aside_and_rebuilt(db_file, timer, damage):
    if damage == "garbage":
        db_file.write_bytes(b"this is not a database\n" * 200)
    else:
        _damage_pages(db_file)
    damaged = db_file.read_bytes()
    x, w = operands()
    with pytest.warns(TuningDatabaseWarning, match="moved to"):
        results = find(x, w, timer)
    assert timer.calls == len(results)

    aside = [p for p in db_file.parent.iterdir() if ".corrupt-" in p.name]
    assert [p.read_bytes() for p in aside if not p.name.endswith(("-wal", "-shm"))] == [damaged]
    rebuilt = sqlite3.connect(db_file)
    assert rebuilt.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    assert rebuilt.execute("SELECT COUNT(*) FROM conv_results").fetchone()[0] == len(results)
    rebuilt.close()

    new_process()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuningDatabaseWarning)
        assert find(x, w, timer) == results and timer.calls == len(results)


def test_damage_found_while_open_rebuilds(tmp_path, monkeypatch):
    """A read that finds the open file damaged moves it aside and goes on with a new one."""
    path = tmp_path / "t.sqlite3"
    db = TuningDatabase(str(path))
    real = db._conn

    class Damaged:
        def execute(self, *args):
            raise sqlite3.DatabaseError("database disk image is malformed")

        def close(self):
            pass

    db._conn = Damaged()
    real.close()
    env = database.environment("cpu")
    with pytest.warns(TuningDatabaseWarning, match="damaged"):
        assert db.store("k", 1, env, [select.AlgoPerf("GEMM", 1.0, 0, True)])
    assert db.path == str(path) and len(db.lookup("k", 1, env)) == 1
    assert any(".corrupt-" in p.name for p in tmp_path.iterdir())


@pytest.mark.parametrize("where", ["under_a_file", "a_folder"])
def test_unusable_location_falls_back_to_memory(tmp_path, monkeypatch, timer, where):
    if where == "under_a_file":
        (tmp_path / "file").write_text("x")
        path = tmp_path / "file" / "tuning.sqlite3"
    else:
        path = tmp_path / "folder"
        path.mkdir()
    monkeypatch.setenv("RTDNN_TUNING_DB", str(path))
    database.use(None)
    x, w = operands()
    with pytest.warns(TuningDatabaseWarning, match="kept in memory"):
        results = find(x, w, timer)
    db = database.database()
    assert db.path is None and db.location == "memory"
    select.forget()  # the database in memory still has them for this process
    assert find(x, w, timer) == results and timer.calls == len(results)


def test_locked_database_skips_the_store_and_the_convolution_runs(db_file, timer):
    database.use(TuningDatabase(str(db_file), timeout_s=0.1))
    holder = sqlite3.connect(db_file, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process in the middle of a long write
    try:
        x, w = operands()
        with pytest.warns(TuningDatabaseWarning, match="locked"):
            results = find(x, w, timer)
        assert results[0].algo == "GEMM"
        assert rtdnn.get_conv_algorithm(x, w, math="fp32") == "GEMM"  # this process's
        y = rtdnn.conv_forward(x, w, algo="auto", math="fp32")
        assert torch.allclose(y, torch.nn.functional.conv2d(x, w), rtol=1e-5, atol=1e-5)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert database.database().entries() == []


def test_off_writes_nothing(tmp_path, monkeypatch, timer):
    monkeypatch.setenv("RTDNN_TUNING_DB", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    database.use(None)
    assert database.default_path() is None
    x, w = operands()
    results = find(x, w, timer)
    assert database.database().path is None
    assert list(tmp_path.iterdir()) == []
    select.forget()  # kept in memory for the process
    assert find(x, w, timer) == results and timer.calls == len(results)


def test_xdg_cache_home_and_home(tmp_path, monkeypatch, timer):
    monkeypatch.delenv("RTDNN_TUNING_DB")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    expected = tmp_path / "cache" / "rtdnn" / "tuning.sqlite3"
    assert database.default_path() == str(expected)
    database.use(None)
    find(*operands(), timer)
    assert expected.is_file()
    stored = TuningDatabase(str(expected))
    assert len(stored.entries()) > 0
    stored.close()

    home = str(tmp_path / "home" / ".cache" / "rtdnn" / "tuning.sqlite3")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: ignored
    assert database.default_path() == home
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert database.default_path() == home
    monkeypatch.setenv("RTDNN_TUNING_DB", "~/elsewhere.db")
    assert database.default_path() == str(tmp_path / "home" / "elsewhere.db")


# -- tile choices ---------------------------------------------------------------------------


def test_tile_choices_survive_the_process(db_file, monkeypatch):
    """The tile tuner (on a GPU, faked here) stores its choice; a new process takes it
    without timing; a stored choice that is no longer a candidate is tuned again."""
    gpu = dataclasses.replace(database.environment("cpu"), device="NVIDIA H100 sm_90")
    monkeypatch.setattr(database, "environment", lambda device="cuda": gpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tiles, "_chosen", {})
    candidates = [TileConfig(128, 128, 32), TileConfig(64, 128, 32), TileConfig(128, 64, 32)]
    timed: list[TileConfig] = []
    monkeypatch.setattr(tiles, "device_time_ms", lambda fn, rep_ms: fn())

    def make_run(config):
        return lambda: timed.append(config) or (0.5 if config == candidates[1] else 1.0)

    key = ("IMPLICIT_GEMM", "forward|problem")
    assert tiles.tune(key, candidates, make_run) == candidates[1] and len(timed) == 3

    tiles._chosen.clear()
    database.use(None)
    assert tiles.tune(key, candidates, make_run) == candidates[1] and len(timed) == 3
    stored = database.database().tile_entries()
    assert [(t.algo, t.problem, t.environment) for t in stored] == [
        ("IMPLICIT_GEMM", "forward|problem", gpu)
    ]

    tiles._chosen.clear()
    assert tiles.tune(key, candidates[::2], make_run) == candidates[0] and len(timed) == 5


def test_an_algorithms_own_tiles_survive_the_process(db_file, monkeypatch):
    """Tiles of a TileConfig subclass (DIRECT's, with its kernel family) come back as that class,
    so a stored choice matches the candidates of the next process."""
    gpu = dataclasses.replace(database.environment("cpu"), device="NVIDIA H100 sm_90")
    monkeypatch.setattr(database, "environment", lambda device="cuda": gpu)
    choices = database.TileChoices()
    own = DirectTiles(128, 16, 1, 1, 4, 3, kernel="dot")
    choices.save(("DIRECT", "forward|problem"), own)
    database.use(None)
    back = choices.load(("DIRECT", "forward|problem"))
    assert back == own and type(back) is DirectTiles
    plain = TileConfig(64, 128, 32)
    choices.save(("GEMM", "forward|problem"), plain)
    assert choices.load(("GEMM", "forward|problem")) == plain


# -- rtdnn tune -----------------------------------------------------------------------------


def test_cli_lists_exports_and_clears(db_file, timer, tmp_path, capsys):
    x, w = operands()
    results = find(x, w, timer)
    assert cli.main(["tune", "--list"]) == 0
    out = capsys.readouterr().out
    assert str(db_file) in out and f"{len(results)} results" in out
    assert all(r.algo in out for r in results) and database.CPU_DEVICE in out

    target = tmp_path / "export.json"
    assert cli.main(["tune", "--export", str(target)]) == 0
    exported = json.loads(target.read_text())
    assert exported["database"] == str(db_file)
    assert sorted(e["algo"] for e in exported["results"]) == sorted(r.algo for r in results)
    row = exported["results"][0]
    assert row["environment"]["device"] == database.CPU_DEVICE and row["batch"] == 1
    assert row["problem"].startswith("forward|") and row["time_ms"] == 0.5

    assert cli.main(["tune", "--clear"]) == 0
    assert f"deleted {len(results)}" in capsys.readouterr().out
    assert database.database().entries() == []


@pytest.mark.parametrize(
    "argv, words",
    [
        (["tune"], ["--list", "--export", "--clear", "required"]),
        (["tune", "--list", "--clear"], ["--clear", "not allowed with", "--list"]),
        (["tune", "--export"], ["--export", "expected one argument"]),
        (["tune", "--export", "/no/such/folder/t.json"], ["--export", "/no/such/folder"]),
        (["tune", "--export", "."], ["--export", "folder"]),
    ],
)
def test_cli_bad_options_exit_2_before_any_work(capsys, monkeypatch, argv, words):
    def refuse(*args, **kwargs):
        raise AssertionError("work started although the options were wrong")

    monkeypatch.setattr(cli, "_tune", refuse)
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    line = [ln for ln in capsys.readouterr().err.splitlines() if ": error: " in ln]
    assert len(line) == 1
    for word in words:
        assert word in line[0], line[0]
