"""The tile choices that ship with rtdnn (select.shipped): which GPU's table a lookup reads,
the batch-size classes of convolution problems, writing a sweep's choices into the tables,
and how the tile tuner uses them beside the tuning database and RTDNN_AUTOTUNE."""

import dataclasses

import pytest
import torch

from rtdnn.algos import tiles
from rtdnn.core import ConvDesc, ConvProblem, Direction, TensorDesc
from rtdnn.kernels.launch import TileConfig, TmaGemmTiles
from rtdnn.select import database, shipped

A, B, C = TileConfig(128, 128, 64), TileConfig(64, 128, 64), TmaGemmTiles(128, 256, 64, splits=2)


def _key(batch: int, channels: int = 64) -> str:
    x = torch.empty(batch, channels, 14, 14).to(memory_format=torch.channels_last)
    w = torch.empty(128, channels, 3, 3).to(memory_format=torch.channels_last)
    y = torch.empty(batch, 128, 14, 14).to(memory_format=torch.channels_last)
    conv = ConvDesc.create(2, 1, 1, 1, 1, "cross_correlation", "ieee")
    desc = [TensorDesc.of(t) for t in (x, w, y)]
    return ConvProblem.create(Direction.FORWARD, *desc, conv, "cuda").key()


def test_a_convolution_key_names_its_layer_apart_from_the_batch():
    layer, batch = shipped.batch_class(_key(32))
    assert batch == 32 and shipped.batch_class(_key(256)) == (layer, 256)
    assert shipped.batch_class(_key(32, channels=32))[0] != layer
    assert shipped.batch_class("StridedGeometry(rows=128)|torch.bfloat16") is None


def test_a_table_gives_the_exact_choice_else_the_nearest_batch():
    entries = [
        {"algo": "IMPLICIT_GEMM", "problem": _key(64), "tiles": database.tiles_to_fields(A)},
        {"algo": "IMPLICIT_GEMM", "problem": _key(256), "tiles": database.tiles_to_fields(B)},
        {"algo": "GEMM", "problem": _key(64), "tiles": database.tiles_to_fields(C)},
        {"algo": "linear", "problem": "rows=7", "tiles": database.tiles_to_fields(A)},
        {"algo": "GEMM", "problem": _key(8), "tiles": {"class": "NoSuchTiles", "block_m": 1}},
    ]
    table = shipped.Table(entries)
    assert table.lookup("IMPLICIT_GEMM", _key(64)) == A
    assert table.lookup("IMPLICIT_GEMM", _key(256)) == B
    assert table.lookup("IMPLICIT_GEMM", _key(96)) == A  # nearer 64 than 256 (log scale)
    assert table.lookup("IMPLICIT_GEMM", _key(200)) == B
    assert table.lookup("IMPLICIT_GEMM", _key(128)) == B  # a tie takes the larger batch
    assert table.lookup("GEMM", _key(64)) == C and table.lookup("GEMM", _key(1)) == C
    assert table.lookup("IMPLICIT_GEMM", _key(64, channels=32)) is None  # another layer
    assert table.lookup("DIRECT", _key(64)) is None
    assert table.lookup("linear", "rows=7") == A and table.lookup("linear", "rows=8") is None


def _conv_key(n, c, k, h, kernel=3, stride=1, channels_last=True, dtype=torch.float32) -> str:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.empty(n, c, h, h, dtype=dtype).to(memory_format=fmt)
    w = torch.empty(k, c, kernel, kernel, dtype=dtype).to(memory_format=fmt)
    p = (h + 2 - kernel) // stride + 1
    y = torch.empty(n, k, p, p, dtype=dtype).to(memory_format=fmt)
    conv = ConvDesc.create(2, stride, 1, 1, 1, "cross_correlation", "ieee")
    desc = [TensorDesc.of(t) for t in (x, w, y)]
    return ConvProblem.create(Direction.FORWARD, *desc, conv, "cuda").key()


def test_an_untuned_layer_takes_the_choice_of_the_most_similar_one():
    """With `similar` (RTDNN_AUTOTUNE=0), a convolution the table lacks takes the choice of
    the one of the same kind (filter, stride, layouts, dtype...) nearest in pixels and
    channels; never one of another kind."""
    entries = [
        {"algo": "IMPLICIT_GEMM", "problem": _conv_key(64, 256, 256, 14),
         "tiles": database.tiles_to_fields(A)},
        {"algo": "IMPLICIT_GEMM", "problem": _conv_key(64, 64, 64, 56),
         "tiles": database.tiles_to_fields(B)},
    ]  # fmt: skip
    table = shipped.Table(entries)
    near_first = _conv_key(32, 384, 384, 13)
    assert table.lookup("IMPLICIT_GEMM", near_first) is None  # not without `similar`
    assert table.lookup("IMPLICIT_GEMM", near_first, similar=True) == A
    assert table.lookup("IMPLICIT_GEMM", _conv_key(16, 96, 64, 96), similar=True) == B
    for other in (
        _conv_key(64, 256, 256, 14, kernel=5),
        _conv_key(64, 256, 256, 14, stride=2),
        _conv_key(64, 256, 256, 14, channels_last=False),
    ):
        assert table.lookup("IMPLICIT_GEMM", other, similar=True) is None
    assert table.lookup("GEMM", near_first, similar=True) is None
    assert shipped.shape_class("rows=7") is None
    kind, sizes = shipped.shape_class(_conv_key(64, 256, 128, 14))
    assert sizes == (64 * 14 * 14, 256, 128) and kind[3] == (True, True, True)


