"""The tuning database: measured algorithm times and tile choices that outlive the process.

One sqlite3 file, shared by every process that runs rtdnn on the machine (data-parallel ranks,
parallel jobs): WAL mode lets readers work beside a writer, and a busy timeout makes a writer
wait for another instead of failing. Where it lives:

    RTDNN_TUNING_DB=PATH    that file
    RTDNN_TUNING_DB=off     nothing on disk: a database in memory, for this process only
    (unset or empty)        $XDG_CACHE_HOME/rtdnn/tuning.sqlite3, else ~/.cache/rtdnn/...

A result is stored per problem (`ConvProblem.key()`), micro-batch size and environment (the
device, and the rtdnn, Triton and torch versions), so that a time measured on another GPU or
with other versions is never used. The database is a cache, never a reason for a convolution to
fail: a corrupt file is moved aside and rebuilt, an unusable location falls back to memory, and
a read or write that stays locked past the timeout is skipped, each with a
`TuningDatabaseWarning`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from ..kernels.launch import TileConfig

ENV_VAR = "RTDNN_TUNING_DB"
OFF = "off"
FILE_NAME = "tuning.sqlite3"
#: Seconds a read or write waits for another process's write before it is skipped.
TIMEOUT_S = 5.0
SCHEMA_VERSION = 1

_ENV_COLUMNS = (
    "device TEXT NOT NULL, rtdnn TEXT NOT NULL, triton TEXT NOT NULL, torch TEXT NOT NULL"
)
_SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS conv_results (
        problem TEXT NOT NULL, batch INTEGER NOT NULL, {_ENV_COLUMNS}, algo TEXT NOT NULL,
        time_ms REAL NOT NULL, workspace_bytes INTEGER NOT NULL, deterministic INTEGER NOT NULL,
        status TEXT NOT NULL, measured_at REAL NOT NULL,
        PRIMARY KEY (problem, batch, device, rtdnn, triton, torch, algo))""",
    f"""CREATE TABLE IF NOT EXISTS tile_choices (
        algo TEXT NOT NULL, problem TEXT NOT NULL, {_ENV_COLUMNS}, tiles TEXT NOT NULL,
        measured_at REAL NOT NULL,
        PRIMARY KEY (algo, problem, device, rtdnn, triton, torch))""",
)
_ENV_MATCH = "device = ? AND rtdnn = ? AND triton = ? AND torch = ?"

T = TypeVar("T")


class TuningDatabaseWarning(UserWarning):
    """The tuning database could not be used as asked; rtdnn went on without it."""


def _warn(message: str) -> None:
    warnings.warn(message, TuningDatabaseWarning, stacklevel=3)


# -- what a result is keyed by ----------------------------------------------------------------


@dataclass(frozen=True)
class Environment:
    """What a measured time depends on besides the problem: the device and the versions."""

    device: str
    rtdnn: str
    triton: str
    torch: str

    def __str__(self) -> str:
        return f"{self.device} | rtdnn {self.rtdnn} | triton {self.triton} | torch {self.torch}"

    def values(self) -> tuple[str, str, str, str]:
        return (self.device, self.rtdnn, self.triton, self.torch)


#: The device of results measured on the CPU, where kernels run in Triton's interpreter and
#: times say nothing about any GPU.
CPU_DEVICE = "cpu (Triton interpreter)"


