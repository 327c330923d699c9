"""Add a sweep's tile choices to the tables that ship with rtdnn (select/shipped_tiles.json).

Run the sweep on the GPU with a tuning database of its own and tuning on, e.g.

    RTDNN_TUNING_DB=sweep.sqlite3 RTDNN_AUTOTUNE=1 rtdnn bench --model resnet50
    RTDNN_TUNING_DB=sweep.sqlite3 RTDNN_AUTOTUNE=1 rtdnn bench --suite resnet50

then, anywhere (no GPU needed), add each GPU's choices in the database to the tables:

    PYTHONPATH=src python tools/ship_tiles.py sweep.sqlite3 --multiprocessors 132 \
        --sweep "rtdnn bench --model resnet50; --suite resnet50" --date 2026-11-28
"""

import argparse
import itertools

from rtdnn.select import shipped
from rtdnn.select.database import TuningDatabase


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", help="the sweep's tuning database (sqlite3 file)")
    parser.add_argument("--multiprocessors", type=int, required=True,
                        help="the swept GPU's multiprocessor count")  # fmt: skip
    parser.add_argument("--sweep", required=True, help="what ran, for the record")
    parser.add_argument("--date", required=True, help="when it ran (YYYY-MM-DD)")
    parser.add_argument("--out", default=shipped.PATH, help="the tables' file")
    args = parser.parse_args()
    entries = TuningDatabase(args.database).tile_entries()
    document = shipped.read(args.out)
    by_env = itertools.groupby(entries, key=lambda e: e.environment)  # sorted by environment
    for env, rows in by_env:
        rows = list(rows)
        document = shipped.add_sweep(document, rows, args.multiprocessors, args.sweep, args.date)
        print(f"{env}: {len(rows)} tile choices")
    shipped.write(document, args.out)
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