def test_a_float16_layer_the_table_lacks_takes_bfloat16s_choice():
    """float16 and bfloat16 multiply at the same rate: a float16 problem without a choice of
    its own takes bfloat16's for the same layer (at the nearest batch), and with `similar`
    the nearest of its kind in either dtype; its own choice first; never the other way
    round."""
    half, bf16 = torch.float16, torch.bfloat16
    entries = [
        {"algo": "IMPLICIT_GEMM", "problem": _conv_key(64, 256, 256, 14, dtype=bf16),
         "tiles": database.tiles_to_fields(A)},
        {"algo": "IMPLICIT_GEMM", "problem": _conv_key(64, 64, 64, 56, dtype=half),
         "tiles": database.tiles_to_fields(B)},
    ]  # fmt: skip
    table = shipped.Table(entries)
    assert table.lookup("IMPLICIT_GEMM", _conv_key(64, 256, 256, 14, dtype=half)) == A
    assert table.lookup("IMPLICIT_GEMM", _conv_key(128, 256, 256, 14, dtype=half)) == A
    assert table.lookup("IMPLICIT_GEMM", _conv_key(64, 64, 64, 56, dtype=half)) == B
    assert table.lookup("IMPLICIT_GEMM", _conv_key(64, 64, 64, 56, dtype=bf16)) is None
    near = _conv_key(32, 384, 384, 13, dtype=half)
    assert table.lookup("IMPLICIT_GEMM", near) is None
    assert table.lookup("IMPLICIT_GEMM", near, similar=True) == A
    assert table.lookup("IMPLICIT_GEMM", _conv_key(64, 256, 256, 14)) is None  # float32


def _entries(db, device: str) -> list:
    env = dataclasses.replace(database.environment("cpu"), device=device)
    db.store_tiles("IMPLICIT_GEMM", _key(64), env, '{"class": "TileConfig", "block_m": 128, '
                   '"block_n": 128, "block_k": 64}')  # fmt: skip
    db.store_tiles("GEMM", _key(64), env, '{"class": "TmaGemmTiles", "block_m": 128, '
                   '"block_n": 256, "block_k": 64, "splits": 2}')  # fmt: skip
    return [e for e in db.tile_entries() if e.environment == env]


def test_a_sweep_is_written_and_read_back_per_gpu(tmp_path):
    path = str(tmp_path / "shipped.json")
    db = database.TuningDatabase(None)
    document = shipped.read(path)  # no file yet: no tables
    assert document == {"format": shipped.FORMAT, "tables": []}
    document = shipped.add_sweep(document, _entries(db, "NVIDIA H200 sm_90"), 132, "s1", "d1")
    shipped.write(document, path)
    store = shipped.ShippedTiles(path, gpu=lambda: ("9.0", 132))
    assert store.load(("IMPLICIT_GEMM", _key(64))) == A
    assert store.load(("GEMM", _key(128))) == C
    # Another capability or multiprocessor count, or no GPU: no table.
    for gpu in (("8.0", 132), ("9.0", 114)):
        assert shipped.ShippedTiles(path, gpu=lambda gpu=gpu: gpu).load(("GEMM", _key(64))) is None
    assert shipped.ShippedTiles(path, gpu=lambda: None).load(("GEMM", _key(64))) is None
    # A second sweep of the same kind of GPU merges into its table, and is recorded.
    db2 = database.TuningDatabase(None)
    env = dataclasses.replace(database.environment("cpu"), device="NVIDIA H100 sm_90")
    db2.store_tiles("IMPLICIT_GEMM", _key(64), env, '{"class": "TileConfig", "block_m": 64, '
                    '"block_n": 128, "block_k": 64}')  # fmt: skip
    document = shipped.add_sweep(shipped.read(path), db2.tile_entries(), 132, "s2", "d2")
    shipped.write(document, path)
    (table,) = shipped.read(path)["tables"]
    assert [s["sweep"] for s in table["sweeps"]] == ["s1", "s2"] and len(table["tiles"]) == 2
    assert store.load(("IMPLICIT_GEMM", _key(64))) == B and store.load(("GEMM", _key(64))) == C
    with pytest.raises(ValueError, match="not a GPU"):
        shipped.add_sweep(document, _entries(db, "cpu"), 132, "s", "d")