@functools.cache
def _gpu_name(index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    return f"{props.name} sm_{props.major}{props.minor}"


def environment(device: str | torch.device = "cuda") -> Environment:
    """The environment of results measured on `device` in this process.

    A CUDA device without an index is the current one. The device part is the GPU's name and
    compute capability ("NVIDIA H100 80GB HBM3 sm_90"), or CPU_DEVICE on the CPU.
    """
    import triton

    from .. import __version__  # read at call time: rtdnn is fully imported by then

    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = _gpu_name(index)
    else:
        name = CPU_DEVICE
    return Environment(name, __version__, triton.__version__, torch.__version__)


# -- what is stored ---------------------------------------------------------------------------


class Measured(Protocol):
    """One algorithm's measurement, as the selector's AlgoPerf holds it."""

    algo: str
    time_ms: float
    workspace_bytes: int
    deterministic: bool
    status: str


@dataclass(frozen=True)
class Entry:
    """One stored row: an algorithm's result for a problem, batch size and environment."""

    problem: str
    batch: int
    environment: Environment
    algo: str
    time_ms: float
    workspace_bytes: int
    deterministic: bool
    status: str
    measured_at: float


@dataclass(frozen=True)
class TileEntry:
    """One stored tile choice: the tile config (JSON) an algorithm tuned for a problem."""

    algo: str
    problem: str
    environment: Environment
    tiles: str
    measured_at: float


# -- sqlite errors, by what they mean here ----------------------------------------------------

_LOCKED = "locked"
_CORRUPT = "corrupt"
_UNUSABLE = "unusable"


class _SchemaMismatch(sqlite3.Error):
    """The file holds another schema version: left alone, not rebuilt."""


def _kind(e: sqlite3.Error) -> str:
    """locked (another process holds it), corrupt (not a database, or damaged) or unusable."""
    if isinstance(e, _SchemaMismatch):
        return _UNUSABLE
    code = getattr(e, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        primary = code & 0xFF
        if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return _LOCKED
        if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            return _CORRUPT
        return _UNUSABLE
    text = str(e).lower()
    if "locked" in text or "busy" in text:
        return _LOCKED
    if "not a database" in text or "malformed" in text or "quick_check" in text:
        return _CORRUPT
    return _UNUSABLE


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _move_aside(path: str, file_id: tuple[int, int] | None) -> str | None:
    """Rename the damaged file (and its WAL and shared-memory files) out of the way; None if
    the file at `path` is no longer the one found damaged (another process rebuilt it)."""
    if file_id is None or _file_id(path) != file_id:
        return None
    aside = f"{path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for suffix in ("-wal", "-shm", ""):
        with contextlib.suppress(FileNotFoundError):
            os.replace(path + suffix, aside + suffix)
    return aside


@contextlib.contextmanager
def _write(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, taking the write lock at once (waiting up to the timeout)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


# -- the database -----------------------------------------------------------------------------


class TuningDatabase:
    """A tuning database in the sqlite3 file at `path`, or in memory when `path` is None.

    Every method is safe to call from several threads and never raises for a database problem:
    it warns and returns what a miss would (or skips the write).
    """

    def __init__(self, path: str | None, timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self.path: str | None = None
        self._file_id: tuple[int, int] | None = None  # of the file opened, see _rebuild
        self._conn = self._open(path)

    @property
    def location(self) -> str:
        """The file's path, or "memory"."""
        return self.path if self.path is not None else "memory"

    # -- opening ---------------------------------------------------------------------------
    def _open(self, path: str | None) -> sqlite3.Connection:
        """Connect to `path`; a corrupt file is moved aside and rebuilt, and a location that
        cannot be used gives a database in memory (each with a warning)."""
        self.path = None
        if path is None:
            return self._connect(":memory:")
        file_id = _file_id(path)
        try:
            conn = self._connect(path)
        except (sqlite3.Error, OSError) as e:
            if isinstance(e, sqlite3.Error) and _kind(e) == _CORRUPT:
                aside = _move_aside(path, file_id)
                if aside is not None:
                    _warn(
                        f"tuning database {path} is unreadable ({e}): moved to {aside}, "
                        "starting a new one"
                    )
                try:
                    conn = self._connect(path)
                except (sqlite3.Error, OSError) as again:
                    e = again
                else:
                    self.path, self._file_id = path, _file_id(path)
                    return conn
            _warn(
                f"tuning database {path} cannot be used ({e}): results are kept in memory "
                f"for this process only (set {ENV_VAR} to another file, or to '{OFF}')"
            )
            return self._connect(":memory:")
        self.path, self._file_id = path, _file_id(path)
        return conn

    def _connect(self, path: str) -> sqlite3.Connection:
        """_connect_once, tried again while the file is locked, up to the timeout: switching a
        file another process is creating to WAL can fail at once, without waiting for it."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return self._connect_once(path)
            except sqlite3.Error as e:
                if _kind(e) != _LOCKED or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _connect_once(self, path: str) -> sqlite3.Connection:
        on_disk = path != ":memory:"
        if on_disk:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # Autocommit (isolation_level=None): transactions are begun explicitly, see _write.
        conn = sqlite3.connect(
            path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            if on_disk:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                check = conn.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok":
                    raise sqlite3.DatabaseError(f"quick_check: {check}")
            if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                with _write(conn):  # another process may be creating it at the same time
                    version = conn.execute("PRAGMA user_version").fetchone()[0]
                    if version not in (0, SCHEMA_VERSION):
                        raise _SchemaMismatch(
                            f"schema version {version}, this rtdnn knows {SCHEMA_VERSION}"
                        )
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _rebuild(self, error: sqlite3.Error) -> None:
        """The open file turned out to be damaged: move it aside and start a new one."""
        path = self.path
        assert path is not None
        self._conn.close()
        aside = _move_aside(path, self._file_id)  # unless another process rebuilt it already
        if aside is not None:
            _warn(
                f"tuning database {path} is damaged ({error}): moved to {aside}, starting a new one"
            )
        self._conn = self._open(path)

    def _run(self, what: str, op: Callable[[sqlite3.Connection], T], default: T) -> T:
        """op(connection), or `default` with a warning when the database fails it."""
        with self._lock:
            for attempt in range(2):
                try:
                    return op(self._conn)
                except sqlite3.Error as e:
                    kind = _kind(e)
                    if kind == _CORRUPT and self.path is not None and attempt == 0:
                        self._rebuild(e)
                        continue  # once more, on the new file
                    if kind == _LOCKED:
                        _warn(
                            f"tuning database {self.location} stayed locked for "
                            f"{self.timeout_s:g} s: {what} skipped"
                        )
                    else:
                        _warn(f"tuning database {self.location}: {what} failed ({e}), skipped")
                    return default
            return default

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- convolution results ---------------------------------------------------------------
    def lookup(self, problem: str, batch: int, env: Environment) -> list[Entry]:
        """Every algorithm's stored result for `problem` at micro-batch size `batch` in
        `env`, fastest first (ties in the order stored); empty if none."""

        def op(conn):
            return conn.execute(
                "SELECT algo, time_ms, workspace_bytes, deterministic, status, measured_at "
                f"FROM conv_results WHERE problem = ? AND batch = ? AND {_ENV_MATCH} "
                "ORDER BY time_ms, rowid",  # ties in the order they were stored
                (problem, batch, *env.values()),
            ).fetchall()

        rows = self._run("read", op, [])
        return [Entry(problem, batch, env, a, t, w, bool(d), s, m) for a, t, w, d, s, m in rows]

    def store(
        self, problem: str, batch: int, env: Environment, results: Iterable[Measured]
    ) -> bool:
        """Replace what is stored for (`problem`, `batch`, `env`) by `results`, one row per
        algorithm. False if the write was skipped (with a warning)."""
        now = time.time()
        rows = [
            (
                problem,
                batch,
                *env.values(),
                r.algo,
                math.inf if math.isnan(r.time_ms) else float(r.time_ms),
                int(r.workspace_bytes),
                int(bool(r.deterministic)),
                r.status,
                now,
            )
            for r in results
        ]

        def op(conn):
            with _write(conn):
                conn.execute(
                    f"DELETE FROM conv_results WHERE problem = ? AND batch = ? AND {_ENV_MATCH}",
                    (problem, batch, *env.values()),
                )
                conn.executemany(f"INSERT INTO conv_results VALUES ({', '.join('?' * 12)})", rows)
            return True

        return self._run("store", op, False)

    # -- tile choices ----------------------------------------------------------------------
    def lookup_tiles(self, algo: str, problem: str, env: Environment) -> str | None:
        """The tile config (JSON) stored for `algo` on `problem` in `env`, or None."""

        def op(conn):
            return conn.execute(
                f"SELECT tiles FROM tile_choices WHERE algo = ? AND problem = ? AND {_ENV_MATCH}",
                (algo, problem, *env.values()),
            ).fetchone()

        row = self._run("read", op, None)
        return row[0] if row is not None else None

    def store_tiles(self, algo: str, problem: str, env: Environment, tiles: str) -> bool:
        """Store the tile config (JSON) `algo` chose for `problem` in `env`."""

        def op(conn):
            with _write(conn):
                conn.execute(
                    "INSERT OR REPLACE INTO tile_choices VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (algo, problem, *env.values(), tiles, time.time()),
                )
            return True

        return self._run("store", op, False)

    # -- the whole database (the command line) ---------------------------------------------
    def entries(self) -> list[Entry]:
        """Every stored convolution result, grouped by environment, problem and batch size,
        fastest first within a group."""

        def op(conn):
            return conn.execute(
                "SELECT problem, batch, device, rtdnn, triton, torch, algo, time_ms, "
                "workspace_bytes, deterministic, status, measured_at FROM conv_results "
                "ORDER BY device, rtdnn, triton, torch, problem, batch, time_ms, rowid"
            ).fetchall()

        return [
            Entry(p, b, Environment(dv, rv, tv, pv), a, t, w, bool(d), s, m)
            for p, b, dv, rv, tv, pv, a, t, w, d, s, m in self._run("read", op, [])
        ]

    def tile_entries(self) -> list[TileEntry]:
        """Every stored tile choice."""

        def op(conn):
            return conn.execute(
                "SELECT algo, problem, device, rtdnn, triton, torch, tiles, measured_at "
                "FROM tile_choices ORDER BY device, rtdnn, triton, torch, algo, problem"
            ).fetchall()

        return [
            TileEntry(a, p, Environment(dv, rv, tv, pv), t, m)
            for a, p, dv, rv, tv, pv, t, m in self._run("read", op, [])
        ]

    def export(self) -> dict:
        """Everything stored, as data for json.dump: {"database": location, "results": [...],
        "tiles": [...]}, one dict per row (a failed run's infinite time is None)."""
        results = [
            {**dataclasses.asdict(e), "time_ms": e.time_ms if math.isfinite(e.time_ms) else None}
            for e in self.entries()
        ]
        tiles = [
            {**dataclasses.asdict(t), "tiles": json.loads(t.tiles)} for t in self.tile_entries()
        ]
        return {"database": self.location, "results": results, "tiles": tiles}

    def clear(self) -> int:
        """Delete everything stored; returns how many rows (results and tile choices) went."""

        def op(conn):
            with _write(conn):
                n = conn.execute("DELETE FROM conv_results").rowcount
                n += conn.execute("DELETE FROM tile_choices").rowcount
            return n

        return self._run("clear", op, 0)


# -- the process's database -------------------------------------------------------------------


def default_path() -> str | None:
    """The file RTDNN_TUNING_DB names, else the one under the user's cache folder ($XDG_CACHE_HOME
    if it is an absolute path, else ~/.cache); None when RTDNN_TUNING_DB is 'off'."""
    value = os.environ.get(ENV_VAR, "").strip()
    if value.lower() == OFF:
        return None
    if value:
        return os.path.abspath(os.path.expanduser(value))
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):  # the XDG spec says to ignore a relative path
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "rtdnn", FILE_NAME)


_default: TuningDatabase | None = None
_default_pid: int | None = None
_default_lock = threading.Lock()


def database() -> TuningDatabase:
    """This process's tuning database, opened where default_path() says on first use."""
    global _default, _default_pid
    with _default_lock:
        # A forked child must not share its parent's connection: it opens its own.
        if _default is None or _default_pid != os.getpid():
            _default, _default_pid = TuningDatabase(default_path()), os.getpid()
        return _default


def use(db: TuningDatabase | None) -> None:
    """Make `db` this process's tuning database. None closes the current one: the next use
    opens the one RTDNN_TUNING_DB names then."""
    global _default, _default_pid
    with _default_lock:
        if _default is not None and _default_pid == os.getpid() and _default is not db:
            _default.close()
        _default, _default_pid = db, (os.getpid() if db is not None else None)


# -- tile choices, for algos.tiles -----------------------------------------------------------


def tuner_key_parts(key: tuple) -> tuple[str, str]:
    """A tile tuner key (algorithm name, *what identifies the problem) as stored: the name, and
    the rest joined by "|" (a convolution's rest is its ConvProblem.key())."""
    return str(key[0]), "|".join(str(part) for part in key[1:])


def tiles_to_fields(tiles: TileConfig) -> dict:
    """A tile config as JSON data: its class's name and its fields."""
    return {"class": type(tiles).__name__, **dataclasses.asdict(tiles)}


def tiles_from_fields(fields: dict) -> TileConfig | None:
    """The tile config that tiles_to_fields gave `fields` (which it consumes), or None when
    this version has no such class or fields (another version's: tune again)."""
    try:
        kind = _tile_classes().get(fields.pop("class", TileConfig.__name__))
        return None if kind is None else kind(**fields)
    except (TypeError, AttributeError):
        return None


class TileChoices:
    """The tile tuner's choices kept in this process's tuning database, for the current GPU."""

    def load(self, key: tuple) -> TileConfig | None:
        algo, problem = tuner_key_parts(key)
        text = database().lookup_tiles(algo, problem, environment("cuda"))
        if text is None:
            return None
        try:
            return tiles_from_fields(json.loads(text))
        except ValueError:
            return None

    def save(self, key: tuple, tiles: TileConfig) -> None:
        algo, problem = tuner_key_parts(key)
        database().store_tiles(
            algo, problem, environment("cuda"), json.dumps(tiles_to_fields(tiles))
        )


def _tile_classes() -> dict[str, type]:
    """TileConfig and its subclasses (an algorithm's own tiles, e.g. DIRECT's), by name."""
    found, todo = {}, [TileConfig]
    while todo:
        kind = todo.pop()
        found[kind.__name__] = kind
        todo.extend(kind.__subclasses__())
    return found


__all__ = [
    "CPU_DEVICE",
    "ENV_VAR",
    "Entry",
    "Environment",
    "TileChoices",
    "TileEntry",
    "TuningDatabase",
    "TuningDatabaseWarning",
    "database",
    "default_path",
    "environment",
    "tiles_from_fields",
    "tiles_to_fields",
    "tuner_key_parts",
    "use",
]