def test_the_shipped_tables_parse():
    """The file that ships: every table's choices are tiles of this version."""
    for table in shipped.read()["tables"]:
        assert len(shipped.Table(table["tiles"]).exact) == len(table["tiles"]) > 0


class _Store:
    """A tuning database or shipped table holding `tiles` for every problem (with
    `similar_only`, for none but a similar layer)."""

    def __init__(self, tiles, similar_only=False):
        self.tiles, self.similar_only, self.saved, self.asked = tiles, similar_only, [], []

    def load(self, key, similar=False):
        self.asked.append(similar)
        return self.tiles if similar or not self.similar_only else None

    def save(self, key, tiles):
        self.saved.append(tiles)


@pytest.mark.parametrize(
    "autotune, stored, expected, timed",
    [
        (None, None, A, 0),  # shipped, nothing timed
        (None, B, B, 0),  # this machine's database first
        (None, TileConfig(1, 1, 1), A, 0),  # a stored choice that is no candidate is passed over
        ("0", B, A, 0),  # no database, still the shipped choice
        ("1", None, B, 3),  # measured: B is the fastest
        ("1", C, C, 0),  # a choice measured here before
    ],
)
def test_the_tuner_takes_the_stored_then_the_shipped_choice(
    monkeypatch, autotune, stored, expected, timed
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tiles, "_chosen", {})
    monkeypatch.setattr(tiles, "device_time_ms", lambda fn, rep_ms: fn())
    store = _Store(stored)
    monkeypatch.setattr(tiles, "_store", store)
    monkeypatch.setattr(tiles, "_shipped", _Store(A))
    if autotune is None:
        monkeypatch.delenv(tiles.AUTOTUNE_ENV, raising=False)
    else:
        monkeypatch.setenv(tiles.AUTOTUNE_ENV, autotune)
    runs = []

    def make_run(t):
        return lambda: runs.append(t) or (0.5 if t == B else 1.0)

    assert tiles.tune(("IMPLICIT_GEMM", "p"), [A, B, C], make_run) == expected
    assert len(runs) == timed and store.saved == ([B] if timed else [])
    # With no shipped choice either, RTDNN_AUTOTUNE=0 takes the first candidate untimed.
    monkeypatch.setattr(tiles, "_shipped", _Store(None))
    monkeypatch.setenv(tiles.AUTOTUNE_ENV, "0")
    assert tiles.tune(("IMPLICIT_GEMM", "q"), [C, B], make_run) == C


@dataclasses.dataclass(frozen=True)
class _KeepsFirst(TileConfig):
    first_over_similar = True


@pytest.mark.parametrize(
    "autotune, candidates, shipped_choice, expected",
    [
        ("0", [A, B], B, B),  # untuned: a similar layer's choice
        (None, [A, B], B, A),  # tuning on (nothing stored here): no similar layer's choice
        ("0", [_KeepsFirst(1, 1, 1), B], B, _KeepsFirst(1, 1, 1)),  # another kind: kept first
        ("0", [_KeepsFirst(1, 1, 1), _KeepsFirst(2, 2, 2)], _KeepsFirst(2, 2, 2),
         _KeepsFirst(2, 2, 2)),  # the same kind: the similar layer's choice
        ("0", [_KeepsFirst(1, 1, 1), B], (B, "exact"), B),  # the layer's own choice is kept
        (None, [_KeepsFirst(1, 1, 1), B], (B, "exact"), B),
    ],
)  # fmt: skip
def test_a_similar_layers_choice_only_untuned(monkeypatch, autotune, candidates, shipped_choice,
                                              expected):  # fmt: skip
    """A layer the shipped table lacks takes a similar layer's choice only untuned, and not
    over a first candidate that keeps its place (TileConfig.first_over_similar) if the choice
    is of another kind of tiles; a choice the table holds for the layer itself is taken."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tiles, "_chosen", {})
    monkeypatch.setattr(tiles, "device_time_ms", lambda fn, rep_ms: fn())
    monkeypatch.setattr(tiles, "_store", _Store(None))
    exact = isinstance(shipped_choice, tuple)  # (choice, "exact"): the table has this layer
    shipped_choice = shipped_choice[0] if exact else shipped_choice
    shipped_store = _Store(shipped_choice, similar_only=not exact)
    monkeypatch.setattr(tiles, "_shipped", shipped_store)
    if autotune is None:
        monkeypatch.delenv(tiles.AUTOTUNE_ENV, raising=False)
    else:
        monkeypatch.setenv(tiles.AUTOTUNE_ENV, autotune)
    # Timed (tuning on), the first candidate is the fastest.
    times = {t: i for i, t in enumerate(candidates)}
    assert tiles.tune(("IMPLICIT_GEMM", "p"), candidates, lambda t: lambda: times[t]) == expected
    assert (True in shipped_store.asked) == (autotune == "0" and not exact)
